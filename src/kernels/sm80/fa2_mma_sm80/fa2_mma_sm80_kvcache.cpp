// fa2_mma_sm80's KV-cache path, host side: the support check, the split
// heuristic, the workspace of the split partials and the dispatch on head_dim
// (the kernels are fa2_mma_sm80_splitkv_kernel.cuh). Score modifications
// change none of these: the split kernel applies them (its kModified
// instantiation, chosen at the launch) and, with several splits, the combine
// adds the sinks, so the heuristic and the workspace stay as they are.
//
// Tiling and split heuristic (num_splits 0). The work is blocks of (16
// packed rows, kv head, batch); a decode step has few of them (batch x
// kv_heads), each streaming all of its sequence's keys, and the kernel is
// bound by reading the cache: what counts is the bytes in flight and, for a
// short cache, the latency of each warp's chain of chunks and of the combine
// kernel a split adds (about 3 us on the H100: batch 8 x 1k keys, 64 blocks,
// one split 17.9 us, two 21.1). Three regimes (tilings: fa2_mma_sm80.h):
//   - the blocks fill the GPU (>= one per SM): wide on a short cache, narrow
//     on a long one, no split (at head_dim 64, batch 32 x 8k / 32k: one split
//     181 / 716 us, three to fill the slots of 3 narrow blocks an SM 191 /
//     748; at 128, batch 17 / 20 / 26 x 1k: 31 / 38 / 44 us against 39 / 45 /
//     51 with 5-8 splits, but batch 20 x 4k 133 against 124 with 8), except
//     two from kLongCacheKeys at head_dim 128 and up: more blocks than SMs let
//     the hardware hand more of them to the SMs that stream faster (on the
//     H100 24 SMs finish a one-split batch 32 step at three quarters of its
//     time, flashlab-run --timeline; batch 32 x 128k, 32/8 and 64/8 heads:
//     5470-5478 us with two splits against 5501-5516 with one, two rounds;
//     at 64k even; at 4k-32k one split is the fastest; at head_dim 64 two
//     splits were slower at 128k, 2922 against 2856 us; at 256 x 64k faster,
//     5546 against 5582);
//   - the blocks hold kBytesInFlightToStream in their deep rings (two chunks a
//     warp): deep, one split, no combine; part of the GPU reads at about the
//     full rate. At head_dim 128 and up only while the K/V bytes are at most
//     kMostBytesWithoutSplit: on a larger cache the second half of the SMs
//     gains more than the combine costs (batch 8 x 32k: one split 357 us, two
//     352); at 64 the deep split stays ahead (batch 8 x 32k / 128k: 181 / 704
//     us, two wide splits 183 / 794);
//   - else wide, split so there is about one block per SM (the efficiency
//     rule over SMs): batch 1 x 4k-32k with 16 splits read 0.92-0.97x the
//     time of 32 (two per SM), which add partials and combine work. Keys per
//     split stay >= kMinKeysPerSplit (two chunks a warp of the wide tiling:
//     batch 1 x 1k 10.9 us with 8 splits, 11.3 with 16).
// The keys are the cache's capacity (seqlen_k), not the current lengths: the
// lengths live on the device and a launch must not wait for them.
//
// Clusters (kvcache_cluster_size, sm_90, contiguous caches). A grid of at
// most one block for every two SMs (batch 8 on deep rings, batch 1 x 1k: 64
// blocks on the H100's 132 SMs) runs as thread-block clusters of up to 8
// consecutive kv heads, one block an SM. A cluster sits in one GPC and the
// clusters go to different GPCs, so the streaming blocks share the GPCs
// evenly (the likely reason; where the hardware puts a plain grid's blocks is
// not documented). H100, same-run A/B against plain launches (session 17,
// call 7, three rounds, 32/8 and 64/8 heads): batch 8 x 4k / 8k 50.8-51.2 /
// 94.2-94.9 -> 49.9-50.3 / 92.2-93.5 us, batch 1 x 1k at 64/8 11.46-11.49 ->
// 11.30-11.33. Not for a paged cache, which clusters made slower (batch 8 x
// 8k 97.8-100.5 -> 99.7-102.9 us; why is not measured), nor where a cluster
// may stack two blocks on an SM or the grid has 128 blocks (calls 3-5: batch
// 1 x 4k 15.2 -> 15.6 us, batch 8 x 32k 351 -> 360).
#include <algorithm>
#include <cstdint>
#include <string>

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab {

namespace {

using fa2_mma_sm80::HeadDims;
using fa2_mma_sm80::KvTiling;

constexpr int kMinKeysPerSplit = 128;
constexpr int kLongCacheKeys = 65536;
// Little's law on the H100: about 3 TB/s times 2.7 us of loaded latency.
constexpr int64_t kBytesInFlightToStream = int64_t(8) << 20;
constexpr int64_t kMostBytesWithoutSplit = int64_t(300) << 20;

int packed_row_tiles(const KvCacheParams& params) {
  const int64_t packed_rows = static_cast<int64_t>(params.seqlen_q) * (params.heads / params.kv_heads);
  return static_cast<int>((packed_rows + 15) / 16);
}

int64_t row_tile_blocks(const KvCacheParams& params) {
  return static_cast<int64_t>(params.batch) * params.kv_heads * packed_row_tiles(params);
}

// The split kernel's configuration for head_dim and tiling, as Tr for f.
template <class F>
void with_traits(int head_dim, KvTiling tiling, F&& f) {
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, head_dim, kHeadDim,
                           [&] { fa2_mma_sm80::with_split_kv_traits<kHeadDim>(tiling, f); });
}

int smem_bytes(int head_dim, KvTiling tiling) {
  int bytes = 0;
  with_traits(head_dim, tiling, [&](auto traits) { bytes = decltype(traits)::kSmemBytes; });
  return bytes;
}

// K and V bytes a block of the tiling has in flight: Stages - 1 chunk pairs a warp.
int64_t bytes_in_flight_per_block(int head_dim, KvTiling tiling) {
  int64_t bytes = 0;
  with_traits(head_dim, tiling, [&](auto traits) {
    using Tr = decltype(traits);
    bytes = int64_t(Tr::kWarps) * (Tr::kStages - 1) * 2 * Tr::kChunkBytes;
  });
  return bytes;
}

int64_t cache_bytes_read(const KvCacheParams& params) {
  const int64_t element_bytes = params.dtype == DataType::float32 ? 4 : 2;
  return 2 * static_cast<int64_t>(params.batch) * params.seqlen_k * params.kv_heads * params.head_dim * element_bytes;
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
  const int64_t blocks = row_tile_blocks(params);
  if (blocks <= 0 || kvcache_tiling(params) == KvTiling::kDeep) return 1;
  const int64_t slots = multiprocessor_count();
  if (blocks * 5 >= slots * 4) return params.head_dim >= 128 && params.seqlen_k >= kLongCacheKeys ? 2 : 1;
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
  const int64_t blocks = row_tile_blocks(params);
  if (blocks >= multiprocessor_count())
    return params.seqlen_k <= kWideTilingMaxKeys ? KvTiling::kWide : KvTiling::kNarrow;
  // (An A100 holds 164 KB a multiprocessor: no deep ring at head_dim 128.)
  const bool deep_fits = smem_bytes(params.head_dim, KvTiling::kDeep) + 1024 <= shared_memory_per_multiprocessor();
  if (deep_fits && blocks * bytes_in_flight_per_block(params.head_dim, KvTiling::kDeep) >= kBytesInFlightToStream &&
      (params.head_dim < 128 || cache_bytes_read(params) <= kMostBytesWithoutSplit))
    return KvTiling::kDeep;
  return KvTiling::kWide;
}

int fa2_mma_sm80::kvcache_cluster_size(const KvCacheParams& params, int num_splits) {
  if (params.device_compute_capability < 90 || params.is_paged()) return 1;
  if (row_tile_blocks(params) * num_splits * 2 > multiprocessor_count()) return 1;
  const int64_t kv_blocks = static_cast<int64_t>(params.batch) * params.kv_heads;  // the grid's z
  for (const int size : {8, 4, 2})
    if (kv_blocks % size == 0) return size;
  return 1;
}

std::string fa2_mma_sm80::kvcache_launch_summary(const KvCacheParams& params) {
  const std::string unsupported = kvcache_unsupported_reason(params);
  if (!unsupported.empty()) return "none (" + unsupported + ")";
  const KvTiling tiling = kvcache_tiling(params);
  const int splits = kvcache_splits_used(params);
  const char* tiling_name = tiling == KvTiling::kWide ? "wide" : tiling == KvTiling::kDeep ? "deep" : "narrow";
  std::string text;
  with_traits(params.head_dim, tiling, [&](auto traits) {
    using Tr = decltype(traits);
    text = std::string(tiling_name) + " tiling (" + std::to_string(Tr::kWarps) + " warps x " +
           std::to_string(Tr::kStages) + " ring stages of " + std::to_string(Tr::kChunkKeys) + "-key chunks, " +
           std::to_string(Tr::kSmemBytes) + " bytes of shared memory a block), grid " + std::to_string(splits) +
           (splits == 1 ? " split x " : " splits x ") + std::to_string(packed_row_tiles(params)) +
           " packed-row tile" + (packed_row_tiles(params) == 1 ? "" : "s") + " x " +
           std::to_string(static_cast<int64_t>(params.batch) * params.kv_heads) + " (batch x kv heads) = " +
           std::to_string(row_tile_blocks(params) * splits) + " blocks on " +
           std::to_string(multiprocessor_count()) + " SMs";
  });
  const int cluster_size = kvcache_cluster_size(params, splits);
  if (cluster_size > 1)
    text += ", in clusters of " + std::to_string(cluster_size) +
            " kv heads, one block an SM (a plain launch where they would not all be resident at once)";
  if (params.modification.any())
    text += splits > 1 && params.modification.sinks != nullptr
                ? "; score modifications in the split kernel, the sinks in the combine"
                : "; score modifications in the split kernel";
  if (splits > 1) text += "; then the combine kernel";
  return text;
}

void fa2_mma_sm80::kvcache_launch(const KvCacheParams& params) {
  const int splits = kvcache_splits_used(params);
  const KvTiling tiling = kvcache_tiling(params);
  // kvcache_unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim,
                           [&] { launch_kvcache_tiled<kHeadDim>(params, splits, tiling); });
}

}  // namespace flashlab
