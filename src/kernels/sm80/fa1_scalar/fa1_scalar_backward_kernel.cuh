// fa1_scalar backward: FlashAttention-2's backward pass in plain float32 scalar
// code, the rung to step through in cuda-gdb to learn the algorithm and to
// check the fast kernels against.
//
// Algorithm. Per (batch, head), with S = scale * Q K^T and the forward's
// natural-log LSE per query row:
//   P  = exp(S - lse)            recomputed from the LSE, never stored
//   dV = P^T dout                dP = dout V^T
//   D  = rowsum(dout * out)      (equal to rowsum(P * dP))
//   dS = P * (dP - D)
//   dQ = scale * dS K            dK = scale * dS^T Q
// and under GQA/MQA dK, dV of a kv head sum over the query heads of its group.
// Score modifications (common/score_modification.h; the kModified
// instantiation of kernels 2 and 3): S = scale * s' with s' the modified raw
// score, and dS is multiplied by ds'/ds (softcap's 1 - tanh^2); with sinks the
// LSE counts the sink, and dsink = -sum over rows of exp(sink - lse) D is the
// shared backward_sink_gradient_kernel's (common/backward_dq.cuh), launched by
// backward_launch after the three kernels.
// Masked keys (the bottom-right causal/window rule of common/visible_keys.h)
// have P = 0, so they add nothing; a row that saw no key (lse = -inf, or the
// sink) adds nothing and gets dQ = 0; a key no row sees gets dK = dV = 0. Never NaN.
//
// Three kernels, launched in this order on params.stream:
//   1. preprocess: one thread per (batch, head, query row) writes D to
//      softmax_d (float32, laid out like lse, carved from params.workspace);
//   2. dK/dV: one thread per (batch, kv head, key row), FlashAttention-2's
//      "one CTA per K/V block walking the query blocks" shrunk to one key per
//      thread: it walks every query head of its group and every query row that
//      sees its key, recomputes p, dp, ds and accumulates dV += p * dout_i and
//      dK += ds * q_i, then writes dK and dV once;
//   3. dQ: one thread per (batch, head, query row) walks its visible keys,
//      recomputes p and ds (the work of kernel 2 done again, row-wise) and
//      accumulates dQ += ds * k_j.
// The fast kernels add partial dQ per key block into a float32 accumulator
// instead (atomics, or ordered for the deterministic mode); here every
// gradient element is summed by one thread in a fixed order, with no atomics,
// so dq, dk and dv are bitwise reproducible in both modes
// (params.deterministic changes nothing) and dq_accum is not used.
//
// Threads and memory: kThreads = 32 threads per block in kernels 2 and 3 (a
// block covers 32 key rows, or 32 query rows, of one head), 128 in kernel 1.
// Each thread keeps its own rows (kernel 2: k, v and the dK, dV accumulators;
// kernel 3: q, dout and the dQ accumulator) as float32 in shared memory, at an
// odd row stride so that 32 threads reading column c hit 32 banks: four
// head_dim-long arrays would not fit in registers. Threads never read each
// other's rows, so there is no __syncthreads. The rows of q, dout (kernel 2)
// and k, v (kernel 3) are read from global memory as the loop reaches them;
// every thread of a block walks the same rows in the same order (the union of
// what the block's threads see, each thread skipping what it does not see),
// so those reads are broadcasts. What one thread does is a host-device
// function of its block and thread indices (preprocess_thread, dk_dv_thread,
// dq_thread; break there in cuda-gdb): the kernels only call it, and a CPU
// test (tests/cpu/test_fa1_scalar_backward_host.cpp) runs it on the host for
// every thread of the grid against the autograd reference.
//
// Limits: the forward's (fa1_scalar::unsupported_reason): head_dim <= 128;
// float32, float16, bfloat16; any seqlens, causal and sliding windows, GQA/MQA,
// strided inputs with a contiguous last dimension, variable-length batches,
// softcap, ALiBi and sinks. No tile trace. O(seqlen_q * seqlen_k * head_dim)
// per thread: for reading, not for speed.
#pragma once

#include <cmath>
#include <string>

#include "common/sequence_view.h"
#include "common/mask.h"
#include "common/score_modification.h"
#include "common/visible_keys.h"
#include "fa1_scalar_kernel.cuh"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {
namespace fa1_scalar {

constexpr int kBackwardThreads = 32;    // kernels 2 and 3: key rows or query rows per block
constexpr int kPreprocessThreads = 128;  // kernel 1: query rows per block

// The row stride of one thread's float32 rows in shared memory: the odd number
// head_dim or head_dim + 1, so column c of 32 consecutive rows lands in 32
// different banks.
FLASHLAB_HOST_DEVICE inline int backward_row_stride(int head_dim) { return head_dim | 1; }

// Index of (batch, head, row) in lse and softmax_d (row counts from the start
// of the batch entry; view.lse_row0 adds the varlen offset).
FLASHLAB_HOST_DEVICE inline int64_t lse_index(const AttentionBackwardParams& params,
                                              const SequenceView& view, int batch, int head,
                                              int row) {
  return batch * params.lse_batch_stride + head * params.lse_head_stride + view.lse_row0 + row;
}

// What one thread of each kernel does, as functions of its block and thread
// indices: the __global__ kernels below only hand them blockIdx, threadIdx and
// their shared-memory rows, and tests/cpu runs the same functions on the host
// for every (block, thread) of the grid.

// 1. D = rowsum(dout * out) of query row `row` of (batch, head), in float32.
template <typename Element>
FLASHLAB_HOST_DEVICE void preprocess_thread(const AttentionBackwardParams& params, int row,
                                            int head, int batch) {
  const BackwardSequenceView view = backward_sequence_view(params, batch);
  if (row >= view.seqlen_q) return;  // past this entry's rows (varlen, last block)

  const Element* dout = static_cast<const Element*>(params.dout) + view.dout_offset +
                        head * params.dout_head_stride + row * params.dout_row_stride;
  const Element* out = static_cast<const Element*>(params.out) + view.out_offset +
                       head * params.out_head_stride + row * params.out_row_stride;
  float d = 0.f;
  for (int c = 0; c < params.head_dim; ++c) d += to_float(dout[c]) * to_float(out[c]);
  params.softmax_d[lse_index(params, view, batch, head, row)] = d;
}

// 2. dK and dV of key row key_block * kBackwardThreads + thread of (batch,
// kv_head). my_k, my_v, my_dk, my_dv: this thread's head_dim floats each.
// kModified: apply params.modification (3. too).
template <typename Element, bool kModified = false>
FLASHLAB_HOST_DEVICE void dk_dv_thread(const AttentionBackwardParams& params, int key_block,
                                       int thread, int kv_head, int batch, float* my_k,
                                       float* my_v, float* my_dk, float* my_dv) {
  const int block_key0 = key_block * kBackwardThreads;
  const int key = block_key0 + thread;
  const int head_dim = params.head_dim;
  const float scale = params.softmax_scale;

  const BackwardSequenceView view = backward_sequence_view(params, batch);
  const int seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
  if (key >= seqlen_k) return;  // past this entry's keys (no sync anywhere: just leave)

  // k and v of this key as float32, the accumulators at 0.
  const Element* k = static_cast<const Element*>(params.k) + view.k_offset +
                     kv_head * params.k_head_stride + key * params.k_row_stride;
  const Element* v = static_cast<const Element*>(params.v) + view.v_offset +
                     kv_head * params.v_head_stride + key * params.v_row_stride;
  for (int c = 0; c < head_dim; ++c) {
    my_k[c] = to_float(k[c]);
    my_v[c] = to_float(v[c]);
    my_dk[c] = 0.f;
    my_dv[c] = 0.f;
  }

  // The query rows that see at least one key of this block; each thread then
  // skips the rows that do not see its own key (the forward's rule, row by row).
  const int block_key_last = (block_key0 + kBackwardThreads < seqlen_k ? block_key0 + kBackwardThreads
                                                                       : seqlen_k) - 1;
  const KeyRange block_rows = visible_rows_of_keys(block_key0, block_key_last, seqlen_q, seqlen_k,
                                                   params.window_left, params.window_right);
  const VisibleKeyMask mask{seqlen_q, seqlen_k, params.window_left, params.window_right};

  const int group = params.heads / params.kv_heads;  // query heads per kv head
  for (int head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    const auto modifier = score_modifier<kModified, /*kFastTanh=*/false>(params, batch, head, seqlen_q, seqlen_k);
    const Element* q = static_cast<const Element*>(params.q) + view.q_offset +
                       head * params.q_head_stride;
    const Element* dout = static_cast<const Element*>(params.dout) + view.dout_offset +
                          head * params.dout_head_stride;
#pragma unroll 1
    for (int row = block_rows.first; row <= block_rows.last; ++row) {
      if (!mask.visible(row).contains(key)) continue;  // masked: p = 0
      const float lse = params.lse[lse_index(params, view, batch, head, row)];
      // A row that saw no key adds nothing (with finite inputs a row that sees
      // this key has a finite LSE; the test keeps p from being exp(+inf)).
      if (lse == -INFINITY) continue;
      const float d = params.softmax_d[lse_index(params, view, batch, head, row)];
      const Element* q_row = q + row * params.q_row_stride;
      const Element* dout_row = dout + row * params.dout_row_stride;

      float score = 0.f;  // q_i . k_j
      float dp = 0.f;     // dout_i . v_j
      for (int c = 0; c < head_dim; ++c) {
        score += to_float(q_row[c]) * my_k[c];
        dp += to_float(dout_row[c]) * my_v[c];
      }
      float factor;  // ds'/ds: 1 unmodified
      score = modifier.modified(score, row, key, factor);
      const float p = expf(score * scale - lse);  // P_ij, as the forward normalized it
      const float ds = p * (dp - d) * factor;     // dS_ij (with respect to the raw score)
      for (int c = 0; c < head_dim; ++c) {
        my_dv[c] += p * to_float(dout_row[c]);
        my_dk[c] += ds * to_float(q_row[c]);
      }
    }
  }

  // cuda-gdb: dK and dV of this key, summed over its group's query heads, before the store.
  Element* dk = static_cast<Element*>(params.dk) + view.dk_offset +
                kv_head * params.dk_head_stride + key * params.dk_row_stride;
  Element* dv = static_cast<Element*>(params.dv) + view.dv_offset +
                kv_head * params.dv_head_stride + key * params.dv_row_stride;
  for (int c = 0; c < head_dim; ++c) {
    dk[c] = from_float<Element>(scale * my_dk[c]);
    dv[c] = from_float<Element>(my_dv[c]);
  }
}

// 3. dQ of query row row_block * kBackwardThreads + thread of (batch, head).
// my_q, my_dout, my_dq: this thread's head_dim floats each.
template <typename Element, bool kModified = false>
FLASHLAB_HOST_DEVICE void dq_thread(const AttentionBackwardParams& params, int row_block,
                                    int thread, int head, int batch, float* my_q, float* my_dout,
                                    float* my_dq) {
  const int block_row0 = row_block * kBackwardThreads;
  const int row = block_row0 + thread;
  const int kv_head = head / (params.heads / params.kv_heads);
  const int head_dim = params.head_dim;
  const float scale = params.softmax_scale;

  const BackwardSequenceView view = backward_sequence_view(params, batch);
  const int seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
  if (row >= seqlen_q) return;  // past this entry's rows (no sync anywhere: just leave)

  // q and dout of this row as float32, the accumulator at 0.
  const Element* q = static_cast<const Element*>(params.q) + view.q_offset +
                     head * params.q_head_stride + row * params.q_row_stride;
  const Element* dout = static_cast<const Element*>(params.dout) + view.dout_offset +
                        head * params.dout_head_stride + row * params.dout_row_stride;
  for (int c = 0; c < head_dim; ++c) {
    my_q[c] = to_float(q[c]);
    my_dout[c] = to_float(dout[c]);
    my_dq[c] = 0.f;
  }

  const float lse = params.lse[lse_index(params, view, batch, head, row)];
  const float d = params.softmax_d[lse_index(params, view, batch, head, row)];
  const auto modifier = score_modifier<kModified, /*kFastTanh=*/false>(params, batch, head, seqlen_q, seqlen_k);
  const KeyRange my_keys = VisibleKeyMask{seqlen_q, seqlen_k, params.window_left, params.window_right}.visible(row);
  // The keys at least one row of this block sees; each thread skips the ones it does not.
  const int block_row_last = (block_row0 + kBackwardThreads < seqlen_q ? block_row0 + kBackwardThreads
                                                                       : seqlen_q) - 1;
  const KeyRange block_keys = visible_keys_of_rows(block_row0, block_row_last, seqlen_q, seqlen_k,
                                                   params.window_left, params.window_right);

  const Element* k = static_cast<const Element*>(params.k) + view.k_offset +
                     kv_head * params.k_head_stride;
  const Element* v = static_cast<const Element*>(params.v) + view.v_offset +
                     kv_head * params.v_head_stride;
  if (lse != -INFINITY) {  // a row that saw no key keeps dQ = 0
#pragma unroll 1
    for (int key = block_keys.first; key <= block_keys.last; ++key) {
      if (!my_keys.contains(key)) continue;  // masked: p = 0
      const Element* k_row = k + key * params.k_row_stride;
      const Element* v_row = v + key * params.v_row_stride;
      float score = 0.f;  // q_i . k_j
      float dp = 0.f;     // dout_i . v_j
      for (int c = 0; c < head_dim; ++c) {
        score += my_q[c] * to_float(k_row[c]);
        dp += my_dout[c] * to_float(v_row[c]);
      }
      float factor;
      score = modifier.modified(score, row, key, factor);
      const float p = expf(score * scale - lse);
      const float ds = p * (dp - d) * factor;
      for (int c = 0; c < head_dim; ++c) my_dq[c] += ds * to_float(k_row[c]);
    }
  }

  // cuda-gdb: dQ of this row before the store.
  Element* dq = static_cast<Element*>(params.dq) + view.dq_offset + head * params.dq_head_stride +
                row * params.dq_row_stride;
  for (int c = 0; c < head_dim; ++c) dq[c] = from_float<Element>(scale * my_dq[c]);
}

// The kernels: grid x over row (or key) blocks, y over heads (kernel 2: kv
// heads), z over the batch.
template <typename Element>
__global__ void __launch_bounds__(kPreprocessThreads)
    fa1_scalar_backward_preprocess_kernel(const AttentionBackwardParams params) {
  preprocess_thread<Element>(params, blockIdx.x * kPreprocessThreads + threadIdx.x, blockIdx.y,
                             blockIdx.z);
}

template <typename Element, bool kModified>
__global__ void __launch_bounds__(kBackwardThreads)
    fa1_scalar_backward_dk_dv_kernel(const AttentionBackwardParams params) {
  // Four rows per thread: [k | v | dk | dv], each kBackwardThreads rows of `stride` floats.
  extern __shared__ float shared[];
  const int stride = backward_row_stride(params.head_dim);
  float* my_rows = shared + threadIdx.x * stride;
  const int array = kBackwardThreads * stride;
  dk_dv_thread<Element, kModified>(params, blockIdx.x, threadIdx.x, blockIdx.y, blockIdx.z, my_rows,
                                   my_rows + array, my_rows + 2 * array, my_rows + 3 * array);
}

template <typename Element, bool kModified>
__global__ void __launch_bounds__(kBackwardThreads)
    fa1_scalar_backward_dq_kernel(const AttentionBackwardParams params) {
  // Three rows per thread: [q | dout | dq], each kBackwardThreads rows of `stride` floats.
  extern __shared__ float shared[];
  const int stride = backward_row_stride(params.head_dim);
  float* my_rows = shared + threadIdx.x * stride;
  const int array = kBackwardThreads * stride;
  dq_thread<Element, kModified>(params, blockIdx.x, threadIdx.x, blockIdx.y, blockIdx.z, my_rows,
                                my_rows + array, my_rows + 2 * array);
}

template <typename Element>
void backward_launch_with_element(const AttentionBackwardParams& params) {
  const auto stream = static_cast<cudaStream_t>(params.stream);
  const int stride = backward_row_stride(params.head_dim);
  const bool modified = params.modification.per_element();  // kernels 2 and 3's kModified (sinks alone: plain)

  // Grids: x over rows (the longest sequence of a varlen batch; shorter
  // entries' blocks return at once), y over heads, z over the batch. A grid
  // with no rows is not launched: with no query rows there is nothing to
  // preprocess and no dQ, and kernel 2 still writes dK = dV = 0.
  const int query_blocks_pre = (params.seqlen_q + kPreprocessThreads - 1) / kPreprocessThreads;
  if (query_blocks_pre > 0) {
    const dim3 grid(query_blocks_pre, params.heads, params.batch);
    fa1_scalar_backward_preprocess_kernel<Element>
        <<<grid, kPreprocessThreads, 0, stream>>>(params);
    FLASHLAB_CHECK_LAUNCH("fa1_scalar backward preprocess", params);
  }

  const int key_blocks = (params.seqlen_k + kBackwardThreads - 1) / kBackwardThreads;
  if (key_blocks > 0) {
    const int shared_bytes = static_cast<int>(sizeof(float)) * 4 * kBackwardThreads * stride;
    auto kernel = modified ? fa1_scalar_backward_dk_dv_kernel<Element, true>
                           : fa1_scalar_backward_dk_dv_kernel<Element, false>;
    // Above 48 KB a kernel must opt in to the larger dynamic shared memory limit.
    allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
    const dim3 grid(key_blocks, params.kv_heads, params.batch);
    kernel<<<grid, kBackwardThreads, shared_bytes, stream>>>(params);
    FLASHLAB_CHECK_LAUNCH("fa1_scalar backward dk/dv", params);
  }

  const int query_blocks = (params.seqlen_q + kBackwardThreads - 1) / kBackwardThreads;
  if (query_blocks > 0) {
    const int shared_bytes = static_cast<int>(sizeof(float)) * 3 * kBackwardThreads * stride;
    auto kernel = modified ? fa1_scalar_backward_dq_kernel<Element, true>
                           : fa1_scalar_backward_dq_kernel<Element, false>;
    allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
    const dim3 grid(query_blocks, params.heads, params.batch);
    kernel<<<grid, kBackwardThreads, shared_bytes, stream>>>(params);
    FLASHLAB_CHECK_LAUNCH("fa1_scalar backward dq", params);
  }
}

// The KernelVariant hooks (fa1_scalar_backward.cu).
std::string backward_unsupported_reason(const AttentionBackwardParams& params);
// softmax_d: one float per (batch, head, query row), laid out like lse.
size_t backward_workspace_bytes(const AttentionBackwardParams& params);
// {kBackwardThreads, kBackwardThreads}: the dQ kernel's query rows and the
// dK/dV kernel's key rows per block, for the harness's reports.
TileShape backward_tile_shape(const AttentionBackwardParams& params);
void backward_launch(const AttentionBackwardParams& params);

}  // namespace fa1_scalar
}  // namespace flashlab
