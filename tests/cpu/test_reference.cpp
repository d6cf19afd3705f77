// The reference attention against values worked out by hand.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "flashlab/harness/reference.h"

namespace flashlab {
namespace {

// One batch, one head, head_dim 2, scale 1. Scores q.k: row 0 -> [1, 0, 1], row 1 -> [0, 1, 1].
struct HandWorkedProblem {
  at::Tensor q = at::tensor({1.0, 0.0, 0.0, 1.0}, at::kDouble).view({1, 2, 1, 2});
  at::Tensor k = at::tensor({1.0, 0.0, 0.0, 1.0, 1.0, 1.0}, at::kDouble).view({1, 3, 1, 2});
  at::Tensor v = at::tensor({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, at::kDouble).view({1, 3, 1, 2});
  ReferenceOutput run(int window_left, int window_right) const {
    ReferenceOptions options;
    options.softmax_scale = 1.0;
    options.window_left = window_left;
    options.window_right = window_right;
    options.compute_dtype = at::kDouble;
    return reference_attention(q, k, v, options);
  }
};

void expect_row(const ReferenceOutput& result, int row, double out0, double out1, double lse) {
  EXPECT_NEAR(result.out[0][row][0][0].item<double>(), out0, 1e-12) << "row " << row;
  EXPECT_NEAR(result.out[0][row][0][1].item<double>(), out1, 1e-12) << "row " << row;
  EXPECT_NEAR(result.lse[0][0][row].item<double>(), lse, 1e-12) << "row " << row;
}

TEST(Reference, FullAttentionByHand) {
  const double e = std::exp(1.0);
  const auto result = HandWorkedProblem{}.run(-1, -1);
  // Row 0: weights e, 1, e over 2e + 1.
  expect_row(result, 0, (e * 1 + 3 + e * 5) / (2 * e + 1), (e * 2 + 4 + e * 6) / (2 * e + 1),
             std::log(2 * e + 1));
  // Row 1: weights 1, e, e.
  expect_row(result, 1, (1 + e * 3 + e * 5) / (2 * e + 1), (2 + e * 4 + e * 6) / (2 * e + 1),
             std::log(2 * e + 1));
}

TEST(Reference, CausalIsBottomRightAligned) {
  const double e = std::exp(1.0);
  const auto result = HandWorkedProblem{}.run(-1, 0);
  // seqlen_q 2, seqlen_k 3: row 0 sees keys 0..1, row 1 sees all three.
  expect_row(result, 0, (e * 1 + 3) / (e + 1), (e * 2 + 4) / (e + 1), std::log(e + 1));
  expect_row(result, 1, (1 + e * 3 + e * 5) / (2 * e + 1), (2 + e * 4 + e * 6) / (2 * e + 1),
             std::log(2 * e + 1));
}

TEST(Reference, DiagonalWindowSeesOneKey) {
  const auto result = HandWorkedProblem{}.run(0, 0);
  expect_row(result, 0, 3, 4, 0.0);  // key 1, score 0
  expect_row(result, 1, 5, 6, 1.0);  // key 2, score 1
}

TEST(Reference, FullyMaskedRowsGiveZeroAndMinusInfinity) {
  // seqlen_q 3, seqlen_k 1, causal: rows 0 and 1 see no key.
  const at::Tensor q = at::ones({1, 3, 1, 2}, at::kDouble);
  const at::Tensor k = at::ones({1, 1, 1, 2}, at::kDouble);
  const at::Tensor v = at::full({1, 1, 1, 2}, 7.0, at::kDouble);
  ReferenceOptions options;
  options.window_right = 0;
  options.compute_dtype = at::kDouble;
  const auto result = reference_attention(q, k, v, options);
  EXPECT_TRUE(at::isfinite(result.out).all().item<bool>());
  for (int row = 0; row < 2; ++row) {
    EXPECT_EQ(result.out[0][row][0][0].item<double>(), 0.0);
    EXPECT_EQ(result.lse[0][0][row].item<double>(), -std::numeric_limits<double>::infinity());
  }
  EXPECT_EQ(result.out[0][2][0][1].item<double>(), 7.0);
  EXPECT_NEAR(result.lse[0][0][2].item<double>(), options.softmax_scale * 2.0, 1e-12);
}

TEST(Reference, GroupedQueryAttentionSharesKvHeads) {
  const at::Tensor q = at::randn({2, 5, 4, 8}, at::kDouble);
  const at::Tensor k = at::randn({2, 6, 2, 8}, at::kDouble);
  const at::Tensor v = at::randn({2, 6, 2, 8}, at::kDouble);
  ReferenceOptions options;
  options.compute_dtype = at::kDouble;
  const auto grouped = reference_attention(q, k, v, options);
  // Query heads 0,1 use kv head 0; heads 2,3 use kv head 1.
  const auto expanded = reference_attention(q, k.repeat_interleave(2, 2), v.repeat_interleave(2, 2), options);
  EXPECT_TRUE(at::allclose(grouped.out, expanded.out, 0, 1e-12));
  const auto head3 = reference_attention(q.narrow(2, 3, 1), k.narrow(2, 1, 1), v.narrow(2, 1, 1), options);
  EXPECT_TRUE(at::allclose(grouped.out.narrow(2, 3, 1), head3.out, 0, 1e-12));
}

TEST(Reference, VisibilityMaskCounts) {
  // seqlen 4x6 causal: row i sees keys 0..i+2.
  const at::Tensor mask = visibility_mask(4, 6, -1, 0, at::kCPU);
  EXPECT_EQ(mask.sum(1).to(at::kLong)[0].item<int64_t>(), 3);
  EXPECT_EQ(mask.sum(1).to(at::kLong)[3].item<int64_t>(), 6);
  // Window (1, 0): each row sees at most two keys.
  EXPECT_EQ(visibility_mask(4, 6, 1, 0, at::kCPU).sum(1).max().item<int64_t>(), 2);
}

}  // namespace
}  // namespace flashlab
