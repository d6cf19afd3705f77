// Element-by-element comparison of a kernel result with a reference, reporting
// where it departs: (batch, row, head, col), the flat index, the kernel's query
// tile and the key tiles that row visits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

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
};

struct ElementPosition {
  int64_t batch = 0, row = 0, head = 0, col = 0;
  int64_t flat_index = 0;  // in the logical (batch, row, head, col) order
  double actual = 0, expected = 0, abs_error = 0;
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
