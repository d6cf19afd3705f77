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

TEST(Compare, KeyRowsNameTheirKeyTileAndTheQueryTilesThatSeeThem) {
  // dk of 13 queries over 40 keys, causal (bottom-right: row i sees keys
  // 0..i+27), tiles 4 x 8. Key 33 is seen by rows 6..12: query tiles 1..3.
  const at::Tensor expected = at::randn({2, 40, 3, 5});
  at::Tensor actual = expected.clone();
  actual[1][33][2][3] += 0.5;
  TileContext context = context_with_tiles(13, 40);
  context.window_right = 0;
  context.rows_are_keys = true;
  const auto report = compare_elementwise("dk", actual, expected, 1e-3, context);
  ASSERT_TRUE(report.first_bad.has_value());
  EXPECT_EQ(report.first_bad->row, 33);
  const std::string text = report.format();
  EXPECT_NE(text.find("key tile 4 (keys 32..39, block_k 8)"), std::string::npos) << text;
  EXPECT_NE(text.find("query tiles 1..3 (block_q 4)"), std::string::npos) << text;
  EXPECT_EQ(text.find("lies in query tile"), std::string::npos) << text;
  const std::string json = report.first_bad_json();
  EXPECT_NE(json.find("\"key_tile\": 4"), std::string::npos) << json;
  EXPECT_NE(json.find("\"query_tiles\": [1, 3]"), std::string::npos) << json;
}

TEST(Compare, VisitingQueryTilesFollowTheMaskRule) {
  TileContext context = context_with_tiles(13, 40);
  EXPECT_EQ(visiting_query_tiles(context, 0), std::make_pair(int64_t{0}, int64_t{3}));  // no mask
  context.window_right = 0;  // causal: key 39 is seen by the last row only
  EXPECT_EQ(visiting_query_tiles(context, 39), std::make_pair(int64_t{3}, int64_t{3}));
  EXPECT_EQ(visiting_query_tiles(context, 27), std::make_pair(int64_t{0}, int64_t{3}));
  EXPECT_EQ(visiting_query_tiles(context, 28), std::make_pair(int64_t{0}, int64_t{3}));
  context.window_left = 2;  // rows i see keys i+25..i+27: key 10 is seen by none
  const auto [first, last] = visiting_query_tiles(context, 10);
  EXPECT_LT(last, first);
  // Row 5 sees keys 30..32: key 30 is seen by rows 3..5 (tiles 0..1).
  EXPECT_EQ(visiting_query_tiles(context, 30), std::make_pair(int64_t{0}, int64_t{1}));
}

TEST(Compare, UnseenKeyIsNamed) {
  const at::Tensor expected = at::zeros({1, 40, 1, 2});
  at::Tensor actual = expected.clone();
  actual[0][10][0][0] = 1.0f;
  TileContext context = context_with_tiles(13, 40);
  context.window_left = 2, context.window_right = 0;
  context.rows_are_keys = true;
  const auto report = compare_elementwise("dv", actual, expected, 1e-3, context);
  EXPECT_NE(report.format().find("no query row sees this key"), std::string::npos) << report.format();
}

TEST(Compare, ReportAsJson) {
  const at::Tensor expected = at::zeros({1, 4, 1, 2});
  at::Tensor actual = expected.clone();
  actual[0][1][0][1] = std::numeric_limits<float>::quiet_NaN();
  const std::string json = compare_elementwise("dq", actual, expected, 1e-3).to_json();
  EXPECT_EQ(json.rfind("{\"passed\": false, ", 0), 0u) << json;
  EXPECT_NE(json.find("\"nan_count\": 1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"total\": 8"), std::string::npos) << json;
  EXPECT_NE(json.find("\"first_bad\": {\"batch\": 0, \"row\": 1"), std::string::npos) << json;
}

}  // namespace
}  // namespace flashlab
