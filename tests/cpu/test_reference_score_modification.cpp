// The reference's score modifications (issue 33: softcap, ALiBi, attention
// sinks) against a plain float64 loop over every (batch, head, row, key) that
// writes flash-attn's definitions out one element at a time, forward (out,
// LSE) and backward (dq, dk, dv and the sinks' gradient, against a central
// finite difference and the closed form dsink[h] = -sum over rows of
// exp(sink_h - lse) * D). Odd sizes, seqlen_q != seqlen_k, GQA, masks that
// leave rows without keys.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/visible_keys.h"
#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab {
namespace {

using Problem = testing::ReferenceProblem;

// Batch 2, 4 query heads over 2 kv heads, 7 query rows, 13 keys, head_dim 5.
Problem odd_problem(int window_left, int window_right) {
  return testing::reference_problem(33, 2, 7, 13, 4, 2, 5, 0.7, window_left, window_right);
}

// out and lse one element at a time (flash-attn's order: scale, softcap,
// ALiBi, mask, softmax with the sink in the denominator).
ReferenceOutput loop_attention(const Problem& p) {
  const int64_t batch = p.q.size(0), seqlen_q = p.q.size(1), heads = p.q.size(2), dim = p.q.size(3);
  const int64_t seqlen_k = p.k.size(1), group = heads / p.k.size(2);
  const ScoreModification& m = p.options.modification;
  at::Tensor out = at::zeros({batch, seqlen_q, heads, dim}, at::kDouble);
  at::Tensor lse = at::zeros({batch, heads, seqlen_q}, at::kDouble);
  const auto q = p.q.accessor<double, 4>(), k = p.k.accessor<double, 4>(), v = p.v.accessor<double, 4>();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < seqlen_q; ++i) {
        const KeyRange visible = visible_keys(static_cast<int>(i), static_cast<int>(seqlen_q),
                                              static_cast<int>(seqlen_k), p.options.window_left,
                                              p.options.window_right);
        std::vector<double> score(seqlen_k, -std::numeric_limits<double>::infinity());
        double largest = m.sinks.defined() ? m.sinks[h].item<double>() : -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < seqlen_k; ++j) {
          if (!visible.contains(static_cast<int>(j))) continue;
          double s = 0;
          for (int64_t d = 0; d < dim; ++d) s += q[b][i][h][d] * k[b][j][h / group][d];
          s *= p.options.softmax_scale;
          if (m.softcap != 0.0) s = m.softcap * std::tanh(s / m.softcap);
          if (m.alibi_slopes.defined()) {
            const double slope = m.alibi_slopes.dim() == 1 ? m.alibi_slopes[h].item<double>()
                                                           : m.alibi_slopes[b][h].item<double>();
            s -= slope * std::abs(static_cast<double>(i + seqlen_k - seqlen_q - j));
          }
          score[j] = s;
          largest = std::max(largest, s);
        }
        if (largest == -std::numeric_limits<double>::infinity()) {
          lse[b][h][i] = -std::numeric_limits<double>::infinity();
          continue;  // out 0
        }
        double sum = m.sinks.defined() ? std::exp(m.sinks[h].item<double>() - largest) : 0.0;
        for (int64_t j = 0; j < seqlen_k; ++j) sum += std::exp(score[j] - largest);
        lse[b][h][i] = largest + std::log(sum);
        for (int64_t j = 0; j < seqlen_k; ++j) {
          const double probability = std::exp(score[j] - largest) / sum;
          for (int64_t d = 0; d < dim; ++d) out[b][i][h][d] += probability * v[b][j][h / group][d];
        }
      }
  return {out, lse};
}

void expect_forward_matches_loop(const Problem& p) {
  const ReferenceOutput reference = reference_attention(p.q, p.k, p.v, p.options);
  const ReferenceOutput loop = loop_attention(p);
  EXPECT_TRUE(at::allclose(reference.out, loop.out, 1e-12, 1e-12))
      << (reference.out - loop.out).abs().max().item<double>();
  // -inf where no key and no sink: compare the finite ones, then where they are.
  EXPECT_TRUE(at::equal(at::isfinite(reference.lse), at::isfinite(loop.lse)));
  const at::Tensor finite = at::isfinite(loop.lse);
  EXPECT_TRUE(at::allclose(reference.lse.masked_select(finite), loop.lse.masked_select(finite), 1e-12, 1e-12));
}

TEST(ReferenceScoreModification, SoftcapMatchesTheLoop) {
  for (const auto [left, right] : {std::pair{-1, -1}, std::pair{-1, 0}, std::pair{2, 1}}) {
    Problem p = odd_problem(left, right);
    p.options.modification.softcap = 0.9;  // small: tanh bends the scores
    expect_forward_matches_loop(p);
  }
}

TEST(ReferenceScoreModification, AlibiPerHeadAndPerBatchMatchesTheLoop) {
  for (const auto [left, right] : {std::pair{-1, -1}, std::pair{-1, 0}}) {
    Problem p = odd_problem(left, right);
    p.options.modification.alibi_slopes = at::tensor({0.5, 0.25, 0.125, 0.0625}, at::kFloat);
    expect_forward_matches_loop(p);
    p.options.modification.alibi_slopes = at::rand({2, 4}, at::kFloat);
    expect_forward_matches_loop(p);
  }
}

TEST(ReferenceScoreModification, SinksJoinTheDenominatorAndRowsWithoutKeysGiveZero) {
  // Causal with seqlen_k 5 < seqlen_q 7: rows 0 and 1 see no key.
  Problem p = odd_problem(-1, 0);
  p.k = at::randn({2, 5, 2, 5}, at::kDouble);
  p.v = at::randn({2, 5, 2, 5}, at::kDouble);
  p.options.modification.sinks = at::tensor({0.3, -1.2, 2.0, 0.0}, at::kFloat);
  expect_forward_matches_loop(p);
  const ReferenceOutput reference = reference_attention(p.q, p.k, p.v, p.options);
  // A row with no key: output 0, LSE the sink (finite, where without sinks it is -inf).
  EXPECT_TRUE(at::equal(reference.out.narrow(1, 0, 2), at::zeros_like(reference.out.narrow(1, 0, 2))));
  EXPECT_NEAR(reference.lse[1][2][0].item<double>(), 2.0, 1e-12);
  // All three together.
  p.options.modification.softcap = 2.5;
  p.options.modification.alibi_slopes = at::rand({4}, at::kFloat);
  expect_forward_matches_loop(p);
}

// Central differences of sum(out * dout) in float64.
at::Tensor finite_difference(const Problem& p, at::Tensor& input) {
  at::Tensor gradient = at::zeros_like(input);
  const double step = 1e-6;
  auto flat = input.view({-1});
  auto gradient_flat = gradient.view({-1});
  for (int64_t index = 0; index < flat.size(0); ++index) {
    const double saved = flat[index].item<double>();
    flat[index] = saved + step;
    const double up = (reference_attention(p.q, p.k, p.v, p.options).out * p.dout).sum().item<double>();
    flat[index] = saved - step;
    const double down = (reference_attention(p.q, p.k, p.v, p.options).out * p.dout).sum().item<double>();
    flat[index] = saved;
    gradient_flat[index] = (up - down) / (2 * step);
  }
  return gradient;
}

TEST(ReferenceScoreModification, GradientsMatchFiniteDifferencesAndTheSinkFormula) {
  Problem p = odd_problem(-1, 0);
  p.q = p.q.narrow(0, 0, 1).contiguous();
  p.k = p.k.narrow(0, 0, 1).narrow(1, 0, 6).contiguous();
  p.v = p.v.narrow(0, 0, 1).narrow(1, 0, 6).contiguous();
  p.dout = p.dout.narrow(0, 0, 1).contiguous();
  p.options.modification.softcap = 1.5;
  p.options.modification.alibi_slopes = at::tensor({0.5, 0.25, 0.125, 0.0625}, at::kFloat);
  p.options.modification.sinks = at::tensor({0.3, -1.2, 2.0, 0.0}, at::kDouble);
  const ReferenceGradients gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);
  ASSERT_TRUE(gradients.dsinks.defined());
  EXPECT_TRUE(at::allclose(gradients.dq, finite_difference(p, p.q), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(gradients.dk, finite_difference(p, p.k), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(gradients.dv, finite_difference(p, p.v), 1e-6, 1e-7));
  EXPECT_TRUE(at::allclose(gradients.dsinks, finite_difference(p, p.options.modification.sinks), 1e-6, 1e-7));
  // dsink[h] = -sum over rows of exp(sink_h - lse) * D, D = rowsum(dO * O).
  const ReferenceOutput forward = reference_attention(p.q, p.k, p.v, p.options);
  const at::Tensor d = (forward.out * p.dout).sum(-1).transpose(1, 2);  // (B, H, Sq)
  const at::Tensor sinks = p.options.modification.sinks.view({1, -1, 1});
  const at::Tensor formula = -(at::exp(sinks - forward.lse) * d).sum(at::IntArrayRef{0, 2});
  EXPECT_TRUE(at::allclose(gradients.dsinks, formula, 1e-10, 1e-12));
}

TEST(ReferenceScoreModification, VarlenTakesEachSequencesAlibiRowAndSumsTheSinksGradient) {
  Problem p = odd_problem(-1, 0);
  p.options.modification.alibi_slopes = at::rand({2, 4}, at::kFloat);
  p.options.modification.sinks = at::tensor({0.3, -1.2, 2.0, 0.0}, at::kDouble);
  // The fixed-length batch packed: sequence b's rows follow sequence b - 1's.
  const at::Tensor cu_q = at::tensor({0, 7, 14}, at::kInt), cu_k = at::tensor({0, 13, 26}, at::kInt);
  const auto pack = [](const at::Tensor& t) { return t.reshape({-1, t.size(2), t.size(3)}); };
  const ReferenceOutput fixed = reference_attention(p.q, p.k, p.v, p.options);
  const ReferenceOutput packed = reference_attention_varlen(pack(p.q), pack(p.k), pack(p.v), cu_q, cu_k, p.options);
  EXPECT_TRUE(at::allclose(packed.out, pack(fixed.out), 1e-12, 1e-12));
  const ReferenceGradients fixed_gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);
  const ReferenceGradients packed_gradients = reference_attention_varlen_backward(
      pack(p.q), pack(p.k), pack(p.v), pack(p.dout), cu_q, cu_k, p.options);
  EXPECT_TRUE(at::allclose(packed_gradients.dq, pack(fixed_gradients.dq), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(packed_gradients.dk, pack(fixed_gradients.dk), 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(packed_gradients.dsinks, fixed_gradients.dsinks, 1e-12, 1e-12));
}

// dsinks' stored-output shift (the harness's tolerance term for the kernels'
// D, formed from the 16-bit output): the sink formula from the forward's out
// rounded to fp16, minus the same from the exact out; varlen sums it over the
// sequences. Not asked for, it is absent.
TEST(ReferenceScoreModification, StoredOutputShiftIsTheSinkFormulaWithTheOutputRounded) {
  Problem p = odd_problem(2, 1);
  p.options.modification.softcap = 1.5;
  p.options.modification.alibi_slopes = at::tensor({0.5, 0.25, 0.125, 0.0625}, at::kFloat);
  p.options.modification.sinks = at::tensor({0.3, -1.2, 2.0, 0.0}, at::kDouble);
  EXPECT_FALSE(reference_attention_backward(p.q, p.k, p.v, p.dout, p.options).dsinks_stored_output_shift.defined());
  p.options.stored_output_dtype = at::kHalf;
  const ReferenceGradients gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);
  const ReferenceOutput forward = reference_attention(p.q, p.k, p.v, p.options);
  const at::Tensor share = at::exp(p.options.modification.sinks.view({1, -1, 1}) - forward.lse);  // (B, H, Sq)
  const auto formula = [&](const at::Tensor& out) {
    return -(share * (out * p.dout).sum(-1).transpose(1, 2)).sum(at::IntArrayRef{0, 2});
  };
  const at::Tensor expected = formula(forward.out.to(at::kHalf).to(at::kDouble)) - formula(forward.out);
  ASSERT_TRUE(gradients.dsinks_stored_output_shift.defined());
  EXPECT_GT(expected.abs().max().item<double>(), 1e-6);  // fp16 rounding moves it
  EXPECT_TRUE(at::allclose(gradients.dsinks_stored_output_shift, expected, 1e-9, 1e-12))
      << gradients.dsinks_stored_output_shift << expected;
  const at::Tensor cu_q = at::tensor({0, 7, 14}, at::kInt), cu_k = at::tensor({0, 13, 26}, at::kInt);
  const auto pack = [](const at::Tensor& t) { return t.reshape({-1, t.size(2), t.size(3)}); };
  const ReferenceGradients packed = reference_attention_varlen_backward(pack(p.q), pack(p.k), pack(p.v),
                                                                        pack(p.dout), cu_q, cu_k, p.options);
  EXPECT_TRUE(at::allclose(packed.dsinks_stored_output_shift, expected, 1e-9, 1e-12));
}

// A sequence without keys: its rows see only the sink, so out 0 and LSE = the
// sink (not -inf), and no gradient (D = 0). (The kernels wrote the sink while
// this reference kept -inf: session 23's first GPU run.)
TEST(ReferenceScoreModification, VarlenRowsWithoutKeysHaveTheSinkAsLse) {
  Problem p = odd_problem(-1, -1);
  p.options.modification.sinks = at::tensor({0.3, -1.2, 2.0, 0.0}, at::kDouble);
  const at::Tensor cu_q = at::tensor({0, 7, 14}, at::kInt), cu_k = at::tensor({0, 0, 13}, at::kInt);
  const auto pack = [](const at::Tensor& t) { return t.reshape({-1, t.size(2), t.size(3)}); };
  const ReferenceOutput packed =
      reference_attention_varlen(pack(p.q), pack(p.k).narrow(0, 0, 13), pack(p.v).narrow(0, 0, 13), cu_q, cu_k, p.options);
  const at::Tensor first = packed.lse.narrow(1, 0, 7);  // (heads, 7): sequence 0, no keys
  EXPECT_TRUE(at::equal(first, p.options.modification.sinks.view({4, 1}).expand({4, 7}).to(first.scalar_type())));
  EXPECT_TRUE(at::equal(packed.out.narrow(0, 0, 7), at::zeros_like(packed.out.narrow(0, 0, 7))));
  EXPECT_TRUE(at::isfinite(packed.lse).all().item<bool>());
}

}  // namespace
}  // namespace flashlab
