#include "flashlab/harness/compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

#include "common/visible_keys.h"
#include "json_text.h"

namespace flashlab {
namespace {

std::string position_text(const ElementPosition& at) {
  std::ostringstream text;
  text << std::setprecision(6);
  if (at.packed_row >= 0)
    text << "(sequence " << at.batch << ", row " << at.row << " = packed row " << at.packed_row;
  else
    text << "(batch " << at.batch << ", row " << at.row;
  text << ", head " << at.head << ", col " << at.col << ") flat " << at.flat_index << ": got " << at.actual
       << ", expected " << at.expected;
  return text.str();
}

}  // namespace

SequenceRow sequence_row(const std::vector<int>& offsets, int64_t packed_row) {
  TORCH_CHECK(!offsets.empty() && packed_row >= 0 && packed_row < offsets.back(), "sequence_row: packed row ",
              packed_row, " outside the ", offsets.empty() ? 0 : offsets.back(), " packed rows");
  const int64_t sequence =
      std::upper_bound(offsets.begin(), offsets.end(), static_cast<int>(packed_row)) - offsets.begin() - 1;
  return {sequence, packed_row - offsets[sequence]};
}

TileContext TileContext::of_sequence(int64_t sequence) const {
  if (!varlen()) return *this;
  TORCH_CHECK(sequence >= 0 && sequence + 1 < static_cast<int64_t>(cu_seqlens_q.size()) &&
                  cu_seqlens_k.size() == cu_seqlens_q.size(),
              "TileContext::of_sequence: sequence ", sequence, " of a problem with ", cu_seqlens_q.size() - 1,
              " sequences (", cu_seqlens_k.size(), " key offsets)");
  TileContext context = *this;
  context.seqlen_q = cu_seqlens_q[sequence + 1] - cu_seqlens_q[sequence];
  context.seqlen_k = cu_seqlens_k[sequence + 1] - cu_seqlens_k[sequence];
  context.cu_seqlens_q.clear();
  context.cu_seqlens_k.clear();
  return context;
}

std::pair<int64_t, int64_t> visited_key_tiles(const TileContext& context, int64_t row) {
  if (context.tiles.block_k <= 0 || context.seqlen_k <= 0) return {0, -1};
  // The kernels' own rule (src/kernels/common/visible_keys.h).
  const KeyRange keys =
      visible_keys(static_cast<int>(row), static_cast<int>(context.seqlen_q),
                   static_cast<int>(context.seqlen_k), context.window_left, context.window_right);
  if (keys.empty()) return {0, -1};
  return {keys.first / context.tiles.block_k, keys.last / context.tiles.block_k};
}

std::pair<int64_t, int64_t> visiting_query_tiles(const TileContext& context, int64_t key) {
  if (context.tiles.block_q <= 0 || context.seqlen_q <= 0) return {0, -1};
  // The rows that see `key`, by the kernels' own rule: one interval (the
  // window moves right by one key per row).
  int64_t first_row = -1, last_row = -1;
  for (int64_t row = 0; row < context.seqlen_q; ++row) {
    const KeyRange keys =
        visible_keys(static_cast<int>(row), static_cast<int>(context.seqlen_q),
                     static_cast<int>(context.seqlen_k), context.window_left, context.window_right);
    if (!keys.contains(static_cast<int>(key))) continue;
    if (first_row < 0) first_row = row;
    last_row = row;
  }
  if (first_row < 0) return {0, -1};
  return {first_row / context.tiles.block_q, last_row / context.tiles.block_q};
}

ComparisonReport compare_elementwise(const std::string& name, const at::Tensor& actual,
                                     const at::Tensor& expected, double tolerance,
                                     const TileContext& context) {
  TORCH_CHECK(actual.dim() == 4, "compare_elementwise: '", name,
              "' must be 4-D (batch, row, head, col); got ", actual.sizes());
  TORCH_CHECK(actual.sizes() == expected.sizes(), "compare_elementwise: '", name,
              "' shapes differ: actual ", actual.sizes(), ", expected ", expected.sizes());
  const at::Tensor got = actual.detach().to(at::kCPU, at::kDouble).contiguous();
  const at::Tensor want = expected.detach().to(at::kCPU, at::kDouble).contiguous();
  const double* got_data = got.data_ptr<double>();
  const double* want_data = want.data_ptr<double>();
  const int64_t rows = got.size(1), heads = got.size(2), cols = got.size(3);

  ComparisonReport report;
  report.name = name;
  report.tolerance = tolerance;
  report.total = got.numel();
  report.context = context;
  for (int64_t index = 0; index < report.total; ++index) {
    const double a = got_data[index], e = want_data[index];
    bool bad = false;
    double error = 0;
    if (std::isnan(a) && !std::isnan(e)) {
      ++report.nan_count, bad = true;
    } else if (std::isinf(a) || std::isinf(e)) {
      if (a != e) ++(std::isinf(a) ? report.inf_count : report.over_tolerance), bad = true;
    } else {
      error = std::abs(a - e);
      if (error > tolerance) ++report.over_tolerance, bad = true;
    }
    if (!bad && error <= report.max_abs_error && (std::abs(e) < 1e-3 || error / std::abs(e) <= report.max_rel_error))
      continue;
    ElementPosition position;
    position.flat_index = index;
    position.col = index % cols;
    position.head = (index / cols) % heads;
    position.row = (index / (cols * heads)) % rows;
    position.batch = index / (cols * heads * rows);
    if (context.varlen()) {  // one batch of packed rows: name the sequence and its row
      const SequenceRow at =
          sequence_row(context.rows_are_keys ? context.cu_seqlens_k : context.cu_seqlens_q, position.row);
      position.packed_row = position.row;
      position.batch = at.sequence, position.row = at.row;
    }
    position.actual = a, position.expected = e, position.abs_error = error;
    if (bad) {
      if (!report.first_bad) report.first_bad = position;
      report.last_bad = position;
    }
    if (error > report.max_abs_error) report.max_abs_error = error, report.max_abs_at = position;
    if (std::abs(e) >= 1e-3 && error / std::abs(e) > report.max_rel_error)
      report.max_rel_error = error / std::abs(e), report.max_rel_at = position;
  }
  return report;
}

std::string ComparisonReport::format() const {
  std::ostringstream text;
  text << std::setprecision(4);
  text << name << ": " << (passed() ? "PASS" : "FAIL") << "  max abs err " << max_abs_error
       << " (tolerance " << tolerance << "), max rel err " << max_rel_error << ", "
       << over_tolerance << "/" << total << " over tolerance, " << nan_count << " NaN, "
       << inf_count << " inf\n";
  if (max_abs_error > 0) text << "  largest error at " << position_text(max_abs_at) << "\n";
  if (first_bad) {
    text << "  first bad element " << position_text(*first_bad) << "\n";
    const TileContext context = this->context.of_sequence(first_bad->batch);
    if (context.rows_are_keys && context.tiles.block_k > 0) {
      const int64_t key_tile = first_bad->row / context.tiles.block_k;
      text << "  it lies in key tile " << key_tile << " (keys " << key_tile * context.tiles.block_k
           << ".." << (key_tile + 1) * context.tiles.block_k - 1 << ", block_k "
           << context.tiles.block_k << ")";
      const auto [first_tile, last_tile] = visiting_query_tiles(context, first_bad->row);
      if (last_tile >= first_tile)
        text << "; the rows that see this key lie in query tiles " << first_tile << ".."
             << last_tile << " (block_q " << context.tiles.block_q << ")\n";
      else
        text << "; no query row sees this key (its gradient is 0)\n";
    } else if (!context.rows_are_keys && context.tiles.block_q > 0) {
      const int64_t query_tile = first_bad->row / context.tiles.block_q;
      text << "  it lies in query tile " << query_tile << " (rows "
           << query_tile * context.tiles.block_q << ".."
           << (query_tile + 1) * context.tiles.block_q - 1 << ", block_q "
           << context.tiles.block_q << ")";
      const auto [first_tile, last_tile] = visited_key_tiles(context, first_bad->row);
      if (last_tile >= first_tile)
        text << "; its row visits key tiles " << first_tile << ".." << last_tile << " (block_k "
             << context.tiles.block_k << ")\n";
      else
        text << "; its row sees no key (fully masked)\n";
    }
    text << "  bad elements span flat indices " << first_bad->flat_index << ".."
         << last_bad->flat_index << "\n";
  }
  if (nonfinite) text << nonfinite->format();
  return text.str();
}

std::string NonFiniteOrigin::format() const {
  std::ostringstream text;
  text << std::setprecision(6) << "  first NaN/inf: " << (varlen ? "sequence " : "batch ") << batch
       << ", " << (rows_are_keys ? "kv head " : "head ") << head << ", "
       << (rows_are_keys ? "key " : "row ") << row << ", col " << col << " = " << value << "\n";
  if (rows_are_keys) {
    text << "  its inputs: k and v rows " << (own_nonfinite == 0 ? "finite" : "hold ")
         << (own_nonfinite == 0 ? "" : std::to_string(own_nonfinite) + " non-finite values");
    if (seen_rows == 0)
      text << "; no query row sees this key";
    else {
      text << "; the query rows that see it (" << seen_rows << " (row, head) pairs, rows "
           << first_seen << ".." << last_seen << "): ";
      if (seen_nonfinite_rows == 0)
        text << "q finite";
      else
        text << seen_nonfinite_rows << " with a non-finite q, first row " << first_nonfinite_seen;
    }
  } else {
    text << "  its inputs: q row " << (own_nonfinite == 0 ? "finite" : "holds ")
         << (own_nonfinite == 0 ? "" : std::to_string(own_nonfinite) + " non-finite values");
    if (seen_rows == 0)
      text << "; it sees no key";
    else {
      text << "; the keys it sees (" << first_seen << ".." << last_seen << ", " << seen_rows
           << " rows of k and v): ";
      if (seen_nonfinite_rows == 0)
        text << "finite";
      else
        text << seen_nonfinite_rows << " with a non-finite value, first key " << first_nonfinite_seen;
    }
  }
  if (dout_nonfinite >= 0)
    text << "; dout " << (dout_nonfinite == 0 ? "finite" : std::to_string(dout_nonfinite) + " non-finite values");
  text << "\n";
  if (inputs_finite())
    text << "  -> finite inputs: the kernel made it (or never wrote it: outputs start as NaN); "
            "--trace-tiles names the first key tile whose m or l went non-finite\n";
  else
    text << "  -> the inputs already hold a NaN/inf that this element depends on\n";
  return text.str();
}

std::string ComparisonReport::first_bad_json() const {
  if (!first_bad) return "null";
  std::ostringstream text;
  text << std::setprecision(9) << "{\"batch\": " << first_bad->batch << ", \"row\": "
       << first_bad->row << ", \"head\": " << first_bad->head << ", \"col\": " << first_bad->col
       << ", \"flat_index\": " << first_bad->flat_index << ", \"actual\": "
       << (std::isfinite(first_bad->actual) ? std::to_string(first_bad->actual) : "null")
       << ", \"expected\": "
       << (std::isfinite(first_bad->expected) ? std::to_string(first_bad->expected) : "null");
  if (first_bad->packed_row >= 0)
    text << ", \"sequence\": " << first_bad->batch << ", \"packed_row\": " << first_bad->packed_row;
  const TileContext context = this->context.of_sequence(first_bad->batch);
  if (context.rows_are_keys && context.tiles.block_k > 0) {
    text << ", \"key_tile\": " << first_bad->row / context.tiles.block_k;
    const auto [first_tile, last_tile] = visiting_query_tiles(context, first_bad->row);
    if (last_tile >= first_tile)
      text << ", \"query_tiles\": [" << first_tile << ", " << last_tile << "]";
  } else if (!context.rows_are_keys && context.tiles.block_q > 0) {
    text << ", \"query_tile\": " << first_bad->row / context.tiles.block_q;
    const auto [first_tile, last_tile] = visited_key_tiles(context, first_bad->row);
    if (last_tile >= first_tile)
      text << ", \"key_tiles\": [" << first_tile << ", " << last_tile << "]";
  }
  text << "}";
  return text.str();
}

std::string ComparisonReport::to_json() const {
  std::ostringstream text;
  text << "{\"passed\": " << json::boolean(passed()) << ", \"max_abs_err\": "
       << json::number(max_abs_error) << ", \"max_rel_err\": " << json::number(max_rel_error)
       << ", \"tolerance\": " << json::number(tolerance) << ", \"over_tolerance\": "
       << over_tolerance << ", \"nan_count\": " << nan_count << ", \"inf_count\": " << inf_count
       << ", \"total\": " << total << ", \"first_bad\": " << first_bad_json() << "}";
  return text.str();
}

}  // namespace flashlab
