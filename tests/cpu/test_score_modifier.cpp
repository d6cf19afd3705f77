// The kernels' score-modification policy (common/score_modification.h) against
// the harness reference's definitions (reference_attention with
// ReferenceOptions::modification, float64): a float32 loop attention that
// uses the policy the way a kernel does (modified scores into the online
// softmax in key tiles, the sink as the row's first max and its term added
// after the last tile, dS times the factor the policy hands back) must give the reference's out, LSE, dq, dk, dv and the
// sinks' gradient, for softcap, ALiBi per head and per batch entry, sinks and
// their combinations, causal and not, seqlen_q != seqlen_k, GQA. Twice: as
// fa1/fa2 use the policy (s' and ds'/ds from modified()), and as fa3 does
// (KernelWay::fa3: the forward in tanh units, in_tanh_units() and
// apply_row_shifted<..., kTanhUnits> over key tiles (ALiBi's row-constant part
// left out where a tile's keys lie on one side of the diagonal); ds'/ds recovered from s' by
// gradient_factor_of, or softcap_gradient_factor_of without ALiBi).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "common/online_softmax.h"
#include "common/score_modification.h"
#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab {
namespace {

struct ModifierCase {
  std::string name;
  bool softcap, alibi, alibi_per_batch, sinks, causal;
};

void PrintTo(const ModifierCase& c, std::ostream* os) { *os << c.name; }

struct LoopResult {
  at::Tensor out, lse, dq, dk, dv, dsinks;
};

// Batch 2, 4 query heads on 2 kv heads, 7 query rows against 11 keys, head_dim 8.
constexpr int kBatch = 2, kHeads = 4, kKvHeads = 2, kSeqlenQ = 7, kSeqlenK = 11, kHeadDim = 8;
constexpr int kKeyTile = 4;  // keys per online-softmax step

enum class KernelWay { modified, fa3 };

template <bool kEnabled, KernelWay kWay = KernelWay::modified>
LoopResult loop_attention(const AttentionParams& params, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& dout) {
  const float scale = params.softmax_scale;
  const auto expf_ = [](float x) { return std::exp(x); };
  const auto qa = q.accessor<double, 4>(), ka = k.accessor<double, 4>(), va = v.accessor<double, 4>();
  const auto da = dout.accessor<double, 4>();
  LoopResult r{at::zeros_like(q), at::full({kBatch, kHeads, kSeqlenQ}, -INFINITY, q.options()), at::zeros_like(q),
               at::zeros_like(k), at::zeros_like(v), at::zeros({kHeads}, q.options())};
  auto out = r.out.accessor<double, 4>();
  auto lse = r.lse.accessor<double, 3>();
  auto dq = r.dq.accessor<double, 4>(), dk = r.dk.accessor<double, 4>(), dv = r.dv.accessor<double, 4>();
  auto dsinks = r.dsinks.accessor<double, 1>();
  const auto raw_score = [&](int b, int h, int i, int j) {
    float s = 0.f;
    for (int d = 0; d < kHeadDim; ++d)
      s += static_cast<float>(qa[b][i][h][d]) * static_cast<float>(ka[b][j][h / (kHeads / kKvHeads)][d]);
    return s;
  };
  const auto visible = [&](int i, int j) { return params.window_right < 0 || j <= i + kSeqlenK - kSeqlenQ; };
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h) {
      const int kv = h / (kHeads / kKvHeads);
      const auto modifier = score_modifier<kEnabled>(params, b, h, kSeqlenQ, kSeqlenK);
      constexpr bool kFa3 = kWay == KernelWay::fa3;
      // The forward's modifier and exponent scale (fa3: tanh units under softcap).
      const auto forward_modifier = kFa3 ? modifier.in_tanh_units() : modifier;
      const float forward_scale = kFa3 ? scale * forward_modifier.unit() : scale;
      // fa3's bf16 forward fixes the row max at the bound where softcap alone allows it
      // (the rule in fa3's base-2 exponent units; this loop's exp is natural).
      const bool fixed_max = kFa3 && forward_modifier.fix_row_max(forward_scale * kLog2e);
      // A key tile's scores of row i, modified; returns what fa3's forward left
      // out of them (apply_row_shifted: s' = score + shift), 0 for fa1/fa2.
      const auto modify_tile = [&](float (&scores)[kKeyTile], int i, int j0) {
        if constexpr (!kFa3) {
          for (int t = 0; t < kKeyTile; ++t) scores[t] = modifier.modified(scores[t], i, j0 + t);
          return 0.f;
        }
        return forward_modifier.template apply_row_shifted<1, kKeyTile, /*kTanhUnits=*/true>(
            i, j0, 0, [&](int, int t) -> float& { return scores[t]; });
      };
      for (int i = 0; i < kSeqlenQ; ++i) {
        // Forward: the online softmax over key tiles, as a kernel runs it.
        float row_max = fixed_max ? forward_modifier.fixed_row_max(forward_scale * kLog2e)
                                  : forward_modifier.initial_row_max(),
              row_sum = 0.f;
        std::vector<float> acc(kHeadDim, 0.f);
        for (int j0 = 0; j0 < kSeqlenK; j0 += kKeyTile) {
          float scores[kKeyTile];
          for (int t = 0; t < kKeyTile; ++t) scores[t] = j0 + t < kSeqlenK ? raw_score(b, h, i, j0 + t) : 0.f;
          const float shift = modify_tile(scores, i, j0);
          float tile_max = row_max;
          for (int t = 0; t < kKeyTile; ++t) {
            const int j = j0 + t;
            if (j >= kSeqlenK || !visible(i, j)) scores[t] = -INFINITY;  // the mask, after the modification
            if (!fixed_max) tile_max = std::fmax(tile_max, scores[t] + shift);
          }
          float offset;
          const float correction = online_softmax_rescale(row_max, tile_max, forward_scale, offset, expf_);
          offset -= shift * forward_scale;
          row_sum *= correction;
          for (float& a : acc) a *= correction;
          for (int t = 0; t < kKeyTile; ++t) {
            if (j0 + t >= kSeqlenK) continue;
            const float p = softmax_probability(scores[t], forward_scale, offset, expf_);
            row_sum += p;
            for (int d = 0; d < kHeadDim; ++d) acc[d] += p * static_cast<float>(va[b][j0 + t][kv][d]);
          }
        }
        row_sum += forward_modifier.sink_term(row_max, forward_scale, expf_);
        const SoftmaxResult result = online_softmax_finish(row_max, row_sum, forward_modifier.natural_scale(scale));
        lse[b][h][i] = result.lse;
        for (int d = 0; d < kHeadDim; ++d) out[b][i][h][d] = acc[d] * result.inverse_sum;
        // Backward: P from the LSE, dS through the modification.
        float row_d = 0.f;
        for (int d = 0; d < kHeadDim; ++d) row_d += static_cast<float>(da[b][i][h][d] * out[b][i][h][d]);
        if (params.modification.sinks != nullptr) dsinks[h] -= std::exp(params.modification.sinks[h] - result.lse) * row_d;
        for (int j = 0; j < kSeqlenK; ++j) {
          if (!visible(i, j)) continue;
          const float s = raw_score(b, h, i, j);
          float factor;
          const float modified_s = modifier.modified(s, i, j, factor);
          if constexpr (kFa3) {  // ds'/ds from s' itself, as fa3's backward takes it
            factor = !modifier.has_softcap() ? 1.f
                     : modifier.has_alibi()  ? modifier.gradient_factor_of(modified_s, i, j)
                                             : modifier.softcap_gradient_factor_of(modified_s);
          }
          const float p = std::exp(modified_s * scale - result.lse);
          float dp = 0.f;
          for (int d = 0; d < kHeadDim; ++d) dp += static_cast<float>(da[b][i][h][d] * va[b][j][kv][d]);
          const float ds = p * (dp - row_d) * factor * scale;
          for (int d = 0; d < kHeadDim; ++d) {
            dq[b][i][h][d] += ds * ka[b][j][kv][d];
            dk[b][j][kv][d] += ds * qa[b][i][h][d];
            dv[b][j][kv][d] += p * da[b][i][h][d];
          }
        }
      }
    }
  return r;
}

class ScoreModifierCases : public ::testing::TestWithParam<ModifierCase> {};

TEST_P(ScoreModifierCases, LoopThroughThePolicyMatchesTheReference) {
  const ModifierCase& c = GetParam();
  at::manual_seed(static_cast<uint64_t>(testing::test_seed()));
  const auto options = at::TensorOptions().dtype(at::kDouble);
  const at::Tensor q = at::randn({kBatch, kSeqlenQ, kHeads, kHeadDim}, options);
  const at::Tensor k = at::randn({kBatch, kSeqlenK, kKvHeads, kHeadDim}, options);
  const at::Tensor v = at::randn({kBatch, kSeqlenK, kKvHeads, kHeadDim}, options);
  const at::Tensor dout = at::randn({kBatch, kSeqlenQ, kHeads, kHeadDim}, options);
  // Scores of about +-2 after scaling, so a cap of 1.5 bends them.
  const float softmax_scale = 0.7f / std::sqrt(static_cast<float>(kHeadDim)) * 2.f;
  const at::Tensor slopes = c.alibi_per_batch ? at::rand({kBatch, kHeads}, at::kFloat) * 0.5 + 0.1
                                              : at::rand({kHeads}, at::kFloat) * 0.5 + 0.1;
  const at::Tensor sinks = at::randn({kHeads}, at::kFloat);

  ReferenceOptions reference;
  reference.softmax_scale = softmax_scale;
  reference.window_right = c.causal ? 0 : -1;
  reference.compute_dtype = at::kDouble;
  AttentionParams params;
  params.softmax_scale = softmax_scale;
  params.window_right = reference.window_right;
  if (c.softcap) reference.modification.softcap = params.modification.softcap = 1.5f;
  if (c.alibi) {
    reference.modification.alibi_slopes = slopes;
    params.modification.alibi_slopes = slopes.data_ptr<float>();
    params.modification.alibi_batch_stride = c.alibi_per_batch ? kHeads : 0;
  }
  if (c.sinks) {
    reference.modification.sinks = sinks;
    params.modification.sinks = sinks.data_ptr<float>();
  }

  // One instantiation takes every combination (the kernels' kEnabled); none: the plain one.
  const bool any = c.softcap || c.alibi || c.sinks;
  const LoopResult loops[] = {
      any ? loop_attention<true>(params, q, k, v, dout) : loop_attention<false>(params, q, k, v, dout),
      any ? loop_attention<true, KernelWay::fa3>(params, q, k, v, dout)
          : loop_attention<false, KernelWay::fa3>(params, q, k, v, dout)};
  const ReferenceOutput forward = reference_attention(q, k, v, reference);
  // The fixed row max engages for softcap alone (so the fa3 loop above ran it), never with ALiBi or sinks.
  const auto tanh_units = score_modifier<true>(params, 0, 0, kSeqlenQ, kSeqlenK).in_tanh_units();
  EXPECT_EQ(tanh_units.fix_row_max(softmax_scale * tanh_units.unit() * kLog2e), c.softcap && !c.alibi && !c.sinks);
  // The host's rule (which instantiation fa3 runs) agrees with the device's.
  EXPECT_EQ(softcap_fixed_max_allowed(params.modification), c.softcap && !c.alibi && !c.sinks);
  const ReferenceGradients backward = reference_attention_backward(q, k, v, dout, reference);
  // float32 loop against float64: a few float32 ulps of values of order 1.
  for (const LoopResult& loop : loops) {
    const char* way = &loop == &loops[0] ? "modified()" : "fa3's way";
    const auto expect_close = [&](const char* name, const at::Tensor& got, const at::Tensor& want) {
      const double error = (got - want.to(at::kDouble)).abs().max().item<double>();
      EXPECT_LT(error, 2e-5 * (1 + want.abs().max().item<double>())) << way << ", " << name << ": max error " << error;
    };
    expect_close("out", loop.out, forward.out);
    expect_close("lse", loop.lse, forward.lse);
    expect_close("dq", loop.dq, backward.dq);
    expect_close("dk", loop.dk, backward.dk);
    expect_close("dv", loop.dv, backward.dv);
    if (c.sinks) expect_close("dsinks", loop.dsinks, backward.dsinks);
  }
}

// The fixed row max (fa3's softcap_fixed_max instantiation) only where
// 2^(2 * softcap * log2(e)) fits P's window [2^-110, 2^64]: softcap <= 60.3;
// the host and device rules agree on both sides of it, for any softmax_scale.
TEST(ScoreModifierFixedMax, AllowedUpToASoftcapOf60) {
  for (const float softmax_scale : {0.01f, 0.125f, 4.f})
    for (const float softcap : {1.5f, 30.f, 38.2f, 50.f, 60.f, 60.5f, 80.f}) {
      AttentionParams params;
      params.softmax_scale = softmax_scale;
      params.modification.softcap = softcap;
      const auto units = score_modifier<true>(params, 0, 0, 7, 11).in_tanh_units();
      const bool device_rule = units.fix_row_max(softmax_scale * units.unit() * kLog2e);  // exp2 units, as fa3
      EXPECT_EQ(device_rule, softcap <= 60.f) << "softcap " << softcap << ", scale " << softmax_scale;
      EXPECT_EQ(softcap_fixed_max_allowed(params.modification), device_rule) << "softcap " << softcap;
    }
}

// With the max fixed where fa3 fixes it (tanh units, base 2), P over scores
// from -bound to bound stays in [2^-110, 2^64], the max is the bound itself
// while that keeps P <= 1 (softcap <= 38), and a row's softmax from those P
// (float32, as the kernel sums them) matches float64.
TEST(ScoreModifierFixedMax, PStaysInItsWindowAndTheSoftmaxIsExact) {
  for (const float softmax_scale : {0.01f, 0.125f, 4.f})
    for (const float softcap : {1.5f, 30.f, 38.f, 45.f, 50.f, 60.f}) {
      AttentionParams params;
      params.softmax_scale = softmax_scale;
      params.modification.softcap = softcap;
      const auto units = score_modifier<true>(params, 0, 0, 7, 11).in_tanh_units();
      const float scale = softmax_scale * units.unit() * kLog2e;
      ASSERT_TRUE(units.fix_row_max(scale)) << "softcap " << softcap;
      const float max = units.fixed_row_max(scale), bound = units.score_bound();
      const std::string what = "softcap " + std::to_string(softcap) + ", scale " + std::to_string(softmax_scale);
      if (2.f * bound * scale <= kFixedMaxExponentFloor) EXPECT_EQ(max, bound) << what;
      constexpr int kKeys = 65;  // tanh-unit scores from -1 to 1, both ends included
      float p[kKeys], sum = 0.f;
      double want[kKeys], want_sum = 0.0;
      for (int j = 0; j < kKeys; ++j) {
        const float t = -bound + 2.f * bound * static_cast<float>(j) / (kKeys - 1);
        p[j] = std::exp2(t * scale - max * scale);
        sum += p[j];
        want[j] = std::exp2(static_cast<double>(t) * scale - static_cast<double>(bound) * scale);
        want_sum += want[j];
      }
      EXPECT_GE(p[0], std::ldexp(1.f, -110) * 0.999f) << what;
      EXPECT_LE(p[kKeys - 1], std::ldexp(1.f, 64) * 1.001f) << what;
      for (int j = 0; j < kKeys; ++j)
        EXPECT_NEAR(p[j] / sum, want[j] / want_sum, 1e-5 * want[j] / want_sum + 1e-30) << what << ", key " << j;
    }
}

// apply_row_shifted on a kernel's fragment shape (4 tiles of 8 keys, 2 a lane):
// the scores plus the shift it returns are apply_row's, with ALiBi's distance
// on one side of the diagonal, straddling it, or ending on it; the shift is 0
// where the lane's keys straddle the diagonal or there is no ALiBi.
TEST(ScoreModifierShiftedRows, ScoresPlusShiftAreApplyRows) {
  constexpr int kTiles = 4, kPerTile = 2;
  const float slopes[] = {0.5f, 0.f};
  const float softcaps[] = {0.f, 30.f};
  for (const float slope : slopes)
    for (const float softcap : softcaps) {
      AttentionParams params;
      params.softmax_scale = 0.125f;
      params.modification.softcap = softcap;
      params.modification.alibi_slopes = &slope;
      const auto modifier = score_modifier<true>(params, 0, 0, 100, 140).in_tanh_units();
      for (int row = 0; row < 100; row += 3)
        for (const int first_key : {0, 64, 96, 112, 128, 136}) {
          float shifted[kTiles][kPerTile], plain[kTiles][kPerTile];
          for (int n = 0; n < kTiles; ++n)
            for (int i = 0; i < kPerTile; ++i) shifted[n][i] = plain[n][i] = 0.37f * n - 0.11f * i + 0.05f * row;
          const float shift = modifier.apply_row_shifted<kTiles, kPerTile, true>(
              row, first_key, 2, [&](int n, int i) -> float& { return shifted[n][i]; });
          modifier.apply_row<kTiles, kPerTile, true>(row, first_key, 2, [&](int n, int i) -> float& { return plain[n][i]; });
          const int base = row + 40 - first_key - 2;  // distance of the lane's first key
          const bool straddles = base > 0 && base < (kTiles - 1) * 8 + kPerTile - 1;
          if (slope == 0.f || straddles) EXPECT_EQ(shift, 0.f) << "row " << row << ", first key " << first_key;
          for (int n = 0; n < kTiles; ++n)
            for (int i = 0; i < kPerTile; ++i)
              EXPECT_NEAR(shifted[n][i] + shift, plain[n][i], 1e-5f * (1.f + std::fabs(plain[n][i])))
                  << "row " << row << ", first key " << first_key << ", element (" << n << ", " << i << "), slope "
                  << slope << ", softcap " << softcap;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(
    FlashAttnDefinitions, ScoreModifierCases,
    ::testing::Values(ModifierCase{"none", false, false, false, false, false},
                      ModifierCase{"softcap", true, false, false, false, false},
                      ModifierCase{"softcap_causal", true, false, false, false, true},
                      ModifierCase{"alibi", false, true, false, false, false},
                      ModifierCase{"alibi_per_batch_causal", false, true, true, false, true},
                      ModifierCase{"sinks", false, false, false, true, false},
                      ModifierCase{"sinks_causal", false, false, false, true, true},
                      ModifierCase{"softcap_alibi_sinks_causal", true, true, true, true, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashlab
