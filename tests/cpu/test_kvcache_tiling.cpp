// fa2_mma_sm80's choice of split-KV tiling (kvcache_tiling): the wide tiling
// (two resident blocks per multiprocessor) only where one split already gives
// every multiprocessor a block and the cache is short; the split heuristic and
// the reported tile shape follow the tiling (no GPU: host arithmetic).
#include <gtest/gtest.h>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab {
namespace {

using fa2_mma_sm80::KvTiling;

KvCacheParams decode_step(int batch, int seqlen_k) {
  KvCacheParams params;
  params.batch = batch, params.heads = 32, params.kv_heads = 8;
  params.seqlen_q = 1, params.seqlen_k = seqlen_k, params.head_dim = 128;
  return params;
}

TEST(KvCacheTiling, WideWhereOneSplitFillsTheGpuOnAShortCache) {
  const int sms = fa2_mma_sm80::multiprocessor_count();
  const int filling_batch = (sms + 7) / 8;  // 8 kv heads, one packed-row tile each
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(filling_batch, 1024)), KvTiling::kWide);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(filling_batch, fa2_mma_sm80::kWideTilingMaxKeys)),
            KvTiling::kWide);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(filling_batch, fa2_mma_sm80::kWideTilingMaxKeys + 1)),
            KvTiling::kNarrow);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(filling_batch - 1, 1024)), KvTiling::kNarrow);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tiling(decode_step(1, 1024)), KvTiling::kNarrow);
}

TEST(KvCacheTiling, TileShapeAndSplitsFollowTheTiling) {
  const int filling_batch = (fa2_mma_sm80::multiprocessor_count() + 7) / 8;
  // Wide: 4 warps of 16-key chunks; narrow: 8.
  EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(filling_batch, 1024)).block_k, 64);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(filling_batch, 8192)).block_k, 128);
  EXPECT_EQ(fa2_mma_sm80::kvcache_tile_shape(decode_step(1, 1024)).block_k, 128);
  // A full wave of blocks needs no split with either tiling.
  EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(4 * filling_batch, 1024)), 1);
  EXPECT_EQ(fa2_mma_sm80::kvcache_num_splits(decode_step(4 * filling_batch, 8192)), 1);
}

}  // namespace
}  // namespace flashlab
