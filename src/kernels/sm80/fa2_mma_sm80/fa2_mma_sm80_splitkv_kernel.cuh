// fa2_mma_sm80 split-KV kernels: decoding with a KV cache (flash_attn_with_kvcache)
// on tensor cores with sm_80 instructions (mma.sync m16n8k16, ldmatrix, cp.async).
//
// Algorithm (flash-decoding): a decode step has one query row (a few for
// speculative decoding) per sequence, so a forward grid of query tiles would
// give one block per (batch, head) and leave most SMs idle while the keys
// stream through one block. Here:
//   1. append_kernel writes the new keys/values (if any) into the cache at
//      rows cache_seqlens[b] .. + seqlen_new - 1 (contiguous or paged);
//   2. splitkv_kernel: one block per (split of the keys, tile of 16 packed
//      rows, kv head x batch). A packed row is one (query row, query head of
//      the kv head's group), so every query head of a group shares each K/V
//      read (GQA/MQA decode reads the cache once per kv head). The block's
//      visible keys, cut into 16-key chunks, are split evenly over the splits
//      (whole multiples of the warp count); inside a split warp w takes chunks
//      w, w + Warps, ... (rotated per sequence, see chunk_of) through its own
//      cp.async ring of Stages (K, V) chunk
//      pairs, and keeps its own online-softmax state (S = Q K^T and O += P V
//      on m16n8k16, the 16 keys of a chunk being the k16 of P V). No block
//      barrier inside the key loop: a warp waits only on its own copies. At
//      the end the warps' (m, l, O) merge in shared memory; the block writes
//      out and lse itself when there is one split, else its normalized float32
//      partial output and partial LSE (0 and -inf for a split with no visible
//      key);
//   3. combine_kernel (more than one split): per (batch, head, query row),
//      out = sum_s exp(lse_s - lse) O_s with lse = log sum_s exp(lse_s);
//      on sm_90 a programmatic dependent launch of the split kernel, which
//      first checks cache_seqlens and block_table while the split kernel runs
//      (with one split, a warp of the split kernel does).
// Score modifications (softcap, ALiBi, sinks: common/score_modification.h)
// are the kModified instantiation of the split kernel: each S element goes
// through its packed row's modifier (that row's query head: slope and sink)
// before the mask. A sink counts once per row: with one split the block adds
// it after the warps' merge; with several the partials leave it out and the
// combine (its kSinks instantiation) adds it to the combined LSE.
// The masks (causal / window bottom-right, sequence end), the online-softmax
// rule and the PTX wrappers come from src/kernels/common/.
//
// Tiling: SplitKvTraits<HeadDim, Warps, Stages, QInRegs> (fa2_mma_sm80.h),
// Narrow/Wide/DeepSplitKvTraits, chosen per launch: 8 warps x 2 ring stages,
// 4 x 3 or 8 x 3 up to head_dim 128 (4 x 3 at 256); 16 packed rows a block,
// 16-key chunks. K/V chunks sit in swizzled rows at head dims 64/128/256
// (whole 128-byte segments a cp.async), padded at 32/96. The tiling and the
// split count come from the host heuristic (fa2_mma_sm80_kvcache.cpp), as
// does the launch shape of a small grid on sm_90 (at most one block for
// every two SMs): thread-block clusters of kv heads, one block an SM, so the
// blocks spread over the GPU (launch_in_clusters).
//
// Limits: fp16 / bf16, head_dim in HeadDims; paged caches with page_size a
// multiple of 16; 16-byte aligned pointers and strides that are multiples of 8
// elements (cp.async); seqlen_q x (heads / kv_heads) packed rows in tiles of
// 16 re-read K/V once per tile, so this path suits small seqlen_q (decoding);
// no tile trace (a block timeline instead: common/block_timeline.h, compiled
// into a second instantiation of the split kernel, launched only with one).
// The kModified instantiation holds more registers (no spills; the wide tiling
// at head_dim 128: 234 against 168 on sm_80, 198 against 166 on sm_90a; at 32
// up to 121 against 80) and has not been timed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "common/block_timeline.h"
#include "common/lse_merge.h"
#include "common/online_softmax.h"
#include "common/ptx_sm80.h"
#include "common/value_guard.h"
#include "common/mask.h"
#include "common/score_modification.h"
#include "common/visible_keys.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab::fa2_mma_sm80 {

using namespace ::flashlab::sm80;

// Values the host does not read (cache_seqlens, block_table; see
// common/value_guard.h) are clamped where the kernels use them, with no report:
// cache_seqlens into [0, capacity - seqlen_new], a page entry that is not a page
// of the cache read as page 0 (in bounds; that sequence's result is not the
// attention asked for). check_kvcache_values reports them: in the combine
// kernel while the split kernel runs, or with one split (no combine) in one
// warp of the split kernel's first block of each sequence, inline, while its
// first chunks load (an instantiation of its own: kCheckValues). Never a call
// in the split kernel: any call site there, even one never taken, cost its key
// loop (H100, session 19, same-run A/B against 25c3c2b: the paged decode up to
// 18% slower with a report call in the chunk loop, up to 41% with one at the
// block's start).
__device__ __forceinline__ DeviceErrorCode cache_seqlens_code(const KvCacheParams& p) {
  return p.is_paged() ? DeviceErrorCode::cache_seqlens_paged : DeviceErrorCode::cache_seqlens;
}
__device__ __forceinline__ int kvcache_seqlen_k(const KvCacheParams& p, int batch) {
  return p.cache_seqlens == nullptr ? p.seqlen_k
                                    : clamped_value(p.cache_seqlens[batch], 0, p.seqlen_k - p.seqlen_new) +
                                          p.seqlen_new;
}

// Element offset of key `key` of sequence `batch` (kv head 0) in a cache with
// these strides: contiguous, or through the block table's page of that key.
__device__ __forceinline__ int cache_page(const KvCacheParams& p, int batch, int key) {
  const int page = p.block_table[batch * p.block_table_batch_stride + key / p.page_size];
  return static_cast<unsigned>(page) < static_cast<unsigned>(p.num_pages) ? page : 0;
}
__device__ __forceinline__ int64_t cache_row_offset(const KvCacheParams& p, int batch, int key,
                                                    int64_t batch_stride, int64_t row_stride) {
  if (p.is_paged()) return cache_page(p, batch, key) * batch_stride + (key % p.page_size) * row_stride;
  return batch * batch_stride + key * row_stride;
}

// Records the first bad value of sequence `batch`: its cache_seqlens entry,
// then the block-table entries its keys use (from its clamped length). Threads
// thread, thread + threads, ... of the caller share the entries. kInline: the
// record written inline (the split kernel: no call site there), else through
// the out-of-line report_bad_value (the combine: its check, inline, took the
// paged batch-1 x 1k decode from 10.9 to 13.3 us, session 20).
template <bool kInline>
__device__ __forceinline__ void check_kvcache_values(const KvCacheParams& p, int batch, int thread, int threads) {
  const auto record = [&](DeviceErrorCode code, int index0, int index1, int value, int low, int high) {
    if constexpr (kInline) record_bad_value(p.error_log, code, index0, index1, value, low, high);
    else report_bad_value(p.error_log, code, index0, index1, value, low, high);
  };
  int keys = p.seqlen_k;
  if (p.cache_seqlens != nullptr) {
    const int capacity = p.seqlen_k - p.seqlen_new;
    const int cached = p.cache_seqlens[batch];
    // (index1 carries the capacity, for the message.)
    if (thread == 0 && (cached < 0 || cached > capacity))
      record(cache_seqlens_code(p), batch, p.seqlen_k, cached, 0, capacity);
    keys = clamped_value(cached, 0, capacity) + p.seqlen_new;
  }
  if (!p.is_paged()) return;
  const int slots = (keys + p.page_size - 1) / p.page_size;
  for (int slot = thread; slot < slots; slot += threads) {
    const int page = p.block_table[batch * p.block_table_batch_stride + slot];
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages))
      record(DeviceErrorCode::block_table, batch, slot, page, 0, p.num_pages - 1);
  }
}

// One thread per 16-byte piece of a new key row and the matching value row.
template <typename Element, int HeadDim>
__global__ void append_kernel(const KvCacheParams p) {
  constexpr int kPieces = HeadDim / 8;
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= static_cast<int64_t>(p.batch) * p.seqlen_new * p.kv_heads * kPieces) return;
  const int col = static_cast<int>(index % kPieces) * 8;
  int64_t rest = index / kPieces;
  const int head = static_cast<int>(rest % p.kv_heads);
  rest /= p.kv_heads;
  const int row = static_cast<int>(rest % p.seqlen_new);
  const int batch = static_cast<int>(rest / p.seqlen_new);
  // A sequence whose length is out of range appends nothing (its rows would
  // land outside its cache or where its length does not say), nor does a row
  // whose page entry is not a page of the cache (check_kvcache_values reports
  // both).
  const int cached = p.cache_seqlens[batch];
  if (cached < 0 || cached > p.seqlen_k - p.seqlen_new) return;
  const int key = cached + row;
  if (p.is_paged()) {
    const int page = p.block_table[batch * p.block_table_batch_stride + key / p.page_size];
    if (static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages)) return;
  }
  // The caches are the attention's k and v: written in place here (the
  // tensors behind them are mutable; the attention only reads).
  Element* k_cache = const_cast<Element*>(static_cast<const Element*>(p.k));
  Element* v_cache = const_cast<Element*>(static_cast<const Element*>(p.v));
  const auto* k_new = static_cast<const Element*>(p.k_new);
  const auto* v_new = static_cast<const Element*>(p.v_new);
  *reinterpret_cast<uint4*>(k_cache + cache_row_offset(p, batch, key, p.k_batch_stride, p.k_row_stride) +
                            head * p.k_head_stride + col) =
      *reinterpret_cast<const uint4*>(k_new + batch * p.k_new_batch_stride + row * p.k_new_row_stride +
                                      head * p.k_new_head_stride + col);
  *reinterpret_cast<uint4*>(v_cache + cache_row_offset(p, batch, key, p.v_batch_stride, p.v_row_stride) +
                            head * p.v_head_stride + col) =
      *reinterpret_cast<const uint4*>(v_new + batch * p.v_new_batch_stride + row * p.v_new_row_stride +
                                      head * p.v_new_head_stride + col);
}

// Partial results of split s for (batch, head, query row): row index
// (s * batch + b) * heads * seqlen_q + h * seqlen_q + i, head_dim floats each.
__device__ __forceinline__ int64_t partial_row(const KvCacheParams& p, int split, int batch, int head,
                                               int query) {
  return ((static_cast<int64_t>(split) * p.batch + batch) * p.heads + head) * p.seqlen_q + query;
}

// kCheckValues: the instantiation launched with one split (no combine) on
// device values: a warp of each sequence's first block checks them. Its own
// instantiation because the check's code, never run, cost the others: with it
// in every instantiation the paged batch-1 x 1k decode (8 splits, checked by
// the combine) took 13.3 us against 10.9 (H100, session 20, call 3).
// kTimeline: the instantiation launched with a block timeline (the hooks
// compiled in); the one launched without has none. Hooks behind a run-time
// null check alone made the deep ring at head_dim 64 5.6-6.4% slower (batch 8
// x 8k / 32k, H100, session 16), though they ran no instruction but a branch.
// kModified: score modifications (params.modification.any()); without, the
// policy's members are no-ops and the code is the plain kernel's.
template <class Tr, typename Element, bool kTimeline, bool kCheckValues, bool kModified>
__global__ void __launch_bounds__(Tr::kThreads)
    splitkv_kernel(const KvCacheParams p, float* o_partial, float* lse_partial, int num_splits) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kStride = Tr::kSmemStride;
  constexpr int kDSteps = kD / 16;  // k16 steps of Q K^T
  constexpr int kOTiles = kD / 8;   // n8 tiles of O
  constexpr int kWarps = Tr::kWarps;
  constexpr int kStages = Tr::kStages;
  constexpr int kChunk = Tr::kChunkKeys;

  using KvLayout = typename Tr::KvLayout;
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t q_smem = smem_address(smem);
  const uint32_t ring_smem = q_smem + Tr::kQBytes;

  // The combine kernel (launched as a programmatic dependent) may be
  // scheduled now; it waits for this grid to complete before reading.
  pdl_launch_dependents();
  if constexpr (kTimeline) record_block_start(p.block_timeline, p.block_timeline_blocks);
  const int split = blockIdx.x;
  const int row0 = blockIdx.y * Tr::kBlockRows;  // first packed row of the block
  const int kv_head = blockIdx.z % p.kv_heads;
  const int batch = blockIdx.z / p.kv_heads;
  const int group_size = p.heads / p.kv_heads;
  const int packed_rows = p.seqlen_q * group_size;
  const int seqlen_q = p.seqlen_q;
  const int seqlen_k = kvcache_seqlen_k(p, batch);
  const int window_left = p.window_left, window_right = p.window_right;
  const VisibleKeyMask mask{seqlen_q, seqlen_k, window_left, window_right};
  const auto head_of = [&](int packed) { return kv_head * group_size + packed % group_size; };
  // The modifier of a packed row: its query head's slope and sink. With
  // several splits the partials leave the sink out (the combine adds it once).
  const auto modifier_of = [&](int packed) {
    auto modifier = score_modifier<kModified, /*kFastTanh=*/true>(p, batch, head_of(packed), seqlen_q, seqlen_k);
    if constexpr (kModified)
      if (num_splits > 1) modifier.sink_score = -INFINITY;
    return modifier;
  };

  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int group = lane / 4, thread_in_group = lane % 4;

  // The block's keys: those some query row of its packed rows sees, in 16-key
  // chunks, cut into num_splits runs of whole multiples of kWarps chunks.
  const int query_first = row0 / group_size;
  const int query_last = (min(row0 + Tr::kBlockRows, packed_rows) - 1) / group_size;
  const KeyRange keys =
      visible_keys_of_rows(query_first, query_last, seqlen_q, seqlen_k, window_left, window_right);
  int chunk_begin = 0, chunk_end = 0;
  if (!keys.empty()) {
    const int first = keys.first / kChunk, end = keys.last / kChunk + 1;
    const int per_split = (end - first + num_splits * kWarps - 1) / (num_splits * kWarps) * kWarps;
    chunk_begin = min(first + split * per_split, end);
    chunk_end = min(chunk_begin + per_split, end);
  }
  // This warp's chunks: the split's chunks i = warp + j * kWarps, j < my_chunks,
  // rotated by a per-sequence offset. The caches of a batch's sequences sit a
  // large power-of-two distance apart, and blocks of every sequence reading
  // the same offsets at once pile onto the same DRAM channels (H100, batch 32 x
  // 8k keys: 15% slower than the same cache read through a shuffled page
  // table); the online softmax takes the chunks in any order.
  const int split_chunks = chunk_end - chunk_begin;
  const int my_chunks = max(0, (split_chunks - warp + kWarps - 1) / kWarps);
  const int rotation = split_chunks > 0 ? (batch * 7) % split_chunks : 0;
  const auto chunk_of = [&](int j) {
    const int i = warp + j * kWarps + rotation;
    return chunk_begin + (i < split_chunks ? i : i - split_chunks);
  };

  const auto* q = static_cast<const Element*>(p.q);
  const auto* k = static_cast<const Element*>(p.k);
  const auto* v = static_cast<const Element*>(p.v);

  // Q: the block's 16 packed rows (zeros past the last one).
  for (int piece = tid; piece < Tr::kBlockRows * (kD / 8); piece += Tr::kThreads) {
    const int r = piece / (kD / 8), col = (piece % (kD / 8)) * 8;
    const int packed = row0 + r;
    const bool valid = packed < packed_rows;
    const int query = packed / group_size, head = head_of(packed);
    const Element* src = q + batch * p.q_batch_stride + query * p.q_row_stride +
                         head * p.q_head_stride + col;
    cp_async_16(q_smem + (r * kStride + col) * 2, valid ? src : q, valid);
  }
  cp_async_commit();

  // This warp's ring: stage s holds K at +0 and V at +kChunkBytes.
  const uint32_t warp_ring = ring_smem + warp * kStages * 2 * Tr::kChunkBytes;
  auto load_chunk = [&](int j, int stage) {
    const int key0 = chunk_of(j) * kChunk;
    // page_size is a multiple of 16: the chunk's keys share one page.
    const Element* k_chunk = k + cache_row_offset(p, batch, key0, p.k_batch_stride, p.k_row_stride) +
                             kv_head * p.k_head_stride;
    const Element* v_chunk = v + cache_row_offset(p, batch, key0, p.v_batch_stride, p.v_row_stride) +
                             kv_head * p.v_head_stride;
    const uint32_t k_dst = warp_ring + stage * 2 * Tr::kChunkBytes;
    const uint32_t v_dst = k_dst + Tr::kChunkBytes;
#pragma unroll
    for (int i = 0; i < kChunk * (kD / 8) / 32; ++i) {
      const int piece = lane + i * 32;
      const int r = piece / (kD / 8), col = (piece % (kD / 8)) * 8;
      // Keys past the sequence end are zero-filled, never read: the cache
      // beyond cache_seqlens may hold anything, and P = 0 times a NaN there
      // would still be NaN.
      const bool valid = key0 + r < seqlen_k;
      // With an L2 prefetch of a key's row: 256 bytes at head_dim 128, +1-2%
      // GB/s on the H100 (decode b8-b32, 32k-128k keys, same-run A/B); 128
      // below, where 256 reached into the next head's row (d64, batch 32 x
      // 128k: 2825 us against 2919-3095, the rest within 1-2%).
      const uint32_t cell = KvLayout::chunk_offset(r, col / 8);
      constexpr int kPrefetchBytes = kD * 2 >= 256 ? 256 : 128;
      cp_async_16_l2<kPrefetchBytes>(k_dst + cell, valid ? k_chunk + r * p.k_row_stride + col : k, valid);
      cp_async_16_l2<kPrefetchBytes>(v_dst + cell, valid ? v_chunk + r * p.v_row_stride + col : v, valid);
    }
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_chunks) load_chunk(s, s);
    cp_async_commit();
  }
  // With one split no combine runs to check the device values: the last warp
  // of each sequence's first block does, while its first chunks load.
  if constexpr (kCheckValues)
    if (blockIdx.y == 0 && kv_head == 0 && warp == kWarps - 1) check_kvcache_values</*kInline=*/true>(p, batch, lane, 32);
  cp_async_wait<kStages - 1>();  // this thread's Q pieces (the oldest group) have landed
  __syncthreads();               // everyone's have

  const uint32_t q_lane = q_smem + ldmatrix_offset_rows16(lane, kStride) * 2;
  uint32_t q_frag[Tr::kQInRegs ? kDSteps : 1][1][4];
  if constexpr (Tr::kQInRegs) {
#pragma unroll
    for (int ks = 0; ks < kDSteps; ++ks) ldmatrix_x4(q_frag[ks][0], q_lane + ks * 16 * 2);
  }
  const LaneCell k_cell = ldmatrix_cell_pairs(lane);   // K as B of Q K^T
  const LaneCell v_cell = ldmatrix_cell_rows16(lane);  // V as B of P V (.trans)
  const uint32_t k_lane_offset = KvLayout::chunk_offset(k_cell.row, k_cell.chunk);
  const uint32_t v_lane_offset = KvLayout::chunk_offset(v_cell.row, v_cell.chunk);

  // Rows group and group + 8 of the slab: their query rows and modifiers
  // (GQA packing: the rows of one block may be different query heads).
  int row_query[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) row_query[h] = (row0 + group + h * 8) / group_size;
  const ScoreModifier<kModified, true> row_modifier[2] = {modifier_of(row0 + group), modifier_of(row0 + group + 8)};

  // Each warp's max starts at the sink, so its rescaling already counts it.
  float row_max[2] = {row_modifier[0].initial_row_max(), row_modifier[1].initial_row_max()};
  float row_sum[2] = {0.f, 0.f};
  float acc_o[1][kOTiles][4];
#pragma unroll
  for (int n = 0; n < kOTiles; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_o[0][n][i] = 0.f;
  const float scale_log2 = p.softmax_scale * kLog2e;
  const auto exp2 = [](float x) { return fast_exp2(x); };

  for (int j = 0; j < my_chunks; ++j) {
    cp_async_wait<kStages - 2>();
    __syncwarp();  // chunk j visible to the warp; the stage of chunk j-1 is free
    if (j + kStages - 1 < my_chunks) load_chunk(j + kStages - 1, (j + kStages - 1) % kStages);
    cp_async_commit();
    const uint32_t k_stage = warp_ring + (j % kStages) * 2 * Tr::kChunkBytes;
    const uint32_t v_stage = k_stage + Tr::kChunkBytes;

    // S = Q K^T: 16 rows x 16 keys.
    float acc_s[1][2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_s[0][n][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kDSteps; ++ks) {
      uint32_t a[1][4];
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[0][i] = q_frag[ks][0][i];
      } else {
        ldmatrix_x4(a[0], q_lane + ks * 16 * 2);
      }
      mma_b_block<Element, /*kTransposeB=*/false>(acc_s, 0, a, KvLayout::advance(k_stage + k_lane_offset, 0, ks * 2));
    }

    const int key0 = chunk_of(j) * kChunk;
    const auto row_scores = [&](int h) {
      return [&acc_s, h](int n, int i) -> float& { return acc_s[0][n][h * 2 + i]; };
    };
#pragma unroll
    for (int h = 0; h < 2; ++h)
      row_modifier[h].template apply_row<2>(row_query[h], key0, thread_in_group * 2, row_scores(h));
    if (mask.needs_mask(query_first, query_last, key0, key0 + kChunk - 1)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) mask.apply_row<2>(row_query[h], key0, thread_in_group * 2, row_scores(h));
    }

    // Online softmax (base 2), P in place of S; l stays a per-thread partial sum.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float chunk_max = fmaxf(row_max[h], fmaxf(fmaxf(acc_s[0][0][h * 2], acc_s[0][0][h * 2 + 1]),
                                                fmaxf(acc_s[0][1][h * 2], acc_s[0][1][h * 2 + 1])));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 1));
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(0xffffffffu, chunk_max, 2));
      float offset;
      const float correction = online_softmax_rescale(row_max[h], chunk_max, scale_log2, offset, exp2);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float prob = softmax_probability(acc_s[0][n][h * 2 + i], scale_log2, offset, exp2);
          acc_s[0][n][h * 2 + i] = prob;
          sum += prob;
        }
      row_sum[h] = row_sum[h] * correction + sum;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        acc_o[0][n][h * 2] *= correction;
        acc_o[0][n][h * 2 + 1] *= correction;
      }
    }

    // O += P V: P (16 x 16 keys) re-packed as the A operand.
    uint32_t p_frag[1][4] = {{pack2<Element>(acc_s[0][0][0], acc_s[0][0][1]),
                              pack2<Element>(acc_s[0][0][2], acc_s[0][0][3]),
                              pack2<Element>(acc_s[0][1][0], acc_s[0][1][1]),
                              pack2<Element>(acc_s[0][1][2], acc_s[0][1][3])}};
#pragma unroll
    for (int nd = 0; nd < kD / 16; ++nd)
      mma_b_block<Element, /*kTransposeB=*/true>(acc_o, nd, p_frag,
                                                 KvLayout::advance(v_stage + v_lane_offset, 0, nd * 2));
  }
  cp_async_wait<0>();  // only empty groups remain
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }

  // Merge the warps' states through shared memory (the ring is free now):
  // warp w's block holds m[16], l[16], then O[16][kMergeRowFloats] (rows
  // padded: without the pad the fragment's stores went 8-way and the
  // read-back 16-way onto the same banks). Rows past the packed rows are
  // padding; a warp skips the upper 8 when all of them are.
  __syncthreads();
  float* merge = reinterpret_cast<float*>(smem + Tr::kQBytes);
  constexpr int kWarpFloats = Tr::kMergeWarpFloats;
  constexpr int kRowFloats = Tr::kMergeRowFloats;
  const int row_halves = row0 + 8 < packed_rows ? 2 : 1;
  {
    float* mine = merge + warp * kWarpFloats;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (h >= row_halves) break;
      const int r = group + h * 8;
      if (thread_in_group == 0) {
        mine[r] = row_max[h];
        mine[Tr::kBlockRows + r] = row_sum[h];
      }
#pragma unroll
      for (int n = 0; n < kOTiles; ++n)
        *reinterpret_cast<float2*>(mine + 2 * Tr::kBlockRows + r * kRowFloats + n * 8 + thread_in_group * 2) =
            make_float2(acc_o[0][n][h * 2], acc_o[0][n][h * 2 + 1]);
    }
  }
  __syncthreads();

  // kThreads / 16 threads a row; thread t of a row takes the column pairs
  // 2t + 2 kThreadsPerRow j, so a row's threads read and write consecutive
  // columns together.
  constexpr int kThreadsPerRow = Tr::kThreads / Tr::kBlockRows;
  constexpr int kPairs = kD / (2 * kThreadsPerRow);
  static_assert(kPairs * 2 * kThreadsPerRow == kD, "whole column pairs a thread");
  const int r = tid / kThreadsPerRow;
  const int col_first = (tid % kThreadsPerRow) * 2;
  const auto col_of = [&](int j) { return col_first + j * 2 * kThreadsPerRow; };
  const int packed = row0 + r;
  if constexpr (kTimeline) record_block_end(p.block_timeline, p.block_timeline_blocks);
  if (packed >= packed_rows) return;
  float merged_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) merged_max = fmaxf(merged_max, merge[w * kWarpFloats + r]);
  float weight[kWarps];
  float merged_sum = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float m = merge[w * kWarpFloats + r];
    // A warp that saw no key of this row (m = -inf) adds nothing.
    weight[w] = m == -INFINITY ? 0.f : fast_exp2((m - merged_max) * scale_log2);
    merged_sum += weight[w] * merge[w * kWarpFloats + Tr::kBlockRows + r];
  }
  // The max's warp weighs 1 exactly (exp2(0)): its max term is the one P V
  // saw (none did when the max is the sink's). The sink joins once, here,
  // after the warps' merge (modifier_of: only with one split).
  const auto modifier = modifier_of(packed);
  if (!modifier.max_is_sink(merged_max))
    merged_sum = row_sum_as_pv_saw_it<Element>(merged_sum, merged_max, scale_log2, exp2);
  modifier.add_sink_term(merged_sum, merged_max, scale_log2, exp2);
  const SoftmaxResult result = online_softmax_finish(merged_max, merged_sum, p.softmax_scale);
  const int query = packed / group_size, head = head_of(packed);
  float2 values[kPairs];
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    float2 value = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float2 o = *reinterpret_cast<const float2*>(merge + w * kWarpFloats + 2 * Tr::kBlockRows +
                                                        r * kRowFloats + col_of(j));
      value.x += weight[w] * o.x;
      value.y += weight[w] * o.y;
    }
    values[j] = make_float2(value.x * result.inverse_sum, value.y * result.inverse_sum);
  }
  if (num_splits == 1) {
    Element* out = static_cast<Element*>(p.out) + batch * p.out_batch_stride + query * p.out_row_stride +
                   head * p.out_head_stride;
#pragma unroll
    for (int j = 0; j < kPairs; ++j)
      *reinterpret_cast<uint32_t*>(out + col_of(j)) = pack2<Element>(values[j].x, values[j].y);
    if (p.lse != nullptr && col_first == 0)
      p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + query] = result.lse;
  } else {
    const int64_t row = partial_row(p, split, batch, head, query);
    float* out = o_partial + row * kD;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) *reinterpret_cast<float2*>(out + col_of(j)) = values[j];
    if (col_first == 0) lse_partial[row] = result.lse;
  }
}

// One warp per (batch, head, query row): the LSE-weighted sum of the splits.
// Its cost is latency (a batch-1 decode step has 32-64 rows and 4-32 splits),
// so a lane issues the loads of a batch of up to kSplitBatch splits before it
// needs any of them, the first batch's together with the LSEs: one L2 round
// trip for up to 16 splits. (Loads in a loop of 4 a round trip after the LSEs'
// took 6.8-7.3 us at batch 1 x 8k keys, 16 splits, against 4.6 us for cuDNN's
// combine of 32; ncu, H100.) The lanes reduce the LSEs with shuffles and the
// weights go through shared memory.
// kSinks: attention sinks, which the splits' partials leave out; the row's
// sink logit joins the LSE here, once (exp(sink - lse) of the output goes to
// no value row, so the split weights shrink by it).
template <typename Element, int HeadDim, bool kSinks>
__global__ void combine_kernel(const KvCacheParams p, const float* o_partial, const float* lse_partial,
                               int num_splits) {
  constexpr int kWarpsPerBlock = 4;
  constexpr int kColumnGroups = (HeadDim + 127) / 128;  // a lane's float4 columns: lane * 4 + 128 g
  constexpr int kSplitBatch = 16 / kColumnGroups;       // 16 float4 loads in flight a lane
  __shared__ float split_weight[kWarpsPerBlock][kMaxKvSplits];
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.seqlen_q;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= rows) return;
  // While the split kernel runs, the warp of each sequence's first row checks
  // the sequence's device values.
  const int64_t rows_per_sequence = static_cast<int64_t>(p.heads) * p.seqlen_q;
  if (row % rows_per_sequence == 0) check_kvcache_values</*kInline=*/false>(p, static_cast<int>(row / rows_per_sequence), lane, 32);
  pdl_wait_for_prerequisite_grid();  // the split kernel's partials are complete and visible
  const int query = static_cast<int>(row % p.seqlen_q);
  const int head = static_cast<int>(row / p.seqlen_q % p.heads);
  const int batch = static_cast<int>(row / (static_cast<int64_t>(p.seqlen_q) * p.heads));
  const float sink = kSinks ? p.modification.sinks[head] : -INFINITY;  // natural-log units, as the LSEs

  // Split s of this row's output: o_row + s * split_step.
  const float* o_row = o_partial + row * HeadDim;
  const int64_t split_step = rows * HeadDim;
  float4 o[kSplitBatch][kColumnGroups];
  const auto load_batch = [&](int first) {
#pragma unroll
    for (int t = 0; t < kSplitBatch; ++t)
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) {
        const int col = lane * 4 + g * 128;
        o[t][g] = first + t < num_splits && col < HeadDim
                      ? *reinterpret_cast<const float4*>(o_row + (first + t) * split_step + col)
                      : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  load_batch(0);

  constexpr int kSplitsPerLane = kMaxKvSplits / 32;
  float split_lse[kSplitsPerLane];
  float max_lse = -INFINITY;
#pragma unroll
  for (int i = 0; i < kSplitsPerLane; ++i) {
    const int s = lane + i * 32;
    split_lse[i] = s < num_splits ? lse_partial[s * rows + row] : -INFINITY;
    max_lse = fmaxf(max_lse, split_lse[i]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  if constexpr (kSinks) max_lse = fmaxf(max_lse, sink);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kSplitsPerLane; ++i)
    sum += lse_part_weight(split_lse[i], max_lse);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if constexpr (kSinks) sum += lse_part_weight(sink, max_lse);  // once, after the lanes' sum
  // No split saw a key: out 0, lse -inf (the forward's fully masked row);
  // with a sink, out 0 and lse = sink.
  const float lse = merged_lse(max_lse, sum);
#pragma unroll
  for (int i = 0; i < kSplitsPerLane; ++i) {
    const int s = lane + i * 32;
    // A split with no visible key (lse -inf) weighs 0 (its partial is zeros).
    if (s < num_splits) split_weight[warp][s] = lse_part_weight(split_lse[i], lse);
  }
  __syncwarp();

  float4 acc[kColumnGroups];
#pragma unroll
  for (int g = 0; g < kColumnGroups; ++g) acc[g] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int first = 0; first < num_splits; first += kSplitBatch) {
    if (first > 0) load_batch(first);
#pragma unroll
    for (int t = 0; t < kSplitBatch; ++t) {
      const float weight = first + t < num_splits ? split_weight[warp][first + t] : 0.f;
#pragma unroll
      for (int g = 0; g < kColumnGroups; ++g) {
        acc[g].x += weight * o[t][g].x;
        acc[g].y += weight * o[t][g].y;
        acc[g].z += weight * o[t][g].z;
        acc[g].w += weight * o[t][g].w;
      }
    }
  }
  Element* out = static_cast<Element*>(p.out) + batch * p.out_batch_stride + query * p.out_row_stride +
                 head * p.out_head_stride;
#pragma unroll
  for (int g = 0; g < kColumnGroups; ++g) {
    const int col = lane * 4 + g * 128;
    if (col >= HeadDim) continue;
    uint2 packed;
    packed.x = pack2<Element>(acc[g].x, acc[g].y);
    packed.y = pack2<Element>(acc[g].z, acc[g].w);
    *reinterpret_cast<uint2*>(out + col) = packed;
  }
  if (p.lse != nullptr && lane == 0) p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + query] = lse;
}

// Clusters of 2 / 4 / 8 blocks of one kernel resident at once, per device
// (cudaOccupancyMaxActiveClusters, asked once; 0: not asked yet).
constexpr int kMaxCachedDevices = 16;
using ResidentClusters = std::atomic<int>[kMaxCachedDevices][3];

// Launches kernel as clusters of cluster_size blocks along the grid's z (kv
// heads), with the shared memory of one block an SM (a cluster whose blocks
// could share an SM would not spread over the GPU), and returns true; false,
// launching nothing, where the clusters would not all be resident at once.
template <class Kernel, class... Args>
bool launch_in_clusters(Kernel kernel, ResidentClusters& resident, dim3 grid, int threads, int smem_bytes,
                        int cluster_size, cudaStream_t stream, Args... args) {
  const int one_per_sm_bytes = std::max(smem_bytes, shared_memory_per_multiprocessor() / 2);
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), one_per_sm_bytes);
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = one_per_sm_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = 1;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = cluster_size;
  config.attrs = &attribute;
  config.numAttrs = 1;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  const int size_index = cluster_size == 2 ? 0 : cluster_size == 4 ? 1 : 2;
  int clusters = device < kMaxCachedDevices ? resident[device][size_index].load(std::memory_order_relaxed) : 0;
  if (clusters == 0) {
    // An error here (no cluster support) reads as none resident: a plain launch.
    if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) clusters = -1;
    if (device < kMaxCachedDevices) resident[device][size_index].store(clusters, std::memory_order_relaxed);
  }
  if (static_cast<int64_t>(clusters) * cluster_size < static_cast<int64_t>(grid.x) * grid.y * grid.z) return false;
  FLASHLAB_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  return true;
}

template <class Tr>
void launch_kvcache(const KvCacheParams& params, int num_splits) {
  constexpr int kD = Tr::kHeadDim;
  const auto stream = static_cast<cudaStream_t>(params.stream);
  FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] {
    if (params.k_new != nullptr && params.seqlen_new > 0) {
      const int64_t pieces = static_cast<int64_t>(params.batch) * params.seqlen_new * params.kv_heads * (kD / 8);
      constexpr int kThreads = 256;
      append_kernel<Element, kD><<<static_cast<unsigned>((pieces + kThreads - 1) / kThreads), kThreads, 0,
                                   stream>>>(params);
      FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 (kv-cache append)", params);
    }
    const int64_t rows = static_cast<int64_t>(params.batch) * params.heads * params.seqlen_q;
    float* o_partial = num_splits > 1 ? static_cast<float*>(params.workspace) : nullptr;
    float* lse_partial = num_splits > 1 ? o_partial + num_splits * rows * kD : nullptr;
    const bool check_values = num_splits == 1 && (params.cache_seqlens != nullptr || params.is_paged());
    const bool timeline = params.block_timeline != nullptr;
    const bool modified = params.modification.any();
    const auto instantiation = [&](auto modified_constant) {
      constexpr bool kModified = decltype(modified_constant)::value;
      return timeline ? (check_values ? splitkv_kernel<Tr, Element, true, true, kModified>
                                      : splitkv_kernel<Tr, Element, true, false, kModified>)
                      : (check_values ? splitkv_kernel<Tr, Element, false, true, kModified>
                                      : splitkv_kernel<Tr, Element, false, false, kModified>);
    };
    auto kernel = modified ? instantiation(std::true_type{}) : instantiation(std::false_type{});
    const int packed_rows = params.seqlen_q * (params.heads / params.kv_heads);
    const dim3 grid(num_splits, (packed_rows + Tr::kBlockRows - 1) / Tr::kBlockRows,
                    params.batch * params.kv_heads);
    static ResidentClusters resident_clusters[2][2][2];  // [timeline hooks][value check][modified]
    const int cluster_size = kvcache_cluster_size(params, num_splits);
    if (cluster_size == 1 ||
        !launch_in_clusters(kernel, resident_clusters[timeline][check_values][modified], grid, Tr::kThreads,
                            Tr::kSmemBytes, cluster_size, stream, static_cast<const KvCacheParams&>(params),
                            o_partial, lse_partial, num_splits)) {
      if constexpr (Tr::kSmemBytes > 48 * 1024)  // (a cluster launch may have raised it)
        allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
      kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(params, o_partial, lse_partial, num_splits);
    }
    FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 (split-KV)", params);
    if (num_splits > 1) {
      // A programmatic dependent launch on sm_90 (its launch overlaps the
      // split kernel's tail; about 3 us of a 27 us batch-1 decode step), a
      // plain one before.
      const auto combine = params.modification.sinks != nullptr ? combine_kernel<Element, kD, true>
                                                                 : combine_kernel<Element, kD, false>;
      launch_kernel(combine, dim3(static_cast<unsigned>((rows + 3) / 4)), dim3(128), 0, stream,
                    params.device_compute_capability >= 90, static_cast<const KvCacheParams&>(params),
                    static_cast<const float*>(o_partial), static_cast<const float*>(lse_partial), num_splits);
      FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 (split-KV combine)", params);
    }
  });
}

template <int HeadDim>
void launch_kvcache_tiled(const KvCacheParams& params, int num_splits, KvTiling tiling) {
  with_split_kv_traits<HeadDim>(tiling, [&](auto traits) { launch_kvcache<decltype(traits)>(params, num_splits); });
}

}  // namespace flashlab::fa2_mma_sm80
