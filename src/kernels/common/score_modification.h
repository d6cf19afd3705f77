// Score modifications (issue 33) as one policy for every kernel, flash-attn's
// definitions, the same as the harness reference's (harness/reference.h,
// ScoreModification). On the scaled score s * softmax_scale of row i, key j:
//   softcap > 0:   -> softcap * tanh(s * softmax_scale / softcap)
//   ALiBi slope:   -> ... - slope * |i + seqlen_k - seqlen_q - j|
//   then the mask, then the softmax, whose denominator also holds exp(sink).
//
// ScoreModifier keeps the kernels' units: it maps a raw score s to a raw-score
// equivalent s' with s' * softmax_scale = the modified logit, so the online
// softmax (online_softmax.h: scale = softmax_scale or softmax_scale * log2(e))
// runs unchanged on s'. A kernel applies `modified` to each S element before
// the mask (as the mask policy's apply_row / apply_column do) and starts each
// row from `first_row_state` (the sink as the row's first logit); the backward
// multiplies dS = P (dP - D) by `gradient_factor` (ds'/ds: 1 - tanh^2 under
// softcap, 1 otherwise). Without a modification the kernels keep their code:
// the flags are template arguments and every member is a no-op then.
// Not used by a kernel yet (session 22): the policy and its CPU test against
// the reference (tests/cpu/test_score_modifier.cpp) come first.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "flashlab/kernel_params.h"

namespace flashlab {

template <bool kSoftcap, bool kAlibi, bool kSink>
struct ScoreModifier {
  static constexpr bool kAny = kSoftcap || kAlibi || kSink;
  float softcap_score = 0.f;     // softcap / softmax_scale: s' = softcap_score * tanh(s / softcap_score)
  float alibi_score_slope = 0.f;  // slope / softmax_scale
  int diagonal = 0;               // seqlen_k - seqlen_q of the sequence
  float sink_score = -INFINITY;   // sink / softmax_scale

  // s' for raw score s of row `row`, key `key` (both within the sequence).
  FLASHLAB_HOST_DEVICE float modified(float s, int row, int key) const {
    if constexpr (kSoftcap) s = softcap_score * tanhf(s / softcap_score);
    if constexpr (kAlibi) s -= alibi_score_slope * static_cast<float>(abs(row + diagonal - key));
    return s;
  }
  // ds'/ds at raw score s (the backward's dS factor).
  FLASHLAB_HOST_DEVICE float gradient_factor(float s) const {
    if constexpr (kSoftcap) {
      const float t = tanhf(s / softcap_score);
      return 1.f - t * t;
    } else {
      return 1.f;
    }
  }
  // A row's online-softmax state before its first key: (max, sum) = (sink', 1)
  // with a sink (exp(scale * sink' - offset(sink')) = 1), else (-inf, 0).
  FLASHLAB_HOST_DEVICE void first_row_state(float& row_max, float& row_sum) const {
    if constexpr (kSink) {
      row_max = sink_score;
      row_sum = 1.f;
    } else {
      row_max = -INFINITY;
      row_sum = 0.f;
    }
  }
};

// The modifier of (batch, head) of a problem: params.modification's values,
// read where the kernel runs (device pointers in a kernel, host ones in tests).
template <bool kSoftcap, bool kAlibi, bool kSink>
FLASHLAB_HOST_DEVICE inline ScoreModifier<kSoftcap, kAlibi, kSink> score_modifier(
    const AttentionParams& params, int batch, int head, int seqlen_q, int seqlen_k) {
  ScoreModifier<kSoftcap, kAlibi, kSink> modifier;
  const ScoreModificationParams& m = params.modification;
  if constexpr (kSoftcap) modifier.softcap_score = m.softcap / params.softmax_scale;
  if constexpr (kAlibi) {
    modifier.alibi_score_slope = m.alibi_slopes[batch * m.alibi_batch_stride + head] / params.softmax_scale;
    modifier.diagonal = seqlen_k - seqlen_q;
  }
  if constexpr (kSink) modifier.sink_score = m.sinks[head] / params.softmax_scale;
  return modifier;
}

}  // namespace flashlab
