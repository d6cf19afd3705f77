// fa1_scalar: the FlashAttention-1 forward pass in plain float32 scalar code.
//
// Algorithm: one thread owns one query row. The block stages its Q tile
// (kBlockQ rows) in shared memory once, then walks the key/value sequence in
// tiles of kBlockK rows: all threads copy a K and a V tile to shared memory
// (converted to float32), each thread scores its row against the tile, and
// updates its online-softmax state (running max m, running sum l) and its
// output accumulator, rescaling both when m grows.
//
// Tiling: kBlockQ = 64 rows per block (64 threads), kBlockK = 32 keys per step,
// head_dim padded up to the next entry of PaddedHeadDims (32, 64, 128: one
// instantiation each) so the output accumulator stays in registers. The
// visible-key rule, the sequence view and the online-softmax update come from
// src/kernels/common/.
//
// Score modifications (softcap, ALiBi, sinks: common/score_modification.h)
// are the kModified instantiation (params.modification.any()): each visible
// raw dot product goes through the policy before it is scaled, and each row's
// max starts at the sink's logit, whose term joins l after the last tile.
//
// Limits: head_dim <= 128; float32, float16 and bfloat16 inputs; any seqlens,
// causal and sliding windows (bottom-right aligned), GQA/MQA, strided inputs,
// variable-length batches, softcap, ALiBi and sinks, optional tile tracing
// (m and l as the kernel keeps them; l without the sink's term). Meant for
// reading and stepping through in cuda-gdb, not for speed.
//
// kPlantedRowMaxBug (test-only instantiation, see fa1_scalar_planted_bug.cu)
// round-trips the running max through shared memory with a wrong index, the
// classic FlashAttention bug: the first key tile is right, everything after it
// is wrong.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>

#include "common/online_softmax.h"
#include "common/score_modification.h"
#include "common/sequence_view.h"
#include "common/static_switch.h"
#include "common/tile_trace.h"
#include "common/mask.h"
#include "common/visible_keys.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {
namespace fa1_scalar {

constexpr int kBlockQ = 64;
constexpr int kBlockK = 32;
// The head dims instantiated; a problem's head_dim runs padded up to the next one.
using PaddedHeadDims = HeadDimList<32, 64, 128>;
constexpr int kMaxHeadDim = PaddedHeadDims::kMax;

// Host and device (the backward's per-thread code also runs on the host in a CPU test).
__host__ __device__ __forceinline__ float to_float(float x) { return x; }
__host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__host__ __device__ __forceinline__ T from_float(float x);
template <>
__host__ __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__host__ __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__host__ __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

template <typename Element, int kHeadDimPadded, bool kPlantedRowMaxBug, bool kModified>
__global__ void __launch_bounds__(kBlockQ)
    fa1_scalar_kernel(const AttentionParams params) {
  // Rows of Q are padded by one float so that threads reading the same column
  // of different rows hit different banks.
  extern __shared__ float shared[];
  constexpr int kQStride = kHeadDimPadded + 1;
  float* q_tile = shared;                             // [kBlockQ][kQStride]
  float* k_tile = q_tile + kBlockQ * kQStride;        // [kBlockK][kHeadDimPadded]
  float* v_tile = k_tile + kBlockK * kHeadDimPadded;  // [kBlockK][kHeadDimPadded]
  float* score_tile = v_tile + kBlockK * kHeadDimPadded;  // [kBlockQ][kBlockK + 1]
  float* row_max_store = score_tile + kBlockQ * (kBlockK + 1);  // [kBlockQ], planted bug only

  const int query_tile = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / (params.heads / params.kv_heads);
  const int head_dim = params.head_dim;

  const SequenceView view = sequence_view(params, batch);
  const int seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
  const int tile_row0 = query_tile * kBlockQ;
  if (tile_row0 >= seqlen_q) return;  // varlen: this entry is shorter than the grid

  const Element* q = static_cast<const Element*>(params.q) + view.q_offset +
                     head * params.q_head_stride;
  const Element* k = static_cast<const Element*>(params.k) + view.k_offset +
                     kv_head * params.k_head_stride;
  const Element* v = static_cast<const Element*>(params.v) + view.v_offset +
                     kv_head * params.v_head_stride;
  Element* out = static_cast<Element*>(params.out) + view.out_offset +
                 head * params.out_head_stride;

  // Stage the Q tile; rows past the sequence are zero so they stay finite.
  for (int index = threadIdx.x; index < kBlockQ * kHeadDimPadded; index += blockDim.x) {
    const int r = index / kHeadDimPadded, c = index % kHeadDimPadded;
    const int row = tile_row0 + r;
    q_tile[r * kQStride + c] =
        (row < seqlen_q && c < head_dim) ? to_float(q[row * params.q_row_stride + c]) : 0.f;
  }

  const int my_row = tile_row0 + threadIdx.x;
  const bool row_in_range = my_row < seqlen_q;
  const VisibleKeyMask mask{seqlen_q, seqlen_k, params.window_left, params.window_right};
  const KeyRange my_keys = mask.visible(my_row);

  // Key tiles any row of this block can see; tiles outside are skipped whole.
  const KeyRange block_keys =
      visible_keys_of_rows(tile_row0, min(tile_row0 + kBlockQ, seqlen_q) - 1, seqlen_q, seqlen_k,
                           params.window_left, params.window_right);
  const int key_tile_begin = block_keys.first / kBlockK;
  const int key_tile_end = block_keys.empty() ? key_tile_begin : block_keys.last / kBlockK + 1;

  // The scores are scaled as they are made: exponent scale 1, natural exp.
  const auto exp_natural = [](float x) { return expf(x); };
  // The modification policy works in raw-score units (s' * softmax_scale is
  // the logit): it modifies the raw dot product, and m, kept in scaled units,
  // starts at its sink times softmax_scale (-inf without one).
  const auto modifier = score_modifier<kModified, /*kFastTanh=*/false>(params, batch, head, seqlen_q, seqlen_k);
  float row_max = modifier.initial_row_max();  // m
  if constexpr (kModified) {
    if (row_max != -INFINITY) row_max *= params.softmax_scale;
  }
  float row_sum = 0.f;  // l, relative to exp(m)
  float accumulator[kHeadDimPadded];
#pragma unroll
  for (int c = 0; c < kHeadDimPadded; ++c) accumulator[c] = 0.f;

  const float* my_q = q_tile + threadIdx.x * kQStride;

  for (int key_tile = key_tile_begin; key_tile < key_tile_end; ++key_tile) {
    const int key0 = key_tile * kBlockK;
    if constexpr (kPlantedRowMaxBug) {
      if (key_tile > key_tile_begin) {
        // Stored at the neighbouring row's slot: every tile after the first
        // continues from another row's max.
        row_max_store[(threadIdx.x + 1) % kBlockQ] = row_max;
        __syncthreads();
        row_max = row_max_store[threadIdx.x];
      }
    }
    __syncthreads();  // the previous tile is no longer being read
    for (int index = threadIdx.x; index < kBlockK * kHeadDimPadded; index += blockDim.x) {
      const int r = index / kHeadDimPadded, c = index % kHeadDimPadded;
      const int key = key0 + r;
      const bool valid = key < seqlen_k && c < head_dim;
      k_tile[index] = valid ? to_float(k[key * params.k_row_stride + c]) : 0.f;
      v_tile[index] = valid ? to_float(v[key * params.v_row_stride + c]) : 0.f;
    }
    __syncthreads();

    // Scores live in shared memory (one padded row per thread): a register
    // array indexed by key would need the key loop unrolled, which makes this
    // file take minutes to compile.
    float* my_scores = score_tile + threadIdx.x * (kBlockK + 1);
    float tile_max = -INFINITY;
#pragma unroll 1
    for (int j = 0; j < kBlockK; ++j) {
      const int key = key0 + j;
      float score = -INFINITY;
      if (row_in_range && my_keys.contains(key)) {
        float dot = 0.f;
#pragma unroll 16
        for (int c = 0; c < kHeadDimPadded; ++c) dot += my_q[c] * k_tile[j * kHeadDimPadded + c];
        score = modifier.modified(dot, my_row, key) * params.softmax_scale;
      }
      my_scores[j] = score;
      tile_max = fmaxf(tile_max, score);
    }

    // While every key so far is masked, m stays -inf (or the sink) and l and O stay 0.
    float offset;
    const float rescale =
        online_softmax_rescale(row_max, fmaxf(row_max, tile_max), 1.f, offset, exp_natural);
    // A row that has seen no visible key yet (out of range, above a causal
    // diagonal) adds nothing: skip its P.V loop, the bulk of the work. With a
    // sink m is finite from the start, so there the tile itself decides (a
    // tile with no visible key has p = 0 and rescale 1: skipping it is exact).
    if (kModified ? tile_max != -INFINITY : row_max != -INFINITY) {
      float tile_sum = 0.f;
#pragma unroll
      for (int c = 0; c < kHeadDimPadded; ++c) accumulator[c] *= rescale;
#pragma unroll 1
      for (int j = 0; j < kBlockK; ++j) {
        const float probability = softmax_probability(my_scores[j], 1.f, offset, exp_natural);
        tile_sum += probability;
#pragma unroll
        for (int c = 0; c < kHeadDimPadded; ++c)
          accumulator[c] += probability * v_tile[j * kHeadDimPadded + c];
      }
      row_sum = row_sum * rescale + tile_sum;
    }

    // The row's state after this tile in plain locals, made before the line
    // cuda-gdb stops at (not at the merge point of the `if` above: see README).
    const float running_max = row_max, running_sum = row_sum;
    // cuda-gdb: the online-softmax state of this row after key_tile (tests/debug uses this line).
    if (params.trace.enabled() && row_in_range)
      record_tile_state(params, batch, head, my_row, key_tile, running_max, running_sum);
  }

  if (!row_in_range) return;
  // The sink's term, once per row; sink_term takes m in raw units, like the sink.
  if constexpr (kModified)
    row_sum += modifier.sink_term(row_max / params.softmax_scale, params.softmax_scale, exp_natural);
  // A row that saw no key (fully masked) gets output 0 and LSE -inf; with a
  // sink, output 0 and LSE = the sink (l = the sink's term alone, 1).
  const SoftmaxResult result = online_softmax_finish(row_max, row_sum, 1.f);
  Element* my_out = out + my_row * params.out_row_stride;
#pragma unroll
  for (int c = 0; c < kHeadDimPadded; ++c)
    if (c < head_dim) my_out[c] = from_float<Element>(accumulator[c] * result.inverse_sum);
  const int64_t lse_index = batch * params.lse_batch_stride + head * params.lse_head_stride +
                            view.lse_row0 + my_row;
  params.lse[lse_index] = result.lse;
}

template <typename Element, int kHeadDimPadded, bool kPlantedRowMaxBug>
void launch_with_head_dim(const AttentionParams& params) {
  const int shared_bytes =
      static_cast<int>(sizeof(float)) * (kBlockQ * (kHeadDimPadded + 1) +
                                         2 * kBlockK * kHeadDimPadded + kBlockQ * (kBlockK + 1) +
                                         (kPlantedRowMaxBug ? kBlockQ : 0));
  auto kernel = fa1_scalar_kernel<Element, kHeadDimPadded, kPlantedRowMaxBug, /*kModified=*/false>;
  // The planted bug's variant declares no modifications: it builds the plain kernel only.
  if constexpr (!kPlantedRowMaxBug) {
    if (params.modification.any()) kernel = fa1_scalar_kernel<Element, kHeadDimPadded, false, /*kModified=*/true>;
  }
  // Above 48 KB a kernel must opt in to the larger dynamic shared memory limit.
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
  const dim3 grid((params.seqlen_q + kBlockQ - 1) / kBlockQ, params.heads, params.batch);
  kernel<<<grid, kBlockQ, shared_bytes, static_cast<cudaStream_t>(params.stream)>>>(params);
  FLASHLAB_CHECK_LAUNCH("fa1_scalar", params);
}

template <typename Element, bool kPlantedRowMaxBug>
void launch_with_element(const AttentionParams& params) {
  // unsupported_reason rejects head dims above the largest entry before a launch.
  FLASHLAB_HEAD_DIM_ROUND_UP_SWITCH(PaddedHeadDims, params.head_dim, kHeadDimPadded, [&] {
    launch_with_head_dim<Element, kHeadDimPadded, kPlantedRowMaxBug>(params);
  });
}

template <bool kPlantedRowMaxBug>
void launch(const AttentionParams& params) {
  switch (params.dtype) {
    case DataType::float32: return launch_with_element<float, kPlantedRowMaxBug>(params);
    case DataType::float16: return launch_with_element<__half, kPlantedRowMaxBug>(params);
    case DataType::bfloat16: return launch_with_element<__nv_bfloat16, kPlantedRowMaxBug>(params);
    case DataType::e4m3: return;  // the kernel choice refuses it (supports_e4m3 is off)
  }
}

inline std::string unsupported_reason(const AttentionParams& params) {
  if (params.head_dim < 1 || params.head_dim > kMaxHeadDim)
    return "fa1_scalar supports head_dim 1 to " + std::to_string(kMaxHeadDim) + ", got " +
           std::to_string(params.head_dim);
  if (params.heads > 65535 || params.batch > 65535)  // grid y and z limits
    return "fa1_scalar supports at most 65535 heads and 65535 batches; got " +
           std::to_string(params.heads) + " and " + std::to_string(params.batch);
  return {};
}

inline TileShape tile_shape(const AttentionParams&) { return {kBlockQ, kBlockK}; }

}  // namespace fa1_scalar
}  // namespace flashlab
