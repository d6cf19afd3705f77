// fa2_mma_sm80's choice of split-KV tiling and split count (kvcache_tiling,
// kvcache_num_splits) in its three regimes: blocks that fill the GPU (wide
// on a short cache, narrow on a long one, one split, two from 64k keys at
// head_dim 128 and up), blocks that hold enough in flight on part of it
// (deep, one split; from head_dim 128 up to a cache size), and few blocks
// (wide, split to about one block per multiprocessor); on sm_90 the grids of
// at most one block for every two multiprocessors run as clusters of kv heads
// (kvcache_cluster_size).
// No GPU: host arithmetic over the current device's multiprocessor count (132
// without one).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab {
namespace {

using fa2_mma_sm80::KvTiling;

// One query row per sequence, 32 query heads over 8 kv heads: one packed-row
// tile, so batch x 8 blocks before any split.
KvCacheParams decode_step(int batch, int seqlen_k, int head_dim = 128) {
  KvCacheParams params;
  params.batch = batch, params.heads = 32, params.kv_heads = 8;
  params.seqlen_q = 1, params.seqlen_k = seqlen_k, params.head_dim = head_dim;
  params.dtype = DataType::bfloat16;
  return params;
}

int sms() { return fa2_mma_sm80::multiprocessor_count(); }
int filling_batch() { return (sms() + 7) / 8; }  // the smallest batch with a block per multiprocessor

// Why batch 8 (64 blocks) cannot take a deep ring of deep_bytes on this
// device: it fills the GPU, or a multiprocessor cannot hold the ring; empty
// when it can.
std::string no_deep_half_gpu_reason(int deep_bytes) {
  if (sms() > 64 && deep_bytes + 1024 <= fa2_mma_sm80::shared_memory_per_multiprocessor()) return {};
  return "needs more than 64 multiprocessors with " + std::to_string(deep_bytes + 1024) +
         " bytes of shared memory each; this device has " + std::to_string(sms()) + " with " +
         std::to_string(fa2_mma_sm80::shared_memory_per_multiprocessor());
}

TEST(KvCacheTiling, BlocksThatFillTheGpuTakeWideOnAShortCacheNarrowOnALongOne) {
  const int batch = filling_batch();
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(batch, 1024)), KvTiling::kWide);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(batch, fa2_mma_sm80::kWideTilingMaxKeys)), KvTiling::kWide);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(batch, fa2_mma_sm80::kWideTilingMaxKeys + 1)),
            KvTiling::kNarrow);
  // Wide: 4 warps of 16-key chunks; narrow: 8.
  EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(batch, 1024)).block_k, 64);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(batch, 8192)).block_k, 128);
  // Whole waves need no split with either tiling.
  EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(4 * batch, 1024)), 1);
  EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(4 * batch, 8192)), 1);
}

TEST(KvCacheTiling, BlocksThatFillTheGpuSplitOnlyALongCacheAtHeadDim128AndUp) {
  // Head_dim 64: three narrow blocks fit an SM, and filling those slots with
  // splits only added partials and the combine. From 64k keys at 128 and up,
  // two splits let the faster SMs take more blocks.
  const int batch = filling_batch();
  for (const int head_dim : {32, 64, 128, 256})
    for (const int batch_multiple : {1, 2, 3})
      for (const int keys : {1024, 8192, 32768, 65535, 65536, 131072}) {
        SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " batch " +
                     std::to_string(batch * batch_multiple) + " keys " + std::to_string(keys));
        const int expected = head_dim >= 128 && keys >= 65536 ? 2 : 1;
        EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(batch * batch_multiple, keys, head_dim)), expected);
      }
}

TEST(KvCacheTiling, HalfTheGpuWithDeepRingsReadsAModestCacheInOneSplit) {
  // 64 blocks x 128 KB in flight (8 warps x 2 chunk pairs of 8 KB) at head_dim 128.
  const std::string reason = no_deep_half_gpu_reason(fa2_mma_sm80::DeepSplitKvTraits<128>::type::kSmemBytes);
  if (!reason.empty()) GTEST_SKIP() << reason;
  for (const int keys : {1024, 4096, 8192}) {
    SCOPED_TRACE("keys " + std::to_string(keys));
    EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(8, keys)), KvTiling::kDeep);
    EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(8, keys)), 1);
    EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(8, keys)).block_k, 128);
  }
  // 1 GB of K/V: the other half of the GPU gains more than the combine costs.
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(8, 32768)), KvTiling::kWide);
  EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(8, 32768)), 2);
  // Half the blocks hold too little in flight.
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(4, 1024)), KvTiling::kWide);
}

TEST(KvCacheTiling, BelowHeadDim128TheDeepSplitTakesAnyCacheSize) {
  const std::string reason = no_deep_half_gpu_reason(fa2_mma_sm80::DeepSplitKvTraits<64>::type::kSmemBytes);
  if (!reason.empty()) GTEST_SKIP() << reason;
  // 64 blocks x 128 KB in flight (8 warps x 4 chunk pairs of 4 KB) at head_dim 64.
  for (const int keys : {1024, 32768, 131072}) {
    SCOPED_TRACE("keys " + std::to_string(keys));
    EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(8, keys, 64)), KvTiling::kDeep);
    EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(8, keys, 64)), 1);
  }
}

TEST(KvCacheTiling, FewBlocksSplitToAboutOneBlockPerMultiprocessor) {
  for (const int keys : {1024, 4096, 8192, 32768, 131072, 4097, 1023}) {
    SCOPED_TRACE("keys " + std::to_string(keys));
    const KvCacheParams step = decode_step(1, keys);
    EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(step), KvTiling::kWide);
    const int splits = fa2_mma_sm80::kvcache_num_splits(step);
    EXPECT_LE(8 * splits, sms()) << "at most one block per multiprocessor";
    EXPECT_GE(keys / splits, 128) << "at least 128 keys (two chunks a warp) per split";
    // As many as the two rules allow, within the 5% of wave efficiency.
    const int most = std::min(sms() / 8, keys / 128);
    EXPECT_GE(8 * splits * 100, 8 * most * 95);
  }
}

TEST(KvCacheTiling, EveryHeadDimGetsASplitCountInRangeAndOneSplitWhenDeep) {
  for (const int head_dim : {32, 64, 96, 128, 256})
    for (const int batch : {1, 8, 20})
      for (const int keys : {1024, 32768}) {
        SCOPED_TRACE("head_dim " + std::to_string(head_dim) + " batch " + std::to_string(batch) + " keys " +
                     std::to_string(keys));
        const KvCacheParams step = decode_step(batch, keys, head_dim);
        const int splits = fa2_mma_sm80::kvcache_num_splits(step);
        EXPECT_GE(splits, 1);
        EXPECT_LE(splits, fa2_mma_sm80::kvcache_max_splits(step));
        if (fa2_mma_sm80::kvcache_tiling(step) == KvTiling::kDeep) EXPECT_EQ(splits, 1);
      }
}

TEST(KvCacheTiling, GridsOfAtMostOneBlockForEveryTwoSmsRunAsClustersOfKvHeadsOnSm90) {
  if (sms() < 128) GTEST_SKIP() << "needs at least 128 multiprocessors (64-block grids); this device has " << sms();
  const auto on = [](KvCacheParams params, int compute_capability) {
    params.device_compute_capability = compute_capability;
    return params;
  };
  // Batch 8 on deep rings: 64 blocks, one split; the 8 kv heads of a sequence a cluster.
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(on(decode_step(8, 8192), 90), 1), 8);
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(on(decode_step(8, 8192), 80), 1), 1) << "no clusters before sm_90";
  KvCacheParams paged = on(decode_step(8, 8192), 90);
  const int table[] = {0};
  paged.block_table = table, paged.page_size = 256;
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(paged, 1), 1) << "a paged cache launches plain";
  // The same grid with two splits (128 blocks) or a batch that fills the GPU: plain.
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(on(decode_step(8, 8192), 90), 2), 1);
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(on(decode_step(filling_batch(), 1024), 90), 1), 1);
  // Batch 1 x 1k takes 8 splits of 8 kv heads (64 blocks); from 4k about one block per SM.
  const KvCacheParams short_cache = on(decode_step(1, 1024), 90), long_cache = on(decode_step(1, 4096), 90);
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(short_cache, fa2_mma_sm80::kvcache_num_splits(short_cache)), 8);
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(long_cache, fa2_mma_sm80::kvcache_num_splits(long_cache)), 1);
  // The largest of 8 / 4 / 2 that divides batch x kv_heads (the grid's z).
  KvCacheParams odd = on(decode_step(3, 1024), 90);
  odd.kv_heads = 2, odd.heads = 8;  // z = 6
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(odd, 1), 2);
  odd.kv_heads = 4, odd.heads = 8;  // z = 12
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(odd, 1), 4);
  odd.kv_heads = 1, odd.heads = 7;  // z = 3: MQA over an odd batch
  EXPECT_EQ(fa2_mma_sm80::kvcache_cluster_size(odd, 1), 1);
}

TEST(KvCacheTiling, TheLaunchSummaryNamesTheTilingTheGridAndTheLaunchShape) {
  if (sms() < 128) GTEST_SKIP() << "needs at least 128 multiprocessors (64-block grids); this device has " << sms();
  KvCacheParams batch8 = decode_step(8, 8192);
  batch8.device_compute_capability = 90;
  const std::string deep = fa2_mma_sm80::kvcache_launch_summary(batch8);
  EXPECT_NE(deep.find("deep tiling (8 warps x 3 ring stages of 16-key chunks"), std::string::npos) << deep;
  EXPECT_NE(deep.find("grid 1 split x 1 packed-row tile x 64 (batch x kv heads) = 64 blocks"), std::string::npos)
      << deep;
  EXPECT_NE(deep.find("in clusters of 8 kv heads"), std::string::npos) << deep;
  EXPECT_EQ(deep.find("combine"), std::string::npos) << deep;

  KvCacheParams batch1 = decode_step(1, 8192);
  batch1.device_compute_capability = 80;
  const int splits = fa2_mma_sm80::kvcache_num_splits(batch1);
  const std::string wide = fa2_mma_sm80::kvcache_launch_summary(batch1);
  EXPECT_NE(wide.find("wide tiling (4 warps x 3 ring stages"), std::string::npos) << wide;
  EXPECT_NE(wide.find("grid " + std::to_string(splits) + " splits x 1 packed-row tile x 8"), std::string::npos)
      << wide;
  EXPECT_EQ(wide.find("clusters"), std::string::npos) << "no clusters before sm_90: " << wide;
  EXPECT_NE(wide.find("then the combine kernel"), std::string::npos) << wide;

  KvCacheParams odd_head_dim = decode_step(1, 8192, 48);
  EXPECT_EQ(fa2_mma_sm80::kvcache_launch_summary(odd_head_dim).rfind("none (", 0), 0u)
      << fa2_mma_sm80::kvcache_launch_summary(odd_head_dim);
}

}  // namespace
}  // namespace flashlab
