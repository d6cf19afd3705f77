// The tile-state trace, device side: where a kernel's traced build writes one
// row's online-softmax state after one key tile (AttentionParams::trace,
// laid out [batch][head][row][key_tile], float32; the harness's diff is
// src/harness/tile_trace.cpp). Every tracing kernel calls record_tile_state
// once per (row, key tile) it visits, from plain named locals, on the line
// after a comment "cuda-gdb: the online-softmax state ..." (tests/debug sets
// its breakpoint there), so the values cuda-gdb prints are the ones stored.
#pragma once

#include <cstdint>

#include "flashlab/kernel_params.h"

namespace flashlab {

// running_max: m in natural-log units (a raw-score max times softmax_scale);
// running_sum: the row's whole l (every thread's share added), relative to exp(m).
// row: within the batch entry's sequence.
__device__ __forceinline__ void record_tile_state(const AttentionParams& p, int batch, int head,
                                                  int row, int key_tile, float running_max,
                                                  float running_sum) {
  const int64_t index = ((static_cast<int64_t>(batch) * p.heads + head) * p.seqlen_q + row) *
                            p.trace.num_key_tiles + key_tile;
  p.trace.row_max[index] = running_max;
  p.trace.row_sum[index] = running_sum;
}

// The sum over the 4 lanes of a quad (lane ^ 1, lane ^ 2): in an m16n8 MMA
// accumulator the 4 threads of a quad hold one row's columns, so this turns
// per-thread partial row sums into the row's. The whole warp must call it.
__device__ __forceinline__ float quad_sum(float partial) {
  partial += __shfl_xor_sync(0xffffffffu, partial, 1);
  partial += __shfl_xor_sync(0xffffffffu, partial, 2);
  return partial;
}

}  // namespace flashlab
