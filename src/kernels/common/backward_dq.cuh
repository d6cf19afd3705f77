// The backward's auxiliary kernels and the float32 dq accumulator, shared by
// every kernel whose backward walks query blocks per key block and adds
// partial dQ to an accumulator in global memory (fa2_mma_sm80, fa3_wgmma_sm90):
//
// - backward_preprocess_kernel: D = rowsum(dO * O) per (batch, head, query
//   row), float32, into params.softmax_d (laid out like the LSE);
// - backward_sink_gradient_kernel: with attention sinks, dsink[h] = -sum over
//   the head's rows of exp(sink - LSE) D (fa1_scalar's backward too);
// - the accumulator's fragment order: a block_m x head_dim block of one head
//   is a run of 128-float groups, each the four C-fragment values of the 32
//   lanes of one warp (value i: row lane / 4 + 8 * (i / 2), column
//   2 * (lane % 4) + i % 2 of an 8-column tile), so one warp's reduction covers
//   512 contiguous bytes; which tile a group is, is the kernel's (its Order);
// - backward_convert_dq_kernel<Order>: dq = scale * (sum of the slots) in the
//   input dtype, back from the kernel's fragment order. Order names the block
//   (kBlockM, kHeadDim) and where group g's lane `lane` starts (origin); an
//   Order with kTransposed = true holds transposed tiles (fa3_wgmma_sm90's
//   dQ^T): value i at row + i % 2, column + 8 * (i / 2).
//
// Both may run as programmatic dependent launches (launch_kernel): the
// preprocess lets the main kernel launch once all its blocks have started,
// and the convert waits for the main kernel (griddepcontrol.wait, a no-op in
// a plain launch) before it reads the accumulator.
//
// The workspace (softmax_d, the slots, their strides) is BackwardWorkspace
// (fa2_mma_sm80.h), the same for both kernels with their own block_m.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/mma_accumulator_layout.h"  // FragmentOrigin
#include "common/ptx_sm80.h"
#include "common/sequence_view.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"

namespace flashlab {

using sm80::pack2;
using sm80::unpack2;

inline constexpr int kBwdAuxThreads = 128;  // the preprocess kernel (the convert kernel: kConvertThreads)

// Threads that share one row in the preprocess kernel (a power of two <= 16
// and <= the row's 16-byte chunks).
template <int HeadDim>
inline constexpr int kPreprocessThreadsPerRow = HeadDim / 8 >= 16 ? 16 : HeadDim / 8 >= 8 ? 8 : 4;

// ---------------------------------------------------------------------------
// 1. D = rowsum(dO * O), float32, one group of kPreprocessThreadsPerRow threads a row.
// Where the preprocess writes each row's D: fa2_mma_sm80's layout, softmax_d
// laid out like the LSE, rows < seqlen_q. A kernel with another layout passes
// its own destination (rows(view): the rows to write, padding included;
// store(...): one row's D; zeroes_dq_accum(): whether the preprocess also
// zeros the dq accumulator's rows it visits, in place of a memset).
struct SoftmaxDLikeLse {
  __device__ bool zeroes_dq_accum() const { return false; }  // fa2's slots: a memset
  __device__ int rows(const AttentionBackwardParams&, const BackwardSequenceView& view) const {
    return view.seqlen_q;
  }
  __device__ void store(const AttentionBackwardParams& p, const BackwardSequenceView& view, int batch, int head,
                        int row, float d) const {
    p.softmax_d[batch * p.lse_batch_stride + head * p.lse_head_stride + view.lse_row0 + row] = d;
  }
  __device__ float load(const AttentionBackwardParams& p, const BackwardSequenceView& view, int batch, int head,
                        int row) const {
    return p.softmax_d[batch * p.lse_batch_stride + head * p.lse_head_stride + view.lse_row0 + row];
  }
};

template <int HeadDim, typename Element, class Destination = SoftmaxDLikeLse>
__global__ void __launch_bounds__(kBwdAuxThreads)
    backward_preprocess_kernel(const AttentionBackwardParams p, const Destination destination = {}) {
  constexpr int kChunks = HeadDim / 8;  // 16-byte chunks a row
  constexpr int kThreadsPerRow = kPreprocessThreadsPerRow<HeadDim>;
  constexpr int kRowsPerBlock = kBwdAuxThreads / kThreadsPerRow;
  static_assert(32 % kThreadsPerRow == 0 && kThreadsPerRow <= kChunks, "row groups inside a warp");

  sm80::pdl_launch_dependents();  // the main kernel may launch; it waits for this grid before reading D
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const BackwardSequenceView view = backward_sequence_view(p, batch);
  const int rows = destination.rows(p, view);
  if (static_cast<int>(blockIdx.x) * kRowsPerBlock >= rows) return;  // whole block
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kThreadsPerRow;
  const int part = threadIdx.x % kThreadsPerRow;

  float sum = 0.f;
  if (row < view.seqlen_q) {
    const Element* o = static_cast<const Element*>(p.out) + view.out_offset +
                       head * p.out_head_stride + row * p.out_row_stride;
    const Element* d_o = static_cast<const Element*>(p.dout) + view.dout_offset +
                         head * p.dout_head_stride + row * p.dout_row_stride;
#pragma unroll
    for (int c = part; c < kChunks; c += kThreadsPerRow) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + c * 8);
      const uint4 b = *reinterpret_cast<const uint4*>(d_o + c * 8);
      const uint32_t aw[4] = {a.x, a.y, a.z, a.w};
      const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 x = unpack2<Element>(aw[w]);
        const float2 y = unpack2<Element>(bw[w]);
        sum = fmaf(x.x, y.x, sum);
        sum = fmaf(x.y, y.y, sum);
      }
    }
  }
  // Every thread of the block is here (rows past the end with sum 0).
#pragma unroll
  for (int offset = kThreadsPerRow / 2; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (part == 0 && row < rows) destination.store(p, view, batch, head, row, sum);
  // The block's rows of the dq accumulator (one slot, row stride head_dim, so
  // contiguous) to zero, in 16-byte stores: the main kernel adds to them after.
  if (destination.zeroes_dq_accum()) {
    constexpr int kVectors = kRowsPerBlock * HeadDim / 4;
    float4* const accum = reinterpret_cast<float4*>(p.dq_accum + view.dq_accum_offset +
                                                    head * p.dq_accum_head_stride +
                                                    static_cast<int64_t>(blockIdx.x) * kRowsPerBlock * HeadDim);
#pragma unroll
    for (int v = threadIdx.x; v < kVectors; v += kBwdAuxThreads) accum[v] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// ---------------------------------------------------------------------------
// 1b. Attention sinks' gradient (score_modification.h): dsink[h] = -sum over
// the rows of every sequence of exp(sink_h - LSE) D, written to p.dsinks[h].
// One block a head, the rows in a fixed order and a fixed reduction tree, so
// the result is bitwise the same run to run (the deterministic mode asks no
// more); each thread has kSinkGradientRows rows' loads in flight at once (one
// row at a time left 16 blocks waiting on memory: 50-200 us at 16 heads x 16k
// rows, H100, session 23). Runs after the preprocess; `stats` reads D where it
// wrote it.
inline constexpr int kSinkGradientThreads = 1024, kSinkGradientRows = 4;
template <class RowStats>
__global__ void __launch_bounds__(kSinkGradientThreads)
    backward_sink_gradient_kernel(const AttentionBackwardParams p, const RowStats stats) {
  const int head = blockIdx.x;
  const float sink = p.modification.sinks[head];
  float sum = 0.f;
  for (int batch = 0; batch < p.batch; ++batch) {
    const BackwardSequenceView view = backward_sequence_view(p, batch);
    const float* lse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + view.lse_row0;
    for (int first = threadIdx.x; first < view.seqlen_q; first += kSinkGradientThreads * kSinkGradientRows) {
      float row_lse[kSinkGradientRows], row_d[kSinkGradientRows];
#pragma unroll
      for (int r = 0; r < kSinkGradientRows; ++r) {
        const int row = first + r * kSinkGradientThreads;
        const bool in = row < view.seqlen_q;
        row_lse[r] = in ? lse[row] : -INFINITY;
        row_d[r] = in ? stats.load(p, view, batch, head, row) : 0.f;
      }
      // With a sink every row's LSE is finite (it counts the sink); -inf: past the end.
#pragma unroll
      for (int r = 0; r < kSinkGradientRows; ++r)
        if (row_lse[r] != -INFINITY) sum += expf(sink - row_lse[r]) * row_d[r];
    }
  }
  __shared__ float warp_sums[kSinkGradientThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kSinkGradientThreads / 32; ++w) total += warp_sums[w];
    p.dsinks[head] = -total;
  }
}

// Enqueues it when the problem has sinks (after the preprocess wrote D).
template <class RowStats>
void launch_backward_sink_gradient(const AttentionBackwardParams& p, const RowStats& stats, const char* kernel_name) {
  if (p.modification.sinks == nullptr || p.heads <= 0) return;
  backward_sink_gradient_kernel<RowStats>
      <<<p.heads, kSinkGradientThreads, 0, static_cast<cudaStream_t>(p.stream)>>>(p, stats);
  FLASHLAB_CHECK_LAUNCH(kernel_name, p);
}

// ---------------------------------------------------------------------------
// The accumulator's fragment order: value slots within a 128-float group.
// Where lane's value i sits in its group.
__device__ __forceinline__ int dq_fragment_slot(int lane, int i) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return lane * 4 + i;  // a lane's four values together: one 16-byte reduction
#else
  return i * 32 + lane;  // value i of the 32 lanes together: coalesced scalar reductions
#endif
}
// Adds one C fragment (acc[0..3]) of a lane to its group, or with kStore
// stores it (a deterministic slot's first contribution to the block).
template <bool kStore = false>
__device__ __forceinline__ void add_dq_fragment(float* group, int lane, const float (&acc)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kStore)
    *reinterpret_cast<float4*>(group + dq_fragment_slot(lane, 0)) = make_float4(acc[0], acc[1], acc[2], acc[3]);
  else
    sm80::red_add_f32x4(group + dq_fragment_slot(lane, 0), acc[0], acc[1], acc[2], acc[3]);
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kStore)
      group[dq_fragment_slot(lane, i)] = acc[i];
    else
      sm80::red_add_f32(group + dq_fragment_slot(lane, i), acc[i]);
  }
#endif
}

// Reads one lane's four values of a group (the convert kernel; streamed: read once).
__device__ __forceinline__ void load_dq_fragment(const float* group, int lane, float (&value)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const float4 v = __ldcs(reinterpret_cast<const float4*>(group + dq_fragment_slot(lane, 0)));
  value[0] = v.x, value[1] = v.y, value[2] = v.z, value[3] = v.w;
#else
#pragma unroll
  for (int i = 0; i < 4; ++i) value[i] = __ldcs(group + dq_fragment_slot(lane, i));
#endif
}

// ---------------------------------------------------------------------------
// dq = scale * (sum of the dq_accum slots). One block per (query block, head,
// batch): every (group, lane) of the block's fragment order read whole (all of
// a thread's loads in flight together), scaled and packed into a row-major
// shared tile, which goes out as 16-byte row chunks. (Writing straight from the
// fragments stored 4 bytes a lane, half a sector a row: 87 us against FA2's 78
// at head_dim 128, 16k rows x 16 heads, ncu.)
inline constexpr int kConvertThreads = 256;
template <class Order>
inline constexpr bool kTransposedDqOrder = requires { requires Order::kTransposed; };
template <class Order, typename Element>
__global__ void __launch_bounds__(kConvertThreads)
    backward_convert_dq_kernel(const AttentionBackwardParams p, const int slots,
                                   const int64_t slot_stride, const int* slot_first) {
  constexpr int kBM = Order::kBlockM;
  constexpr int kD = Order::kHeadDim;
  constexpr int kTileStride = kD + 8;  // elements; the padding spreads a warp's fragment stores over all banks
  constexpr int kPasses = kBM * kD / 4 / kConvertThreads;  // (group, lane) pairs a thread
  static_assert(kBM * kD / 4 % kConvertThreads == 0, "whole passes over a query block");
  __shared__ __align__(16) Element tile[kBM * kTileStride];

  const int m_block = blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  // The main kernel's additions complete (before any return: a grid whose
  // blocks all return early must still end after the main kernel).
  sm80::pdl_wait_for_prerequisite_grid();
  const BackwardSequenceView view = backward_sequence_view(p, batch);
  if (m_block * kBM >= view.seqlen_q) return;  // whole block

  const float* accum = p.dq_accum + view.dq_accum_offset + head * p.dq_accum_head_stride +
                       static_cast<int64_t>(m_block) * kBM * p.dq_accum_row_stride;
  float sum[kPasses][4] = {};
  for (int slot = 0; slot < slots; ++slot) {  // fixed order: bitwise reproducible
    if (slot_first != nullptr && m_block < slot_first[batch * slots + slot]) continue;  // never written
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int pair = pass * kConvertThreads + threadIdx.x;
      float value[4];
      load_dq_fragment(accum + slot * slot_stride + pair / 32 * 128, pair % 32, value);
#pragma unroll
      for (int i = 0; i < 4; ++i) sum[pass][i] += value[i];
    }
  }
  const float scale = p.softmax_scale;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const int pair = pass * kConvertThreads + threadIdx.x;
    const int lane = pair % 32;
    // Value i of the lane: row + 8 * (i / 2), column col + i % 2 (transposed:
    // row + i % 2, column + 8 * (i / 2)).
    const FragmentOrigin origin = Order::origin(pair / 32, lane);
    const int row = origin.row, col = origin.col;
    if constexpr (kTransposedDqOrder<Order>) {
      const uint32_t packed[2] = {pack2<Element>(sum[pass][0] * scale, sum[pass][1] * scale),
                                  pack2<Element>(sum[pass][2] * scale, sum[pass][3] * scale)};
      const Element* const value = reinterpret_cast<const Element*>(packed);
#pragma unroll
      for (int i = 0; i < 4; ++i) tile[(row + i % 2) * kTileStride + col + 8 * (i / 2)] = value[i];
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint32_t*>(&tile[(row + 8 * h) * kTileStride + col]) =
            pack2<Element>(sum[pass][2 * h] * scale, sum[pass][2 * h + 1] * scale);
    }
  }
  __syncthreads();
  constexpr int kRowChunks = kD / 8;  // 16-byte chunks a row
  Element* const dq = static_cast<Element*>(p.dq) + view.dq_offset + head * p.dq_head_stride;
  const int rows = min(kBM, view.seqlen_q - m_block * kBM);
  for (int c = threadIdx.x; c < rows * kRowChunks; c += kConvertThreads) {
    const int row = c / kRowChunks;
    const int col = c % kRowChunks * 8;
    *reinterpret_cast<uint4*>(dq + static_cast<int64_t>(m_block * kBM + row) * p.dq_row_stride + col) =
        *reinterpret_cast<const uint4*>(&tile[row * kTileStride + col]);
  }
}

}  // namespace flashlab
