// Element-by-element comparison of a kernel result with a reference, reporting
// where it departs: (batch, row, head, col), the flat index, the kernel's query
// tile and the key tiles that row visits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/kernel_registry.h"

namespace flashlab {

// What the compared tensors' axes mean, so positions can be named in tiles.
struct TileContext {
  TileShape tiles;  // the kernel's block sizes; zeros when unknown
  int64_t seqlen_q = 0, seqlen_k = 0;
  int window_left = -1, window_right = -1;
  // The compared rows are keys (dk, dv: (batch, key, kv head, col)): a row's
  // tile is row / block_k, and the report names the query tiles whose rows see
  // that key. Otherwise rows are queries (out, lse, dq).
  bool rows_are_keys = false;
  // Varlen: the packed rows' sequence offsets, query and key (batch + 1 entries
  // each; both empty otherwise). Positions then name the sequence (as batch)
  // and the row within it, and tiles count from the sequence's first row, as
  // the kernels do.
  std::vector<int> cu_seqlens_q, cu_seqlens_k;

  bool varlen() const { return !cu_seqlens_q.empty(); }
  // The context of one sequence of a varlen problem (its seqlen_q/k; itself otherwise).
  TileContext of_sequence(int64_t sequence) const;
};

// The sequence holding row `packed_row` of packed rows with these offsets
// (empty sequences skipped) and the row within it.
struct SequenceRow {
  int64_t sequence = 0, row = 0;
};
SequenceRow sequence_row(const std::vector<int>& offsets, int64_t packed_row);

struct ElementPosition {
  // Varlen: batch is the sequence, row the row within it, packed_row the row
  // of the packed tensor (-1 otherwise).
  int64_t batch = 0, row = 0, head = 0, col = 0;
  int64_t packed_row = -1;
  int64_t flat_index = 0;  // in the logical (batch, row, head, col) order (varlen: packed rows)
  double actual = 0, expected = 0, abs_error = 0;
};

// Where the first NaN/inf of a kernel's tensor sits (one the reference does
// not have) and whether the inputs its row depends on were finite: set by
// explain_nonfinite (problem.h), printed by ComparisonReport::format.
struct NonFiniteOrigin {
  // Rows within their sequence (varlen: batch is the sequence); for key rows
  // (dk, dv) head is the kv head and row a key.
  int64_t batch = 0, head = 0, row = 0, col = 0;
  double value = 0;
  bool rows_are_keys = false;
  bool varlen = false;
  // Query rows: the q row's non-finite values; key rows: the k and v rows'.
  int64_t own_nonfinite = 0;
  // Query rows: the keys the row sees (k and v rows of its kv head); key rows:
  // the (query row, head) pairs of the kv head's group that see the key (their q rows).
  int64_t seen_rows = 0;
  int64_t seen_nonfinite_rows = 0;  // of those, rows with a non-finite value
  int64_t first_seen = -1, last_seen = -1;     // the seen keys (query rows: key interval)
  int64_t first_nonfinite_seen = -1;           // the first such key or query row
  int64_t dout_nonfinite = -1;  // backward: non-finite values of the row's dout (key rows: of the rows that see it); -1: no dout
  bool inputs_finite() const {
    return own_nonfinite == 0 && seen_nonfinite_rows == 0 && dout_nonfinite <= 0;
  }
  std::string format() const;  // lines, two-space indented
};

struct ComparisonReport {
  std::string name;  // "out", "lse"
  double tolerance = 0;
  int64_t total = 0;
  int64_t over_tolerance = 0;
  int64_t nan_count = 0;  // NaN where the reference is not NaN (poison never overwritten, or bad math)
  int64_t inf_count = 0;  // +-inf where the reference holds something else
  double max_abs_error = 0;
  ElementPosition max_abs_at;
  double max_rel_error = 0;  // over elements with |expected| >= 1e-3
  ElementPosition max_rel_at;
  std::optional<ElementPosition> first_bad, last_bad;
  TileContext context;
  std::optional<NonFiniteOrigin> nonfinite;  // when some element is NaN/inf (explain_nonfinite)

  bool passed() const { return over_tolerance == 0 && nan_count == 0 && inf_count == 0; }
  std::string format() const;  // multi-line, human readable
  std::string first_bad_json() const;  // JSON object or null
  // {"passed", "max_abs_err", "max_rel_err", "tolerance", "over_tolerance",
  // "nan_count", "inf_count", "total", "first_bad"}
  std::string to_json() const;
};

// actual and expected: 4-D (batch, row, head, col), any dtype and device, same shape.
// An element is bad when it is NaN/inf while the reference is not, or when
// |actual - expected| > tolerance. Equal infinities (-inf LSE of a fully masked
// row) match.
ComparisonReport compare_elementwise(const std::string& name, const at::Tensor& actual,
                                     const at::Tensor& expected, double tolerance,
                                     const TileContext& context = {});

// First and last key tile that query `row` of the context visits; last < first if none.
std::pair<int64_t, int64_t> visited_key_tiles(const TileContext& context, int64_t row);
// First and last query tile holding a row that sees key `key` (the query tiles
// whose backward work touches that key's dk/dv); last < first if no row sees it.
std::pair<int64_t, int64_t> visiting_query_tiles(const TileContext& context, int64_t key);

}  // namespace flashlab
