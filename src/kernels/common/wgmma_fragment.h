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

#include <cuda_fp8.h>

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

// The e4m3 RS A fragment of k32 step kk (four bytes a register): register r
// holds row g (r even) or g + 8 (r odd) at the keys of accumulator tiles
// 4kk + 2 (r / 2) and the one after, two of each. That is the k32 fragment's
// byte order (bytes 4t .. 4t + 3 of each 16 columns for quad thread t) once the
// keys are permuted within every 16 as fa3_wgmma_sm90's fp8_vt_key_of_position
// says (the V^T operand is stored in that order), so no value changes thread.
// Values saturate at e4m3's largest finite, 448.
template <int kSteps>
__device__ __forceinline__ void accumulator_to_fp8_a_fragments(const float (&accumulator)[kSteps * 16],
                                                               uint32_t (&fragments)[kSteps][4]) {
  const auto two = [](float lo, float hi) {
    return static_cast<uint32_t>(__nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3));
  };
#pragma unroll
  for (int kk = 0; kk < kSteps; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int first = (4 * kk + 2 * (r / 2)) * 4 + (r % 2) * 2;  // tile 4kk + 2(r/2), row half r % 2
      fragments[kk][r] = two(accumulator[first], accumulator[first + 1]) |
                         two(accumulator[first + 4], accumulator[first + 5]) << 16;
    }
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
