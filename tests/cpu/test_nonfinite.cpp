// NaN/inf origin (issue 10 item 4) on synthetic tensors: the first non-finite
// element of a kernel's tensor, the finiteness of the inputs its row depends
// on under the mask (query rows: q, the keys it sees; key rows: k/v, the q
// rows that see the key), varlen sequences, the LSE layout; and the first
// recorded tile state that went non-finite, in both visiting orders.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "flashlab/harness/problem.h"
#include "flashlab/harness/tile_trace.h"

namespace flashlab {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Fixture {
  OriginInputs inputs;
  at::Tensor out;  // a finite "reference" output shaped like q
};

// q (2, 10, 4, 8), k and v (2, 12, 2, 8): GQA groups of two heads.
Fixture fixed(bool causal) {
  at::manual_seed(3);
  Fixture f;
  f.inputs.q = at::randn({2, 10, 4, 8});
  f.inputs.k = at::randn({2, 12, 2, 8});
  f.inputs.v = at::randn({2, 12, 2, 8});
  if (causal) f.inputs.window_right = 0;
  f.out = at::randn({2, 10, 4, 8});
  return f;
}

ComparisonReport explained(const at::Tensor& actual, const at::Tensor& expected,
                           const OriginInputs& inputs, RowKind kind) {
  ComparisonReport report;
  explain_nonfinite(report, actual, expected, inputs, kind);
  return report;
}

TEST(NonFiniteOrigin, FiniteInputsPointAtTheKernel) {
  const Fixture f = fixed(false);
  at::Tensor actual = f.out.clone();
  actual[1][7][0][0] = kInf;
  actual[1][5][3][2] = kNan;  // first in (batch, row, head, col) order
  const ComparisonReport report = explained(actual, f.out, f.inputs, RowKind::query);
  ASSERT_TRUE(report.nonfinite.has_value());
  const NonFiniteOrigin& at = *report.nonfinite;
  EXPECT_EQ(at.batch, 1);
  EXPECT_EQ(at.row, 5);
  EXPECT_EQ(at.head, 3);
  EXPECT_EQ(at.col, 2);
  EXPECT_TRUE(std::isnan(at.value));
  EXPECT_EQ(at.own_nonfinite, 0);
  EXPECT_EQ(at.seen_rows, 12);
  EXPECT_EQ(at.seen_nonfinite_rows, 0);
  EXPECT_EQ(at.dout_nonfinite, -1);
  EXPECT_TRUE(at.inputs_finite());
  EXPECT_NE(at.format().find("the kernel made it"), std::string::npos) << at.format();
}

TEST(NonFiniteOrigin, NonFiniteQRowIsNamed) {
  Fixture f = fixed(false);
  f.inputs.q[1][5][3][4] = kNan;
  f.inputs.q[1][5][2][4] = kNan;  // another head's row: not this element's
  at::Tensor actual = f.out.clone();
  actual[1][5][3][0] = kNan;
  const NonFiniteOrigin at = *explained(actual, f.out, f.inputs, RowKind::query).nonfinite;
  EXPECT_EQ(at.own_nonfinite, 1);
  EXPECT_FALSE(at.inputs_finite());
  EXPECT_NE(at.format().find("already hold"), std::string::npos) << at.format();
}

// Causal, 10 rows x 12 keys: row r sees keys 0..r + 2. A NaN in key 9 of kv
// head 1 reaches rows 7.. of heads 2 and 3, not row 5, and not kv head 0's heads.
TEST(NonFiniteOrigin, OnlyTheKeysTheRowSeesUnderTheMaskCount) {
  Fixture f = fixed(true);
  f.inputs.v[0][9][1][3] = kInf;
  for (const auto& [row, head, expect_bad] : {std::tuple{5, 2, false}, std::tuple{8, 3, true},
                                              std::tuple{8, 1, false}}) {
    at::Tensor actual = f.out.clone();
    actual[0][row][head][0] = kNan;
    const NonFiniteOrigin at = *explained(actual, f.out, f.inputs, RowKind::query).nonfinite;
    EXPECT_EQ(at.first_seen, 0);
    EXPECT_EQ(at.last_seen, row + 2);
    EXPECT_EQ(at.seen_nonfinite_rows, expect_bad ? 1 : 0) << "row " << row << " head " << head;
    EXPECT_EQ(at.first_nonfinite_seen, expect_bad ? 9 : -1);
    EXPECT_EQ(at.inputs_finite(), !expect_bad);
  }
}

// dk / dv rows are keys of a kv head: key 3 is seen (causal) by rows 1..9 of
// heads 2 and 3; a NaN q row among them and a NaN dout row are counted.
TEST(NonFiniteOrigin, KeyRowsLookAtTheQueryRowsThatSeeThem) {
  Fixture f = fixed(true);
  f.inputs.dout = at::randn({2, 10, 4, 8});
  const at::Tensor dk = at::randn({2, 12, 2, 8});
  at::Tensor actual = dk.clone();
  actual[0][3][1][5] = -kInf;
  ComparisonReport report = explained(actual, dk, f.inputs, RowKind::key);
  NonFiniteOrigin at = *report.nonfinite;
  EXPECT_TRUE(at.rows_are_keys);
  EXPECT_EQ(at.row, 3);
  EXPECT_EQ(at.head, 1);
  EXPECT_EQ(at.first_seen, 1);
  EXPECT_EQ(at.last_seen, 9);
  EXPECT_EQ(at.seen_rows, 18);
  EXPECT_TRUE(at.inputs_finite());
  f.inputs.q[0][6][2][0] = kNan;
  f.inputs.q[0][0][2][0] = kNan;  // row 0 does not see key 3
  f.inputs.dout[0][4][3][1] = kNan;
  at = *explained(actual, dk, f.inputs, RowKind::key).nonfinite;
  EXPECT_EQ(at.seen_nonfinite_rows, 1);
  EXPECT_EQ(at.first_nonfinite_seen, 6);
  EXPECT_EQ(at.dout_nonfinite, 1);
  EXPECT_FALSE(at.inputs_finite());
}

// Packed sequences of 3, 0 and 4 query rows (2, 5, 6 keys): packed row 4 is
// row 1 of sequence 2, whose keys are packed rows 7..12.
TEST(NonFiniteOrigin, VariableLengthRowsCountWithinTheirSequence) {
  at::manual_seed(5);
  OriginInputs inputs;
  inputs.q = at::randn({7, 2, 8});
  inputs.k = at::randn({13, 1, 8});
  inputs.v = at::randn({13, 1, 8});
  inputs.cu_seqlens_q = {0, 3, 3, 7};
  inputs.cu_seqlens_k = {0, 2, 7, 13};
  inputs.k[1][0][0] = kNan;   // sequence 0's key: not seen by sequence 2
  inputs.k[10][0][2] = kNan;  // sequence 2's key 3
  const at::Tensor out = at::randn({7, 2, 8});
  at::Tensor actual = out.clone();
  actual[4][1][6] = kNan;
  const NonFiniteOrigin at = *explained(actual, out, inputs, RowKind::query).nonfinite;
  EXPECT_TRUE(at.varlen);
  EXPECT_EQ(at.batch, 2);
  EXPECT_EQ(at.row, 1);
  EXPECT_EQ(at.head, 1);
  EXPECT_EQ(at.col, 6);
  EXPECT_EQ(at.seen_rows, 6);
  EXPECT_EQ(at.seen_nonfinite_rows, 1);
  EXPECT_EQ(at.first_nonfinite_seen, 3);
}

// LSE (batch, heads, rows): -inf where the reference has -inf (a fully masked
// row) and NaN against NaN are not origins; a NaN against a finite value is.
TEST(NonFiniteOrigin, LseLayoutAndMatchingNonFiniteValues) {
  const Fixture f = fixed(false);
  at::Tensor expected = at::randn({2, 4, 10});
  expected[0][0][0] = -kInf;
  expected[0][0][1] = kNan;
  at::Tensor actual = expected.clone();
  EXPECT_FALSE(explained(actual, expected, f.inputs, RowKind::lse).nonfinite.has_value());
  actual[0][3][2] = kInf;
  actual[0][1][4] = kNan;
  const NonFiniteOrigin at = *explained(actual, expected, f.inputs, RowKind::lse).nonfinite;
  EXPECT_EQ(at.batch, 0);
  EXPECT_EQ(at.row, 2);  // row 2 comes before row 4 in (batch, row, head) order
  EXPECT_EQ(at.head, 3);
  EXPECT_EQ(at.col, 0);
}

// The report prints it under the element report.
TEST(NonFiniteOrigin, ComparisonReportPrintsIt) {
  const Fixture f = fixed(false);
  at::Tensor actual = f.out.clone();
  actual[0][2][1][3] = kNan;
  ComparisonReport report = compare_rows("out", actual, f.out, 1e-3, {});
  EXPECT_EQ(report.format().find("first NaN/inf"), std::string::npos);
  explain_nonfinite(report, actual, f.out, f.inputs, RowKind::query);
  EXPECT_NE(report.format().find("first NaN/inf: batch 0, head 1, row 2, col 3 = nan"), std::string::npos)
      << report.format();
}

TEST(TileStateOrigin, UnwrittenStatesAreToldApartFromWrittenNaN) {
  at::Tensor states = unwritten_trace_states({1, 1, 2, 3}, at::TensorOptions());
  EXPECT_TRUE(at::isnan(states).all().item<bool>());
  EXPECT_FALSE(recorded_states(states).any().item<bool>());
  states[0][0][1][2] = kNan;  // written by a kernel
  states[0][0][0][0] = 1.5;
  const at::Tensor recorded = recorded_states(states);
  EXPECT_TRUE(recorded[0][0][1][2].item<bool>());
  EXPECT_TRUE(recorded[0][0][0][0].item<bool>());
  EXPECT_EQ(recorded.sum().item<int64_t>(), 2);
}

// Tiles 0..3 of 3 rows: m is +inf at tile 1 row 2, l NaN at tile 2 row 1, and
// tile 3 was never written. Ascending the first is tile 1 (m); descending, tile 2 (l).
TEST(TileStateOrigin, FirstNonFiniteStateInVisitingOrder) {
  at::Tensor m = at::zeros({1, 1, 3, 4}), l = at::ones({1, 1, 3, 4});
  m[0][0][0][0] = -kInf;  // nothing seen yet: finite enough
  l[0][0][0][0] = 0;
  m[0][0][2][1] = kInf;
  l[0][0][1][2] = kNan;
  at::Tensor recorded = at::ones({1, 1, 3, 4}, at::kBool);
  recorded.select(3, 3).fill_(false);
  m.select(3, 3).fill_(kNan);
  auto up = first_nonfinite_state(m, l, recorded, /*descending=*/false);
  ASSERT_TRUE(up.has_value());
  EXPECT_EQ(up->key_tile, 1);
  EXPECT_EQ(up->row, 2);
  EXPECT_EQ(up->statistic, "m");
  auto down = first_nonfinite_state(m, l, recorded, /*descending=*/true);
  ASSERT_TRUE(down.has_value());
  EXPECT_EQ(down->key_tile, 2);
  EXPECT_EQ(down->row, 1);
  EXPECT_EQ(down->statistic, "l");
  l[0][0][1][2] = 2.0;
  m[0][0][2][1] = 1.0;
  EXPECT_FALSE(first_nonfinite_state(m, l, recorded, false).has_value());
}

}  // namespace
}  // namespace flashlab
