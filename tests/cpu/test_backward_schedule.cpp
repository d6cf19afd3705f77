// fa2_mma_sm80's backward walk over key blocks (backward_key_block): every key
// block is taken by exactly one thread block, and in deterministic mode the
// slots' causal work stays balanced; and the deterministic slot count of the
// workspace query (no GPU: the rules are plain arithmetic, the slot count on
// an H100's SM count when there is no device).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"

namespace flashlab {
namespace {

using fa2_mma_sm80::backward_key_block;

// The key blocks each of `blocks` thread blocks takes, as the kernel's loop does.
std::vector<std::vector<int>> walk(int blocks, int key_blocks) {
  std::vector<std::vector<int>> taken(blocks);
  for (int block = 0; block < blocks; ++block)
    for (int round = 0;; ++round) {
      const int key_block = backward_key_block(round, block, blocks);
      if (key_block >= key_blocks) break;
      taken[block].push_back(key_block);
    }
  return taken;
}

TEST(BackwardKeyBlocks, EveryKeyBlockOnceForAnySlotCount) {
  for (int key_blocks = 1; key_blocks <= 150; ++key_blocks)
    for (int blocks = 1; blocks <= 40; ++blocks) {
      std::vector<int> times(key_blocks, 0);
      for (const auto& taken : walk(blocks, key_blocks))
        for (const int key_block : taken) {
          ASSERT_GE(key_block, 0);
          ASSERT_LT(key_block, key_blocks) << blocks << " blocks, " << key_blocks << " key blocks";
          ++times[key_block];
        }
      for (int key_block = 0; key_block < key_blocks; ++key_block)
        ASSERT_EQ(times[key_block], 1) << "key block " << key_block << " of " << key_blocks
                                       << " with " << blocks << " blocks";
    }
}

TEST(BackwardKeyBlocks, DefaultModeIsOneKeyBlockPerThreadBlock) {
  const auto taken = walk(37, 37);
  for (int block = 0; block < 37; ++block) EXPECT_EQ(taken[block], std::vector<int>{block});
}

// Causal (square): key block n sees key_blocks - n query blocks. Whole pairs of
// rounds give every slot the same work; what is left (at most one round and a
// partial one) differs by less than two key blocks' work.
TEST(BackwardKeyBlocks, CausalWorkIsBalancedAcrossSlots) {
  for (int key_blocks = 2; key_blocks <= 150; ++key_blocks)
    for (int slots = 2; slots <= 40 && slots < key_blocks; ++slots) {
      std::vector<long> work;
      for (const auto& taken : walk(slots, key_blocks)) {
        long sum = 0;
        for (const int key_block : taken) sum += key_blocks - key_block;
        work.push_back(sum);
      }
      const long spread = *std::max_element(work.begin(), work.end()) -
                          *std::min_element(work.begin(), work.end());
      EXPECT_LT(spread, 2L * key_blocks) << slots << " slots, " << key_blocks << " key blocks";
      if (key_blocks % (2 * slots) == 0)
        EXPECT_EQ(spread, 0) << slots << " slots, " << key_blocks << " key blocks";
    }
}

// Deterministic slots (dq accumulators = thread blocks per (kv head, batch)):
// one where there is one key block, else at least two (two beat one at equal
// waves), never more than the key blocks, and only in deterministic mode.
TEST(BackwardSlots, AtLeastTwoWhereThereAreTwoKeyBlocks) {
  for (const int seqlen : {1, 7, 113, 128, 129, 1023, 1024, 4097, 16384})
    for (const int batch : {1, 4, 16, 60}) {
      AttentionBackwardParams params;
      params.batch = batch;
      params.heads = params.kv_heads = 32;
      params.seqlen_q = params.seqlen_k = seqlen;
      params.head_dim = 64;
      params.deterministic = true;
      constexpr int kBlockM = 128, kBlockN = 128;
      const int key_blocks = (seqlen + kBlockN - 1) / kBlockN;
      const int slots = fa2_mma_sm80::backward_workspace(params, kBlockM, kBlockN).dq_accum_slots;
      const std::string problem = "batch " + std::to_string(batch) + ", seqlen " + std::to_string(seqlen);
      if (key_blocks == 1) {
        EXPECT_EQ(slots, 1) << problem;
      } else {
        EXPECT_GE(slots, 2) << problem;
        EXPECT_LE(slots, key_blocks) << problem;
      }
      params.deterministic = false;
      EXPECT_EQ(fa2_mma_sm80::backward_workspace(params, kBlockM, kBlockN).dq_accum_slots, 1) << problem;
    }
}

// fa3_wgmma_sm90's deterministic order on rotated walks: for every query block
// the ranks are 0 .. key blocks - 1, each once, in the order the key blocks
// reach the block when the CTAs step together (key block n at step
// (m - n) mod m_count, walking from query block n), so each key block's
// predecessor got there exactly one step earlier (no staircase).
TEST(RotatedDqOrder, RanksAreTheLockStepArrivalOrder) {
  using fa3_wgmma_sm90::rotated_dq_rank;
  for (int m_count = 1; m_count <= 40; ++m_count)
    for (int key_blocks = 1; key_blocks <= m_count; ++key_blocks)
      for (int m = 0; m < m_count; ++m) {
        std::vector<int> by_rank(key_blocks, -1);
        for (int n = 0; n < key_blocks; ++n) {
          const int rank = rotated_dq_rank(m, n, key_blocks, m_count);
          ASSERT_GE(rank, 0);
          ASSERT_LT(rank, key_blocks) << "m " << m << ", n " << n << " of " << key_blocks << " x " << m_count;
          ASSERT_EQ(by_rank[rank], -1) << "rank " << rank << " twice, query block " << m;
          by_rank[rank] = n;
        }
        const auto arrival = [&](int n) { return (m - n + m_count) % m_count; };
        for (int rank = 1; rank < key_blocks; ++rank)
          ASSERT_LT(arrival(by_rank[rank - 1]), arrival(by_rank[rank]))
              << "query block " << m << " of " << m_count << ", " << key_blocks << " key blocks";
        if (key_blocks == m_count)
          for (int rank = 1; rank < key_blocks; ++rank)
            ASSERT_EQ(arrival(by_rank[rank]), arrival(by_rank[rank - 1]) + 1);
      }
}

// A backward CTA's walk visits each (head of the group, query block) once,
// heads in turn; a rotated one starts each head at query block m_begin + rotation.
TEST(RotatedDqOrder, WalksVisitEveryQueryBlockOnceAHead) {
  for (int m_count = 1; m_count <= 12; ++m_count)
    for (int rotation = 0; rotation < m_count; ++rotation)
      for (const int group : {1, 3}) {
        fa3_wgmma_sm90::QueryWalk walk;
        walk.m_begin = 5;
        walk.m_count = m_count;
        walk.steps = m_count * group;
        walk.rotation = rotation;
        walk.rotated = rotation > 0;
        std::vector<int> visits(group * m_count, 0);
        for (int step = 0; step < walk.steps; ++step) {
          const int head = walk.head_in_group(step), block = walk.query_block(step);
          ASSERT_GE(block, walk.m_begin);
          ASSERT_LT(block, walk.m_begin + m_count);
          ASSERT_EQ(head, step / m_count);
          ++visits[head * m_count + block - walk.m_begin];
          if (step % m_count == 0) EXPECT_EQ(block, walk.m_begin + rotation);
        }
        for (const int count : visits) ASSERT_EQ(count, 1) << m_count << " blocks, rotation " << rotation;
      }
}

// Rotated walks only without a mask, in deterministic mode, where every
// key-block CTA of a (kv head, batch) can be resident at once.
TEST(RotatedDqOrder, OnlyUnmaskedDeterministicGridsThatFit) {
  AttentionBackwardParams params;
  params.seqlen_q = params.seqlen_k = 16384;
  params.deterministic = true;
  EXPECT_TRUE(fa3_wgmma_sm90::rotates_backward_walks(params, 128, 132));
  EXPECT_FALSE(fa3_wgmma_sm90::rotates_backward_walks(params, 128, 100));  // 128 key blocks on 100 SMs
  params.window_right = 0;  // causal
  EXPECT_FALSE(fa3_wgmma_sm90::rotates_backward_walks(params, 128, 132));
  params.window_right = -1;
  params.window_left = 256;
  EXPECT_FALSE(fa3_wgmma_sm90::rotates_backward_walks(params, 128, 132));
  params.window_left = -1;
  params.deterministic = false;
  EXPECT_FALSE(fa3_wgmma_sm90::rotates_backward_walks(params, 128, 132));
}

}  // namespace
}  // namespace flashlab
