// Merging partial attention results by their log-sum-exp: the rule the
// split-KV combine (fa2_mma_sm80_splitkv_kernel.cuh) and the ring's merge
// (attention_merge/) share. Parts over disjoint key sets with LSEs lse_i give
// lse = log(sum_i exp(lse_i)) and out = sum_i exp(lse_i - lse) out_i; a part
// that saw no key (lse_i = -inf, out_i = 0) weighs 0, and when no part saw a
// key the row keeps out 0 and lse -inf (a fully masked row, never NaN).
#pragma once

#include <math.h>

namespace flashlab {

// exp(part_lse - reference), 0 for a part that saw no key. With the parts'
// maximum as the reference it is a term of the sum; with the merged LSE, the
// part's weight.
__device__ __forceinline__ float lse_part_weight(float part_lse, float reference) {
  return part_lse == -INFINITY ? 0.f : expf(part_lse - reference);
}

// The merged LSE from the parts' maximum and the sum of their terms.
__device__ __forceinline__ float merged_lse(float max_lse, float sum_of_terms) {
  return sum_of_terms > 0.f ? max_lse + logf(sum_of_terms) : -INFINITY;
}

}  // namespace flashlab
