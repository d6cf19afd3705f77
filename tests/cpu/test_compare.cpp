// compare_elementwise finds planted errors and names where they are.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "flashlab/harness/compare.h"

namespace flashlab {
namespace {

TileContext context_with_tiles(int64_t seqlen_q, int64_t seqlen_k) {
  TileContext context;
  context.tiles = {4, 8};
  context.seqlen_q = seqlen_q;
  context.seqlen_k = seqlen_k;
  return context;
}

TEST(Compare, IdenticalTensorsPass) {
  const at::Tensor expected = at::randn({2, 13, 3, 5});
  const auto report = compare_elementwise("out", expected.clone(), expected, 1e-6);
  EXPECT_TRUE(report.passed());
  EXPECT_EQ(report.max_abs_error, 0.0);
  EXPECT_FALSE(report.first_bad.has_value());
}

TEST(Compare, LocatesPlantedError) {
  const at::Tensor expected = at::randn({2, 13, 3, 5});
  at::Tensor actual = expected.clone();
  actual[1][6][2][3] += 0.5;  // batch 1, row 6, head 2, col 3
  const auto report = compare_elementwise("out", actual, expected, 1e-3, context_with_tiles(13, 40));
  EXPECT_FALSE(report.passed());
  EXPECT_EQ(report.over_tolerance, 1);
  ASSERT_TRUE(report.first_bad.has_value());
  EXPECT_EQ(report.first_bad->batch, 1);
  EXPECT_EQ(report.first_bad->row, 6);
  EXPECT_EQ(report.first_bad->head, 2);
  EXPECT_EQ(report.first_bad->col, 3);
  EXPECT_EQ(report.first_bad->flat_index, ((1 * 13 + 6) * 3 + 2) * 5 + 3);
  EXPECT_NEAR(report.max_abs_error, 0.5, 1e-6);
  const std::string text = report.format();
  EXPECT_NE(text.find("query tile 1 (rows 4..7"), std::string::npos) << text;
  EXPECT_NE(text.find("key tiles 0..4"), std::string::npos) << text;
  EXPECT_NE(report.first_bad_json().find("\"row\": 6"), std::string::npos);
}

TEST(Compare, ErrorWithinToleranceIsNotBad) {
  const at::Tensor expected = at::randn({1, 4, 1, 4}, at::kDouble);
  const auto report = compare_elementwise("out", expected + 1e-4, expected, 2e-4);
  EXPECT_TRUE(report.passed());
  EXPECT_NEAR(report.max_abs_error, 1e-4, 1e-9);
}

TEST(Compare, NanFromPoisonAndInfinityFail) {
  const at::Tensor expected = at::zeros({1, 4, 1, 4});
  at::Tensor actual = expected.clone();
  actual[0][2][0][1] = std::numeric_limits<float>::quiet_NaN();
  actual[0][3][0][0] = std::numeric_limits<float>::infinity();
  const auto report = compare_elementwise("out", actual, expected, 1.0);
  EXPECT_FALSE(report.passed());
  EXPECT_EQ(report.nan_count, 1);
  EXPECT_EQ(report.inf_count, 1);
  EXPECT_EQ(report.first_bad->row, 2);
}

TEST(Compare, MatchingMinusInfinityPasses) {
  // LSE of fully masked rows is -inf in both.
  const double minus_inf = -std::numeric_limits<double>::infinity();
  const at::Tensor expected = at::tensor({minus_inf, 1.0, 2.0}, at::kDouble).view({1, 3, 1, 1});
  EXPECT_TRUE(compare_elementwise("lse", expected.clone(), expected, 1e-6).passed());
  const at::Tensor finite_instead = at::tensor({0.0, 1.0, 2.0}, at::kDouble).view({1, 3, 1, 1});
  EXPECT_FALSE(compare_elementwise("lse", finite_instead, expected, 1e-6).passed());
}

TEST(Compare, FullyMaskedRowIsNamed) {
  const at::Tensor expected = at::zeros({1, 6, 1, 2});
  at::Tensor actual = expected.clone();
  actual[0][0][0][0] = 1.0f;
  const auto report = compare_elementwise("out", actual, expected, 1e-3, [] {
    TileContext context = context_with_tiles(6, 2);
    context.window_right = 0;  // causal: rows 0..3 see no key
    return context;
  }());
  EXPECT_NE(report.format().find("sees no key"), std::string::npos) << report.format();
}

}  // namespace
}  // namespace flashlab
