// The online-softmax update rule, written once for every forward kernel
// (flash-attn's softmax.h idea). Per query row a kernel keeps
//   m  the running max of the scores seen so far (score units, before `scale`),
//      -inf while every key so far was masked,
//   l  the running sum of exp(scale * s - offset(m)) over those keys,
//   O  the unnormalized output accumulator, on the same footing as l.
// For each key tile: the new max m' = max(m, max of the tile), then
//   c = online_softmax_rescale(m, m', scale, offset, exp)   (m becomes m')
//   l = l * c + sum_j p_j,  O = O * c + sum_j p_j v_j,  p_j = softmax_probability(s_j, scale, offset, exp)
// and at the end online_softmax_finish gives 1/l and the LSE, 0 and -inf for a
// row that saw no key (after row_sum_as_pv_saw_it in kernels whose P V takes
// p in the element type).
//
// `scale` multiplies scores into the exponent's units and `exp` is the matching
// exponential: 1 and expf for scores already multiplied by softmax_scale (fa1),
// softmax_scale * log2(e) and ex2.approx for raw scores (fa2, fa3). Host and
// device; the reductions across threads (shuffles) stay with the kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "flashlab/kernel_params.h"

namespace flashlab {

// log2(e): kernels that exponentiate with ex2 scale raw scores by softmax_scale * kLog2e.
inline constexpr float kLog2e = 1.4426950408889634f;

// What the exponent subtracts for a row whose max is row_max: scale * row_max,
// or 0 while nothing is visible (row_max -inf), so that masked scores give
// exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
FLASHLAB_HOST_DEVICE inline float softmax_offset(float row_max, float scale) {
  return row_max == -INFINITY ? 0.f : row_max * scale;
}

// The row's max moves from row_max to new_max (>= row_max). Sets row_max to
// new_max and offset to softmax_offset(new_max, scale), and returns the factor
// that rescales the old l and O: exp(scale * old max - offset), 0 when the old
// max was -inf (nothing to rescale).
template <class Exp>
FLASHLAB_HOST_DEVICE inline float online_softmax_rescale(float& row_max, float new_max, float scale,
                                                         float& offset, Exp exp) {
  offset = softmax_offset(new_max, scale);
  const float correction = exp(row_max * scale - offset);
  row_max = new_max;
  return correction;
}

// One unnormalized probability: exp(scale * score - offset); 0 for a masked (-inf) score.
template <class Exp>
FLASHLAB_HOST_DEVICE inline float softmax_probability(float score, float scale, float offset, Exp exp) {
  return exp(fmaf(score, scale, -offset));
}

// The row sum l with the max's own term as O = P V saw it: P V takes each p
// rounded to the element type, l sums it in float32, and the max's p is not
// exactly 1 (exp of the rounding of offset in the fused exponent, up to 2e-3
// for scores of 4e4 in exponent units). In a nearly one-hot row (huge scores)
// that term is all there is, and the mismatch made the output one fp16 ulp
// off where torch's math path is exact (LargeScores: 3 of 48 fresh-seed runs
// failed, fa2 and fa3, H100, session 17). The max's term recomputed here is
// bitwise the kernel's (same operands, same exp); a few instructions a row.
// Exact exponents for every score, exp(scale * (s - m)), cost fa3 2-6%.
template <typename Element, class Exp>
FLASHLAB_HOST_DEVICE inline float row_sum_as_pv_saw_it(float row_sum, float row_max, float scale, Exp exp) {
  if (row_max == -INFINITY) return row_sum;
  const float max_term = softmax_probability(row_max, scale, softmax_offset(row_max, scale), exp);
  float rounded;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    rounded = __bfloat162float(__float2bfloat16_rn(max_term));
  } else {
    rounded = __half2float(__float2half_rn(max_term));
  }
  return row_sum - max_term + rounded;
}

struct SoftmaxResult {
  float inverse_sum;  // multiplies O: 1 / l, or 0 for a row that saw no key (O = 0)
  float lse;          // natural-log LSE: softmax_scale * m + log(l), or -inf
};

// After the last tile (row_sum reduced over the threads that share the row).
// max_to_natural turns m into natural-log units: softmax_scale for raw-score
// maxima, 1 for maxima of scaled scores.
FLASHLAB_HOST_DEVICE inline SoftmaxResult online_softmax_finish(float row_max, float row_sum,
                                                                float max_to_natural) {
  const bool any_visible = row_sum > 0.f;
  return {any_visible ? 1.f / row_sum : 0.f,
          any_visible ? row_max * max_to_natural + logf(row_sum) : -INFINITY};
}

}  // namespace flashlab
