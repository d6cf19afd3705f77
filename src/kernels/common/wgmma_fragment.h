// wgmma register fragments, written once for the Hopper kernels: an m64nN
// float32 accumulator (the m16n8 per-warp pattern of
// common/mma_accumulator_layout.h, N / 8 column tiles) as the A operand of a
// register-sourced wgmma (RS), and the position of a pipeline ring's slot.
//
// The RS A fragment of k16 step kk is the accumulator's columns 16 kk .. 16 kk
// + 15: registers {tile 2kk rows g, tile 2kk rows g + 8, tile 2kk + 1 rows g,
// tile 2kk + 1 rows g + 8}, two 16-bit values each, i.e. the accumulator's
// floats 8 kk .. 8 kk + 7 in order, packed in pairs. The forward's P (O += P V)
// and the backward's P^T and dS^T (dV += P^T dO, dK += dS^T Q) go this way.
#pragma once

#include <cstdint>

#include "common/ptx_sm80.h"  // pack2

namespace flashlab::sm90 {

template <typename Element, int kSteps>
__device__ __forceinline__ void accumulator_to_a_fragments(const float (&accumulator)[kSteps * 8],
                                                           uint32_t (&fragments)[kSteps][4]) {
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      fragments[kk][r] = sm80::pack2<Element>(accumulator[kk * 8 + r * 2], accumulator[kk * 8 + r * 2 + 1]);
}

// Iteration `iteration` of a ring of kStages slots: its slot, and the parity
// of the phase its mbarriers complete (flipping each time the ring wraps).
// (The backward's rings use it; the forward's own arithmetic stays: written
// with RingSlot, its SASS changed beyond register names, untimed, session 21.)
template <int kStages>
struct RingSlot {
  int stage;
  uint32_t phase;
  __device__ __forceinline__ explicit RingSlot(uint32_t iteration)
      : stage(static_cast<int>(iteration % kStages)), phase((iteration / kStages) & 1) {}
};

}  // namespace flashlab::sm90
