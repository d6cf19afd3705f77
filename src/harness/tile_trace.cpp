#include "flashlab/harness/tile_trace.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/reference.h"
#include "json_text.h"

namespace flashlab {
namespace {

constexpr double kMinusInfinity = -std::numeric_limits<double>::infinity();

// m and l are accumulated in float32 by kernels; the reference is float64.
constexpr double kRelativeTolerance = 1e-3;

at::Tensor states_differ(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor both_minus_infinity = (actual == kMinusInfinity) & (expected == kMinusInfinity);
  const at::Tensor error = (actual - expected).abs();
  const at::Tensor too_far = error > kRelativeTolerance * (1 + expected.abs());
  return (too_far | at::isnan(error)) & both_minus_infinity.logical_not();
}

// A quiet NaN with a payload no arithmetic produces (CUDA's NaN is 0x7fffffff).
constexpr int32_t kUnwrittenBits = 0x7fc0f1a5;

}  // namespace

at::Tensor unwritten_trace_states(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::full(sizes, kUnwrittenBits, options.dtype(at::kInt)).view(at::kFloat);
}

at::Tensor recorded_states(const at::Tensor& row_max) {
  return row_max.contiguous().view(at::kInt) != kUnwrittenBits;
}

std::optional<TileStateDifference> first_nonfinite_state(const at::Tensor& row_max,
                                                         const at::Tensor& row_sum,
                                                         const at::Tensor& recorded,
                                                         bool descending) {
  const at::Tensor m = row_max.to(at::kCPU, at::kDouble), l = row_sum.to(at::kCPU, at::kDouble);
  const at::Tensor m_bad = (at::isnan(m) | (m == std::numeric_limits<double>::infinity())) & recorded.cpu();
  const at::Tensor l_bad = at::isfinite(l).logical_not() & recorded.cpu();
  const at::Tensor states = (m_bad | l_bad).permute({3, 0, 1, 2}).nonzero();  // key tile first
  if (states.size(0) == 0) return std::nullopt;
  const int64_t key_tile = states.select(0, descending ? states.size(0) - 1 : 0)[0].item<int64_t>();
  const at::Tensor in_tile = (m_bad | l_bad).select(3, key_tile).nonzero().select(0, 0);
  TileStateDifference state;
  state.key_tile = key_tile;
  state.batch = in_tile[0].item<int64_t>();
  state.head = in_tile[1].item<int64_t>();
  state.row = in_tile[2].item<int64_t>();
  const bool max_is_bad = m_bad[state.batch][state.head][state.row][key_tile].item<bool>();
  state.statistic = max_is_bad ? "m" : "l";
  state.kernel_value = (max_is_bad ? m : l)[state.batch][state.head][state.row][key_tile].item<double>();
  state.expected_value = std::numeric_limits<double>::quiet_NaN();
  return state;
}

ExpectedTileStates expected_tile_states(const at::Tensor& q, const at::Tensor& k, double softmax_scale,
                                        int window_left, int window_right, int block_k,
                                        bool descending) {
  const int64_t heads = q.size(2), kv_heads = k.size(2), seqlen_q = q.size(1), seqlen_k = k.size(1);
  const int64_t key_tiles = (seqlen_k + block_k - 1) / block_k;
  const at::Tensor query = q.to(at::kDouble).transpose(1, 2);
  const at::Tensor key = k.to(at::kDouble).transpose(1, 2).repeat_interleave(heads / kv_heads, 1);
  at::Tensor scores = at::matmul(query, key.transpose(-2, -1)) * softmax_scale;
  const at::Tensor visible = visibility_mask(seqlen_q, seqlen_k, window_left, window_right, q.device());
  scores = scores.masked_fill(visible.logical_not(), kMinusInfinity);
  // Pad the key axis to whole tiles with masked keys: (B, H, Sq, tiles, block_k).
  scores = at::constant_pad_nd(scores, {0, key_tiles * block_k - seqlen_k}, kMinusInfinity)
               .view({scores.size(0), heads, seqlen_q, key_tiles, block_k});
  const at::Tensor tile_max = std::get<0>(scores.max(-1));
  const at::Tensor finite_tile = at::isfinite(tile_max);
  const at::Tensor safe_tile_max = at::where(finite_tile, tile_max, at::zeros_like(tile_max));
  const at::Tensor tile_sum = at::where(
      finite_tile, at::exp(scores - safe_tile_max.unsqueeze(-1)).sum(-1), at::zeros_like(tile_max));

  // The online recurrence, tile by tile, in float64.
  std::vector<at::Tensor> maxima(key_tiles), sums(key_tiles);
  at::Tensor running_max = at::full_like(tile_max.select(-1, 0), kMinusInfinity);
  at::Tensor running_sum = at::zeros_like(running_max);
  for (int64_t step = 0; step < key_tiles; ++step) {
    const int64_t tile = descending ? key_tiles - 1 - step : step;
    const at::Tensor this_max = tile_max.select(-1, tile);
    const at::Tensor new_max = at::maximum(running_max, this_max);
    const at::Tensor seen = at::isfinite(new_max);
    const at::Tensor safe_new = at::where(seen, new_max, at::zeros_like(new_max));
    auto rescaled = [&](const at::Tensor& from_max, const at::Tensor& value) {
      return at::where(at::isfinite(from_max), value * at::exp(from_max - safe_new), at::zeros_like(value));
    };
    running_sum = at::where(seen, rescaled(running_max, running_sum) +
                                      rescaled(this_max, tile_sum.select(-1, tile)),
                            at::zeros_like(running_sum));
    running_max = new_max;
    maxima[tile] = running_max;
    sums[tile] = running_sum;
  }
  return {at::stack(maxima, -1), at::stack(sums, -1)};
}

TileTraceReport trace_tiles(const ProblemSpec& spec, const KernelVariant& kernel) {
  TORCH_CHECK(kernel.supports_tile_trace, "kernel ", kernel.name,
              " does not record tile states (KernelVariant::supports_tile_trace)");
  const std::string unavailable = cuda_unavailable_reason();
  TORCH_CHECK(unavailable.empty(), "tile tracing needs a GPU: ", unavailable);
  const at::Device device = current_cuda_device();
  const ProblemInputs inputs = make_inputs(spec, device);
  const ForwardOutputs outputs = poisoned_forward_outputs(spec, inputs);
  AttentionParams params = forward_params(spec, inputs, outputs.out, outputs.lse);
  const TileShape tiles = kernel.tile_shape(params);
  // unwritten_trace_states marks (row, tile) states the kernel never wrote:
  // tiles skipped whole. A state it wrote as NaN counts as recorded.
  const at::Tensor row_max = unwritten_trace_states(
      {spec.batch, spec.heads, spec.seqlen_q, (spec.seqlen_k + tiles.block_k - 1) / tiles.block_k},
      inputs.q.options().dtype(at::kFloat));
  const at::Tensor row_sum = unwritten_trace_states(row_max.sizes(), row_max.options());
  params.trace.row_max = row_max.data_ptr<float>();
  params.trace.row_sum = row_sum.data_ptr<float>();
  params.trace.num_key_tiles = static_cast<int>(row_max.size(3));
  run_kernel(kernel, params);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  return tile_trace_report(kernel.name, spec, inputs, tiles, kernel.key_tiles_descending, row_max, row_sum);
}

TileTraceReport tile_trace_report(const std::string& name, const ProblemSpec& spec, const ProblemInputs& inputs,
                                  const TileShape& tiles, bool descending, const at::Tensor& row_max,
                                  const at::Tensor& row_sum) {
  TORCH_CHECK(!spec.is_varlen(), "tile traces take fixed-length problems, not varlen ones (", spec.describe(), ")");
  TORCH_CHECK(!spec.modified(), "tile traces are compared with online softmax of unmodified scores; the problem has "
              "softcap, ALiBi or sinks (", spec.describe(), ")");
  TORCH_CHECK(tiles.block_q > 0 && tiles.block_k > 0, "a tile trace needs the tile shape (block_q, block_k > 0); got ",
              tiles.block_q, "x", tiles.block_k);
  TileTraceReport report;
  report.kernel = name;
  report.problem = spec.describe();
  report.tiles = tiles;
  report.key_tiles_descending = descending;
  report.key_tiles = (spec.seqlen_k + tiles.block_k - 1) / tiles.block_k;
  const std::vector<int64_t> expected_shape{spec.batch, spec.heads, spec.seqlen_q, report.key_tiles};
  for (const at::Tensor* states : {&row_max, &row_sum})
    TORCH_CHECK(states->sizes() == at::IntArrayRef(expected_shape) && states->scalar_type() == at::kFloat,
                "tile-state buffers are float32 (batch, heads, seqlen_q, key tiles) = ",
                at::IntArrayRef(expected_shape), "; got ", states->sizes(), " ", states->scalar_type());
  const AttentionParams params = forward_params(spec, inputs);
  const ExpectedTileStates expected = expected_tile_states(
      inputs.q, inputs.k, params.softmax_scale, params.window_left, params.window_right, tiles.block_k, descending);
  const at::Tensor recorded = recorded_states(row_max);
  const at::Tensor max_differs = states_differ(row_max.to(at::kDouble), expected.row_max) & recorded;
  const at::Tensor sum_differs = states_differ(row_sum.to(at::kDouble), expected.row_sum) & recorded;
  report.recorded = recorded.sum().item<int64_t>();
  report.differing = (max_differs | sum_differs).sum().item<int64_t>();
  report.first_nonfinite = first_nonfinite_state(row_max, row_sum, recorded, descending);
  if (report.differing == 0) return report;

  // The earliest key tile where any row departs is where the bug starts; within
  // it a wrong running max comes before a wrong sum (l is rescaled by m).
  const at::Tensor any_differs = (max_differs | sum_differs).permute({3, 0, 1, 2}).cpu();
  const at::Tensor differing_states = any_differs.nonzero();  // sorted by key tile first
  const int64_t key_tile =
      differing_states.select(0, descending ? differing_states.size(0) - 1 : 0)[0].item<int64_t>();
  const at::Tensor max_in_tile = max_differs.select(3, key_tile).cpu();
  const bool max_is_wrong = max_in_tile.any().item<bool>();
  const at::Tensor first = (max_is_wrong ? max_in_tile : sum_differs.select(3, key_tile).cpu())
                               .nonzero()
                               .select(0, 0);
  TileStateDifference difference;
  difference.key_tile = key_tile;
  difference.batch = first[0].item<int64_t>();
  difference.head = first[1].item<int64_t>();
  difference.row = first[2].item<int64_t>();
  difference.statistic = max_is_wrong ? "m" : "l";
  const at::Tensor& kernel_values = max_is_wrong ? row_max : row_sum;
  const at::Tensor& expected_values = max_is_wrong ? expected.row_max : expected.row_sum;
  difference.kernel_value =
      kernel_values[difference.batch][difference.head][difference.row][difference.key_tile].item<double>();
  difference.expected_value =
      expected_values[difference.batch][difference.head][difference.row][difference.key_tile].item<double>();
  report.first_difference = difference;
  return report;
}

std::pair<double, double> expected_state_at(const ProblemSpec& spec, int block_k, int64_t batch,
                                            int64_t head, int64_t row, int64_t key_tile,
                                            bool descending) {
  const ProblemInputs inputs = make_inputs(spec, current_cuda_device());
  const AttentionParams params =
      make_params(inputs.q, inputs.k, inputs.v, {}, {}, spec.attention_options());
  const ExpectedTileStates expected =
      expected_tile_states(inputs.q, inputs.k, params.softmax_scale, params.window_left,
                           params.window_right, block_k, descending);
  return {expected.row_max[batch][head][row][key_tile].item<double>(),
          expected.row_sum[batch][head][row][key_tile].item<double>()};
}

std::string TileTraceReport::format() const {
  std::ostringstream text;
  text << std::setprecision(7);
  text << "tile-state diff: kernel " << kernel << " (block_q " << tiles.block_q << ", block_k "
       << tiles.block_k << ", " << key_tiles << " key tiles)\n"
       << "problem " << problem << "\n"
       << recorded << " recorded (row, key tile) states compared with float64 online softmax, "
       << differing << " differ\n";
  if (first_difference) {
    const auto& d = *first_difference;
    text << "first difference: key tile " << d.key_tile << " (keys " << d.key_tile * tiles.block_k
         << ".." << (d.key_tile + 1) * tiles.block_k - 1 << "), batch " << d.batch << ", head "
         << d.head << ", row " << d.row << " (query tile " << d.row / tiles.block_q
         << "), statistic " << d.statistic << (d.statistic == "m" ? " (running max)" : " (running sum)")
         << ": kernel " << d.kernel_value << ", expected " << d.expected_value << "\n";
    const int64_t visited_before = key_tiles_descending ? key_tiles - 1 - d.key_tile : d.key_tile;
    if (visited_before > 0)
      text << "every state " << (key_tiles_descending ? "from the last key tile down to " : "up to ")
           << "key tile " << (key_tiles_descending ? d.key_tile + 1 : d.key_tile - 1)
           << " matches: look at what carries the state from one key tile to the next\n";
  } else if (recorded > 0) {
    text << "all recorded states match\n";
  } else {
    text << "the kernel recorded no state: nothing to compare (does it write the trace buffers?)\n";
  }
  if (first_nonfinite) {
    const auto& d = *first_nonfinite;
    text << "first non-finite state (visiting order): key tile " << d.key_tile << " (keys "
         << d.key_tile * tiles.block_k << ".." << (d.key_tile + 1) * tiles.block_k - 1 << "), batch "
         << d.batch << ", head " << d.head << ", row " << d.row << ", statistic " << d.statistic
         << (d.statistic == "m" ? " (running max)" : " (running sum)") << " = " << d.kernel_value
         << "\n";
  } else if (recorded > 0) {
    text << "no recorded m or l is NaN or inf\n";
  }
  return text.str();
}

std::string TileTraceReport::to_json() const {
  std::ostringstream text;
  text << std::setprecision(9);
  const auto state = [&](const std::optional<TileStateDifference>& d) {
    if (!d) return std::string("null");
    std::ostringstream entry;
    entry << std::setprecision(9) << "{\"key_tile\": " << d->key_tile << ", \"batch\": " << d->batch
          << ", \"head\": " << d->head << ", \"row\": " << d->row << ", \"statistic\": \"" << d->statistic
          << "\", \"kernel\": " << json::number(d->kernel_value) << ", \"expected\": "
          << json::number(d->expected_value) << "}";
    return entry.str();
  };
  text << "{\"matches\": " << (matches() ? "true" : "false") << ", \"kernel\": " << json::string(kernel)
       << ", \"problem\": " << json::string(problem) << ", \"block_q\": " << tiles.block_q
       << ", \"block_k\": " << tiles.block_k << ", \"key_tiles\": " << key_tiles
       << ", \"recorded\": " << recorded << ", \"differing\": " << differing
       << ", \"first_difference\": " << state(first_difference)
       << ", \"first_nonfinite\": " << state(first_nonfinite) << "}";
  return text.str();
}

}  // namespace flashlab
