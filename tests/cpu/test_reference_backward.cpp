// The backward pass's reference: autograd through the reference attention,
// against FlashAttention-2's gradient formulas and a finite difference, with
// rows that see no key.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab {
namespace {

using Problem = testing::ReferenceProblem;

// 2 query heads over 1 kv head; causal with seqlen_q > seqlen_k, so the first
// rows (row + seqlen_k - seqlen_q < 0) see no key.
Problem small_problem() { return testing::reference_problem(11, 1, 7, 5, 2, 1, 4, 0.5, -1, 0); }

// dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dS = P (dP - D),
// dQ = scale dS K, dK = scale dS^T Q; GQA sums dK, dV over the group.
TEST(ReferenceBackward, MatchesFlashAttentionFormulas) {
  const Problem p = small_problem();
  const ReferenceGradients gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);

  const at::Tensor query = p.q.transpose(1, 2);                            // (1, 2, 7, 4)
  const at::Tensor key = p.k.transpose(1, 2).repeat_interleave(2, 1);      // (1, 2, 5, 4)
  const at::Tensor value = p.v.transpose(1, 2).repeat_interleave(2, 1);
  const at::Tensor d_out = p.dout.transpose(1, 2);
  const at::Tensor visible = visibility_mask(7, 5, -1, 0, at::kCPU);
  const at::Tensor scores = (at::matmul(query, key.transpose(-2, -1)) * 0.5)
                                .masked_fill(visible.logical_not(), -INFINITY);
  const at::Tensor sees = visible.any(-1, true);
  const at::Tensor probabilities =
      at::where(sees, at::softmax(at::where(sees, scores, at::zeros_like(scores)), -1),
                at::zeros_like(scores));
  const at::Tensor out = at::matmul(probabilities, value);
  const at::Tensor d_value = at::matmul(probabilities.transpose(-2, -1), d_out);
  const at::Tensor d_prob = at::matmul(d_out, value.transpose(-2, -1));
  const at::Tensor row_d = (d_out * out).sum(-1, true);
  const at::Tensor d_scores = probabilities * (d_prob - row_d);
  const at::Tensor d_query = at::matmul(d_scores, key) * 0.5;
  const at::Tensor d_key = at::matmul(d_scores.transpose(-2, -1), query) * 0.5;
  const auto group_sum = [](const at::Tensor& per_head) {  // (1, 2, 5, 4) -> (1, 5, 1, 4)
    return per_head.sum(1, true).transpose(1, 2);
  };
  EXPECT_TRUE(at::allclose(gradients.dq, d_query.transpose(1, 2), 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(gradients.dk, group_sum(d_key), 1e-10, 1e-12));
  EXPECT_TRUE(at::allclose(gradients.dv, group_sum(d_value), 1e-10, 1e-12));
}

TEST(ReferenceBackward, RowsThatSeeNoKeyHaveZeroGradientNotNaN) {
  const Problem p = small_problem();
  const ReferenceGradients gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);
  for (const at::Tensor* gradient : {&gradients.dq, &gradients.dk, &gradients.dv})
    EXPECT_TRUE(at::isfinite(*gradient).all().item<bool>());
  // Rows 0 and 1 see no key (row + 5 - 7 < 0). Row 2 sees key 0 alone, so its
  // probability is 1 whatever its score: dq 0 too. Row 3 sees keys 0 and 1.
  EXPECT_EQ(gradients.dq.slice(1, 0, 3).abs().max().item<double>(), 0.0);
  EXPECT_GT(gradients.dq.select(1, 3).abs().max().item<double>(), 0.0);
}

// A central difference of L = sum(out * dout) in one element of k.
TEST(ReferenceBackward, AgreesWithAFiniteDifference) {
  const Problem p = small_problem();
  const ReferenceGradients gradients = reference_attention_backward(p.q, p.k, p.v, p.dout, p.options);
  const auto loss = [&](const at::Tensor& k) {
    return (reference_attention(p.q, k, p.v, p.options).out * p.dout).sum().item<double>();
  };
  const double step = 1e-6;
  at::Tensor k_plus = p.k.clone(), k_minus = p.k.clone();
  k_plus[0][3][0][2] += step;
  k_minus[0][3][0][2] -= step;
  const double numeric = (loss(k_plus) - loss(k_minus)) / (2 * step);
  EXPECT_NEAR(gradients.dk[0][3][0][2].item<double>(), numeric, 1e-7);
}

}  // namespace
}  // namespace flashlab
