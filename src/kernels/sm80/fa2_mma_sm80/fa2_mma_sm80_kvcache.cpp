// fa2_mma_sm80's KV-cache path, host side: the support check, the split
// heuristic, the workspace of the split partials and the dispatch on head_dim
// (the kernels are fa2_mma_sm80_splitkv_kernel.cuh).
//
// Split heuristic (num_splits 0). The work is blocks of (16 packed rows, kv
// head, batch); a decode step has few of them (batch x kv_heads), each
// streaming all of its sequence's keys. The kernel is bound by reading the
// cache, so the aim is to fill every SM with as many resident blocks as its
// shared memory holds (slots = SMs x blocks per SM) in whole waves:
//   - enough blocks already (>= 80% of the slots): 1 split;
//   - else the smallest split count s (1 .. min(kMaxKvSplits, keys / 256))
//     whose wave efficiency (blocks x s) / (waves x slots) is within 5% of the
//     best: in practice one full wave. More waves of shorter blocks lose to
//     one wave (H100, batch 8 x 32k keys, 32/8 heads: 33 splits in 8 waves read
//     2679 GB/s where cuDNN's one wave of 4 splits reads 3000), and every split
//     adds a partial output to write and combine. Keys per split stay >= 256
//     (four 16-key chunks per warp) so a split's pipeline has something to
//     overlap.
// The keys are the cache's capacity (seqlen_k), not the current lengths: the
// lengths live on the device and a launch must not wait for them.
#include <algorithm>
#include <cstdint>
#include <string>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab {

namespace {

using fa2_mma_sm80::HeadDims;
using fa2_mma_sm80::KvTiling;

constexpr int kMinKeysPerSplit = 256;

int packed_row_tiles(const KvCacheParams& params) {
  const int64_t packed_rows = static_cast<int64_t>(params.seqlen_q) * (params.heads / params.kv_heads);
  return static_cast<int>((packed_rows + 15) / 16);
}

// The split kernel's configuration for head_dim and tiling, as Tr for f.
template <class F>
void with_traits(int head_dim, KvTiling tiling, F&& f) {
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, head_dim, kHeadDim, [&] {
    if (tiling == KvTiling::kWide)
      f(typename fa2_mma_sm80::WideSplitKvTraits<kHeadDim>::type{});
    else
      f(typename fa2_mma_sm80::NarrowSplitKvTraits<kHeadDim>::type{});
  });
}

int smem_bytes(int head_dim, KvTiling tiling) {
  int bytes = 0;
  with_traits(head_dim, tiling, [&](auto traits) { bytes = decltype(traits)::kSmemBytes; });
  return bytes;
}

}  // namespace

std::string fa2_mma_sm80::kvcache_unsupported_reason(const KvCacheParams& params) {
  std::string reason = unsupported_reason(params);  // dtype, head_dim, GQA, grid, alignment
  if (!reason.empty()) return reason;
  if (params.is_paged() && (params.page_size <= 0 || params.page_size % kPageSizeMultiple != 0))
    return "fa2_mma_sm80's KV-cache path needs page_size a multiple of " +
           std::to_string(kPageSizeMultiple) + " (a warp's 16-key chunk stays in one page); got " +
           std::to_string(params.page_size);
  if (params.k_new != nullptr) {
    if (params.cache_seqlens == nullptr)
      return "fa2_mma_sm80's KV-cache path appends new keys at cache_seqlens; got new keys "
             "without cache_seqlens";
    const auto misaligned = [](const void* pointer) {
      return reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0;
    };
    if (misaligned(params.k_new) || misaligned(params.v_new))
      return "fa2_mma_sm80's KV-cache path needs the new k and v to start on 16-byte boundaries";
    const int64_t strides[] = {params.k_new_batch_stride, params.k_new_row_stride,
                               params.k_new_head_stride,  params.v_new_batch_stride,
                               params.v_new_row_stride,   params.v_new_head_stride};
    for (int64_t stride : strides)
      if (stride % 8 != 0)
        return "fa2_mma_sm80's KV-cache path needs batch, row and head strides of the new k and v "
               "that are multiples of 8 elements (16 bytes); got " + std::to_string(stride);
  }
  if (packed_row_tiles(params) > 65535)
    return "fa2_mma_sm80's KV-cache path takes at most 65535 x 16 packed rows (seqlen_q x "
           "heads / kv_heads); got " + std::to_string(params.seqlen_q) + " x " +
           std::to_string(params.heads / params.kv_heads);
  if (static_cast<int64_t>(params.batch) * params.kv_heads > 65535)
    return "fa2_mma_sm80's KV-cache path takes at most 65535 (batch x kv_heads); got " +
           std::to_string(static_cast<int64_t>(params.batch) * params.kv_heads);
  if (params.num_splits < 0 || params.num_splits > kvcache_max_splits(params))
    return "fa2_mma_sm80's KV-cache path takes num_splits 0 (choose) or 1 to " +
           std::to_string(kvcache_max_splits(params)) + "; got " + std::to_string(params.num_splits);
  return {};
}

int fa2_mma_sm80::kvcache_max_splits(const KvCacheParams&) { return kMaxKvSplits; }

int fa2_mma_sm80::kvcache_num_splits(const KvCacheParams& params) {
  const int64_t blocks = static_cast<int64_t>(params.batch) * params.kv_heads * packed_row_tiles(params);
  const int bytes = smem_bytes(params.head_dim, kvcache_tiling(params));
  if (blocks <= 0 || bytes <= 0) return 1;
  const int per_sm = std::max(1, shared_memory_per_multiprocessor() / (bytes + 1024));
  const int64_t slots = static_cast<int64_t>(multiprocessor_count()) * std::min(per_sm, 16);
  if (blocks * 5 >= slots * 4) return 1;
  const int most = static_cast<int>(
      std::min<int64_t>(kMaxKvSplits, std::max<int64_t>(1, params.seqlen_k / kMinKeysPerSplit)));
  const auto efficiency = [&](int splits) {
    const int64_t total = blocks * splits;
    const int64_t waves = (total + slots - 1) / slots;
    return static_cast<double>(total) / static_cast<double>(waves * slots);
  };
  double best_efficiency = 0.0;
  for (int splits = 1; splits <= most; ++splits) best_efficiency = std::max(best_efficiency, efficiency(splits));
  for (int splits = 1; splits <= most; ++splits)
    if (efficiency(splits) >= best_efficiency - 0.05) return splits;
  return 1;
}

int fa2_mma_sm80::kvcache_splits_used(const KvCacheParams& params) {
  return params.num_splits > 0 ? params.num_splits : kvcache_num_splits(params);
}

size_t fa2_mma_sm80::kvcache_workspace_bytes(const KvCacheParams& params) {
  const int splits = kvcache_splits_used(params);
  if (splits <= 1) return 0;
  // Per split: a float32 output row and an LSE per (batch, head, query row).
  const size_t rows = static_cast<size_t>(params.batch) * params.heads * params.seqlen_q;
  return static_cast<size_t>(splits) * rows * (params.head_dim + 1) * sizeof(float);
}

TileShape fa2_mma_sm80::kvcache_tile_shape(const KvCacheParams& params) {
  TileShape shape;
  with_traits(params.head_dim, kvcache_tiling(params), [&](auto traits) {
    using Tr = decltype(traits);
    shape = {Tr::kBlockRows, Tr::kChunkKeys * Tr::kWarps};
  });
  return shape;
}

KvTiling fa2_mma_sm80::kvcache_tiling(const KvCacheParams& params) {
  const int64_t blocks = static_cast<int64_t>(params.batch) * params.kv_heads * packed_row_tiles(params);
  return blocks >= multiprocessor_count() && params.seqlen_k <= kWideTilingMaxKeys ? KvTiling::kWide
                                                                                  : KvTiling::kNarrow;
}

void fa2_mma_sm80::kvcache_launch(const KvCacheParams& params) {
  const int splits = kvcache_splits_used(params);
  const KvTiling tiling = kvcache_tiling(params);
  // kvcache_unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim,
                           [&] { launch_kvcache_tiled<kHeadDim>(params, splits, tiling); });
}

}  // namespace flashlab
