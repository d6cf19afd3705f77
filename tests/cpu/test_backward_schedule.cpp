// fa2_mma_sm80's backward walk over key blocks (backward_key_block): every key
// block is taken by exactly one thread block, and in deterministic mode the
// slots' causal work stays balanced (no GPU: the rule is plain arithmetic).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

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

}  // namespace
}  // namespace flashlab
