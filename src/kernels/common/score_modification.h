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
// runs unchanged on s'. How a kernel uses it:
//   - apply_row / apply_column on every S fragment before the mask (the
//     mask policy's fragment convention, mask.h); or apply_row_shifted, which
//     leaves ALiBi's row-constant part to the caller's max and offset (fa3's
//     forward);
//   - each row's running max starts at initial_row_max() (the sink, so the
//     rescaling already counts it) and its sum at 0; after the last tile,
//     add_sink_term(row_sum, row_max, ...) once per row (kernels that keep
//     per-thread partial sums add it after their reduction);
//   - the backward recomputes s' the same way, and multiplies dS = P (dP - D)
//     by ds'/ds (1 - tanh^2 under softcap, else 1): gradient_factor_of(s',
//     row, key) recovers it from s' itself, so no array of factors stays live
//     across the dP GEMM (that cost fa3's head_dim 64 backward 356 bytes of
//     spills). Sinks alone need nothing per element in the backward
//     (ScoreModificationParams::per_element: the LSE has them). The sinks' gradient,
//     dsink[h] = -sum over rows of exp(sink - LSE) D, is
//     backward_sink_gradient_kernel's (backward_dq.cuh).
//
// One kernel instantiation takes every combination: kEnabled is the template
// flag (false: every member is a no-op and the kernels' plain code is
// unchanged), and within it the modifications are values (softcap 0, slope
// 0, sink -inf: off), so a kernel builds twice, not eight times. A forward
// may add a sinks-only build (kPerElement false: no per-element code at
// all; ModifierKind::sinks): with the per-element code present but off, a
// sinks-only fa3 forward ran 3-9% slower than the plain one (H100, session 23).
// kFastTanh: tanh.approx on the device (relative error about 2^-11, below the
// 16-bit inputs' own; flash-attn does the same); fp32 kernels pass false.
// (tanh.approx.f16x2 would not halve the MUFU work: on sm_90 it is two
// MUFU.TANH.F16, cuobjdump, session 31.)
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "common/online_softmax.h"  // softmax_offset
#include "flashlab/kernel_params.h"

namespace flashlab {

template <bool kFast>
FLASHLAB_HOST_DEVICE inline float score_tanh(float x) {
#ifdef __CUDA_ARCH__
  if constexpr (kFast) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  }
#endif
  return tanhf(x);
}

// The window a fixed row max keeps P in: P >= 2^-110 (normal in float32 and
// bf16, and P * v stays normal for |v| >= 2^-16) and P <= 2^64 (O and l sum
// up to 2^31 keys of P * v in float32 with room to spare). fix_row_max
// needs the scores' range to fit: 2 * bound * scale <= 110 + 64.
inline constexpr float kFixedMaxExponentFloor = 110.f;
inline constexpr float kFixedMaxExponentCeiling = 64.f;

template <bool kEnabled, bool kFastTanh = false, bool kPerElement = true>
struct ScoreModifier {
  static constexpr bool kScores = kEnabled && kPerElement;  // softcap / ALiBi code present
  float softcap_score = 0.f;     // softcap / softmax_scale (0: off): s' = softcap_score * tanh(s / softcap_score)
  float softcap_inverse = 0.f;   // 1 / softcap_score
  float alibi_score_slope = 0.f;  // slope / softmax_scale (0: off)
  int diagonal = 0;               // seqlen_k - seqlen_q of the sequence
  float sink_score = -INFINITY;   // sink / softmax_scale (-inf: no sink)
  float score_unit = 1.f;         // in_tanh_units(): softcap_score (the scores are s' / score_unit)

  // s' for raw score s of row `row`, key `key` (both within the sequence);
  // factor = ds'/ds.
  FLASHLAB_HOST_DEVICE float modified(float s, int row, int key, float& factor) const {
    factor = 1.f;
    if constexpr (kScores) {
      if (softcap_score != 0.f) {
        const float t = score_tanh<kFastTanh>(s * softcap_inverse);
        s = softcap_score * t;
        factor = 1.f - t * t;
      }
      s -= alibi_score_slope * static_cast<float>(abs(row + diagonal - key));
    }
    return s;
  }
  FLASHLAB_HOST_DEVICE float modified(float s, int row, int key) const {
    float factor;
    return modified(s, row, key, factor);
  }
  // ds'/ds from s' of row `row`, key `key` itself: tanh = (s' + ALiBi's
  // bias) / softcap_score. 0 for a masked s' = -inf (1 - inf would be -inf,
  // and P = 0 times it NaN).
  FLASHLAB_HOST_DEVICE float gradient_factor_of(float modified_s, int row, int key) const {
    if constexpr (kScores) {
      if (softcap_score != 0.f) {
        return softcap_gradient_factor_of(modified_s +
                                          alibi_score_slope * static_cast<float>(abs(row + diagonal - key)));
      }
    }
    return 1.f;
  }
  // The same for softcap without ALiBi (has_alibi() false: s' is
  // softcap_score * tanh alone), three instructions an element instead of
  // eight, for a kernel that branches on has_alibi() once per tile. (Keeping
  // t instead of s', which would save an FMUL more, made ptxas spill 408
  // bytes in fa3's head_dim 64 backward, session 31.)
  FLASHLAB_HOST_DEVICE float softcap_gradient_factor_of(float modified_s) const {
    const float t = modified_s * softcap_inverse;
    return fmaxf(1.f - t * t, 0.f);
  }
  // Per-element work, applied to whole fragments (below): each modification
  // that is on runs as its own loop behind a uniform branch (a sinks-only
  // problem pays nothing per element), and ALiBi's |distance| is one float
  // per fragment row minus a constant per element (FADD and an FFMA with |.|).
  FLASHLAB_HOST_DEVICE bool has_softcap() const { return kScores && softcap_score != 0.f; }
  FLASHLAB_HOST_DEVICE bool has_alibi() const { return kScores && alibi_score_slope != 0.f; }

  // A forward that takes the softmax of s' / softcap_score under softcap
  // (tanh units): apply_row<..., kTanhUnits = true> writes t = tanh(...)
  // where it wrote softcap_score * t (one FMUL an element less), ALiBi's
  // slope and the sink come divided by softcap_score, and the kernel
  // multiplies its exponent's scale by score_unit and takes the LSE with
  // natural_scale(softmax_scale). Without softcap, the same modifier.
  FLASHLAB_HOST_DEVICE ScoreModifier in_tanh_units() const {
    ScoreModifier units = *this;
    if (has_softcap()) {
      units.score_unit = softcap_score;
      units.alibi_score_slope = alibi_score_slope * softcap_inverse;
      units.sink_score = sink_score * softcap_inverse;
    }
    return units;
  }
  // The largest score softcap allows, in the modifier's units: softcap_score,
  // or 1 in tanh units.
  FLASHLAB_HOST_DEVICE float score_bound() const { return softcap_score / score_unit; }
  // Softcap alone bounds every score to [-score_bound(), score_bound()], so a
  // kernel may fix each row's max at a constant instead of tracking it (no
  // max reduction, no rescaling of O and l): with the max at fixed_row_max(),
  // P = exp2(scale * (s - max)) stays within [2^-kFixedMaxExponentFloor,
  // 2^kFixedMaxExponentCeiling] while 2 * bound * scale fits that window,
  // i.e. softcap <= 60 (Gemma 2's 50 included). Not with ALiBi (scores far
  // below the bound) or sinks (a logit above it), nor for fp16 P (its range
  // is 2^-24 .. 2^16). `scale` is the exponent's (base 2 in fa3). The row
  // max is then not a score a P element carries.
  FLASHLAB_HOST_DEVICE bool fix_row_max(float scale) const {
    return kScores && softcap_score != 0.f && alibi_score_slope == 0.f && sink_score == -INFINITY &&
           2.f * score_bound() * scale <= kFixedMaxExponentFloor + kFixedMaxExponentCeiling;
  }
  // The fixed max (score units): the bound itself while 2^(-2 * bound *
  // scale) is above the floor (P <= 1, as a tracked max gives), else the
  // value that puts the smallest P on the floor (the largest P then goes up
  // to 2^(2 * bound * scale - floor) <= the ceiling).
  FLASHLAB_HOST_DEVICE float fixed_row_max(float scale) const {
    return fminf(score_bound(), kFixedMaxExponentFloor / scale - score_bound());
  }
  // score_unit, 1 at compile time without per-element code.
  FLASHLAB_HOST_DEVICE float unit() const { return kScores ? score_unit : 1.f; }
  // The factor from the kernel's score units to natural-log units.
  FLASHLAB_HOST_DEVICE float natural_scale(float softmax_scale) const { return softmax_scale * unit(); }

  // Fragments as mask.h's apply_row / apply_column name them: row `row`'s
  // elements score(n, i) of key first_key + n * 8 + lane_key + i, replaced by s'.
  template <int kTiles, int kPerTile = 2, bool kTanhUnits = false, class Score>
  FLASHLAB_HOST_DEVICE void apply_row(int row, int first_key, int lane_key, Score&& score) const {
    // distance = row + diagonal - key = (row + diagonal - first_key - lane_key) - (n * 8 + i)
    apply<kTiles, kPerTile, kTanhUnits>(static_cast<float>(row + diagonal - first_key - lane_key), -1.f, score);
  }
  // apply_row with ALiBi's row-constant part left out where a lane's keys all
  // lie on one side of the row's diagonal key (distance base - c for the
  // lane's key offsets c = n * 8 + i, all >= 0 or all <= 0): |distance| is
  // then +-(base - c), one FFMA an element (score += +-slope * c, c an
  // immediate) instead of two. Returns the shift the lane left out (s' =
  // score + shift): the caller adds it to the lane's max and takes it out of
  // the exponent's offset. 0 on lanes whose keys straddle the diagonal
  // (apply_row's code there).
  template <int kTiles, int kPerTile = 2, bool kTanhUnits = false, class Score>
  FLASHLAB_HOST_DEVICE float apply_row_shifted(int row, int first_key, int lane_key, Score&& score) const {
    if constexpr (kScores) {
      const float base = static_cast<float>(row + diagonal - first_key - lane_key);
      apply_softcap<kTiles, kPerTile, kTanhUnits>(score);
      if (alibi_score_slope != 0.f) {
        constexpr float kLastOffset = (kTiles - 1) * 8 + kPerTile - 1;
        if (base >= kLastOffset || base <= 0.f) {
          const float signed_slope = base > 0.f ? alibi_score_slope : -alibi_score_slope;
#pragma unroll
          for (int n = 0; n < kTiles; ++n)
#pragma unroll
            for (int i = 0; i < kPerTile; ++i) score(n, i) += signed_slope * static_cast<float>(n * 8 + i);
          return -signed_slope * base;
        }
        apply_alibi<kTiles, kPerTile>(base, -1.f, score);
      }
    }
    return 0.f;
  }
  // The transposed fragment (the backward's S^T: a thread owns keys, its
  // columns are rows first_row + n * 8 + lane_row + i).
  template <int kTiles, int kPerTile = 2, class Score>
  FLASHLAB_HOST_DEVICE void apply_column(int key, int first_row, int lane_row, Score&& score) const {
    apply<kTiles, kPerTile>(static_cast<float>(first_row + lane_row + diagonal - key), 1.f, score);
  }

 private:
  // Element (n, i)'s distance is base + direction * (n * 8 + i).
  template <int kTiles, int kPerTile, bool kTanhUnits = false, class Score>
  FLASHLAB_HOST_DEVICE void apply(float base, float direction, Score&& score) const {
    if constexpr (kScores) {
      apply_softcap<kTiles, kPerTile, kTanhUnits>(score);
      if (alibi_score_slope != 0.f) apply_alibi<kTiles, kPerTile>(base, direction, score);
    }
  }
  template <int kTiles, int kPerTile, bool kTanhUnits, class Score>
  FLASHLAB_HOST_DEVICE void apply_softcap(Score& score) const {
    if (softcap_score != 0.f) {
#pragma unroll
      for (int n = 0; n < kTiles; ++n)
#pragma unroll
        for (int i = 0; i < kPerTile; ++i) {
          const float t = score_tanh<kFastTanh>(score(n, i) * softcap_inverse);
          score(n, i) = kTanhUnits ? t : softcap_score * t;
        }
    }
  }
  template <int kTiles, int kPerTile, class Score>
  FLASHLAB_HOST_DEVICE void apply_alibi(float base, float direction, Score& score) const {
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int i = 0; i < kPerTile; ++i)
        score(n, i) -= alibi_score_slope * fabsf(base + direction * static_cast<float>(n * 8 + i));
  }

 public:
  // A row's running max before its first key: the sink (s' units), else -inf.
  FLASHLAB_HOST_DEVICE float initial_row_max() const { return kEnabled ? sink_score : -INFINITY; }
  // The sink's term of the row sum for a row whose final max is row_max
  // (exp(scale * sink' - offset), on the footing of the kernel's P); 0 without.
  template <class Exp>
  FLASHLAB_HOST_DEVICE float sink_term(float row_max, float scale, Exp exp) const {
    if constexpr (kEnabled) {
      if (sink_score != -INFINITY) return exp(sink_score * scale - softmax_offset(row_max, scale));
    }
    return 0.f;
  }
  // row_sum += sink_term(...): nothing at all without kEnabled (x + 0.f is an add).
  template <class Exp>
  FLASHLAB_HOST_DEVICE void add_sink_term(float& row_sum, float row_max, float scale, Exp exp) const {
    if constexpr (kEnabled) row_sum += sink_term(row_max, scale, exp);
  }
  // True when the row's max is the sink's logit, which no P element carries
  // (row_sum_as_pv_saw_it's correction is then not the kernel's to make).
  FLASHLAB_HOST_DEVICE bool max_is_sink(float row_max) const { return kEnabled && row_max == sink_score; }
};

// The modifier of (batch, head) of a problem: params.modification's values,
// read where the kernel runs (device pointers in a kernel, host ones in tests).
template <bool kEnabled, bool kFastTanh = false, bool kPerElement = true>
FLASHLAB_HOST_DEVICE inline ScoreModifier<kEnabled, kFastTanh, kPerElement> score_modifier(
    const AttentionParams& params, int batch, int head, int seqlen_q, int seqlen_k) {
  ScoreModifier<kEnabled, kFastTanh, kPerElement> modifier;
  if constexpr (kEnabled) {
    const ScoreModificationParams& m = params.modification;
    if (kPerElement && m.softcap != 0.f) {
      modifier.softcap_score = m.softcap / params.softmax_scale;
      modifier.softcap_inverse = params.softmax_scale / m.softcap;
    }
    if (kPerElement && m.alibi_slopes != nullptr)
      modifier.alibi_score_slope = m.alibi_slopes[batch * m.alibi_batch_stride + head] / params.softmax_scale;
    modifier.diagonal = seqlen_k - seqlen_q;
    if (m.sinks != nullptr) modifier.sink_score = m.sinks[head] / params.softmax_scale;
  }
  return modifier;
}

// Which modification code a forward instantiation carries: none (the plain
// kernel), sinks (per row only), all; modifier_kind picks it for a problem.
// softcap_fixed_max: all's code for softcap alone with each row's max fixed
// at a constant at compile time (ScoreModifier::fix_row_max; a kernel that
// offers it picks it where softcap_fixed_max_allowed says so). Its own
// instantiation, so that ALiBi and larger caps keep all's code: behind a
// run-time branch in all's, ALiBi cost 3-6% more (H200, session 31).
enum class ModifierKind { none, sinks, all, softcap_fixed_max };
FLASHLAB_HOST_DEVICE inline ModifierKind modifier_kind(const ScoreModificationParams& m) {
  return m.per_element() ? ModifierKind::all : m.any() ? ModifierKind::sinks : ModifierKind::none;
}
// The host's form of fix_row_max's rule (the same in tanh units, where the
// bound is 1 and the exponent's scale softcap * log2(e)).
inline bool softcap_fixed_max_allowed(const ScoreModificationParams& m) {
  return m.softcap > 0.f && m.alibi_slopes == nullptr && m.sinks == nullptr &&
         2.f * m.softcap * kLog2e <= kFixedMaxExponentFloor + kFixedMaxExponentCeiling;
}
constexpr bool kind_per_element(ModifierKind kind) {
  return kind == ModifierKind::all || kind == ModifierKind::softcap_fixed_max;
}
template <ModifierKind kKind, bool kFastTanh>
using KindModifier = ScoreModifier<kKind != ModifierKind::none, kFastTanh, kind_per_element(kKind)>;
template <ModifierKind kKind, bool kFastTanh>
FLASHLAB_HOST_DEVICE inline KindModifier<kKind, kFastTanh> kind_modifier(const AttentionParams& params, int batch,
                                                                         int head, int seqlen_q, int seqlen_k) {
  return score_modifier<kKind != ModifierKind::none, kFastTanh, kind_per_element(kKind)>(params, batch, head,
                                                                                         seqlen_q, seqlen_k);
}

}  // namespace flashlab
