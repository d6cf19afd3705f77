#include "flashlab/harness/locate.h"

#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/problem_options.h"

#include <ATen/ATen.h>

#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

namespace flashlab {
namespace {

std::string join(const std::vector<int>& values, const char* separator = ",") {
  std::string text;
  for (const int value : values) text += (text.empty() ? "" : separator) + std::to_string(value);
  return text;
}

std::string triple(const int (&values)[3]) {
  return "(" + std::to_string(values[0]) + "," + std::to_string(values[1]) + "," +
         std::to_string(values[2]) + ")";
}

std::string replaced(std::string text, const std::string& name, const std::string& value) {
  for (size_t at; (at = text.find(name)) != std::string::npos;) text.replace(at, name.size(), value);
  return text;
}

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// "warp 2, lanes 16..19 (threads 80..83)": lanes of one warp, consecutive.
std::string threads_text(const std::vector<RegisterSlot>& slots) {
  std::ostringstream text;
  if (slots.size() == 1) {
    text << "thread " << triple(slots[0].thread) << " = warp " << slots[0].warp << " lane "
         << slots[0].lane;
  } else {
    text << "threads " << triple(slots.front().thread) << ".." << triple(slots.back().thread)
         << " = warp " << slots.front().warp << " lanes " << slots.front().lane << ".."
         << slots.back().lane;
  }
  return text.str();
}

}  // namespace

std::string run_options(const ProblemSpec& spec) {
  return problem_arguments(spec) + " --seed " + std::to_string(spec.seed);
}

int marker_line(const std::string& source, const std::string& marker, int offset) {
  std::ifstream file(source);
  std::string line;
  for (int number = 1; std::getline(file, line); ++number)
    if (line.find(marker) != std::string::npos) return number + offset;
  return 0;
}

namespace {
// The indices --locate takes, against the problem's shape.
void check_locate_indices(const ProblemSpec& spec, int batch, int head, int col) {
  const int batches = spec.is_varlen() ? static_cast<int>(spec.seqlens_q.size()) : spec.batch;
  TORCH_CHECK(batch >= 0 && batch < batches, "--locate: batch ", batch, " is out of range; the problem has ",
              batches, spec.is_varlen() ? " sequences" : " batch entries");
  TORCH_CHECK(head >= 0 && head < spec.heads, "--locate: head ", head, " is out of range; the problem has ",
              spec.heads, " heads");
  TORCH_CHECK(col >= 0 && col < spec.head_dim, "--locate: col ", col, " is out of range; head_dim is ",
              spec.head_dim);
}
}  // namespace

ElementLocation locate_element(const KernelVariant& kernel, const ProblemSpec& spec, int batch,
                               int head, int row, int col) {
  TORCH_CHECK(kernel.locate != nullptr, "kernel ", kernel.name,
              " does not describe where its elements live (KernelVariant::locate is not set)");
  check_locate_indices(spec, batch, head, col);
  return with_host_shape_params(
      spec, [](const ProblemSpec& shape_only, const ProblemInputs& inputs) { return forward_params(shape_only, inputs); },
      [&](const AttentionParams& params) { return kernel.locate(params, batch, head, row, col); });
}

int chosen_key_tile(const ElementLocation& location) {
  std::vector<int> seen;
  for (const int tile : location.key_tiles)
    if (tile >= location.row_first_tile && tile <= location.row_last_tile) seen.push_back(tile);
  if (seen.size() >= 2) return seen[1];
  if (!seen.empty()) return seen[0];
  return location.key_tiles.empty() ? -1 : location.key_tiles[0];
}

std::string format_location(const KernelVariant& kernel, const ProblemSpec& spec, int batch,
                            int head, int row, std::optional<int> col, const std::string& program) {
  const int column = col.value_or(0);
  const ElementLocation location = locate_element(kernel, spec, batch, head, row, column);
  std::ostringstream text;
  text << "locate: kernel " << kernel.name << ", batch " << batch << ", head " << head << ", row "
       << row << ", col " << column << (col ? "" : " (no COL given: column 0)") << "\n"
       << "problem " << spec.describe() << "\n";
  if (!location.unavailable.empty()) {
    text << "cannot locate: " << location.unavailable << "\n";
    return text.str();
  }
  text << "launch:  grid " << triple(location.grid) << ", block " << triple(location.block_threads)
       << " threads\n"
       << "block:   " << triple(location.block) << "  (" << location.block_note << ")\n"
       << "         query tile " << location.query_block << ", row " << row << " is row "
       << location.row_in_block << " of the tile\n";
  const RegisterSlot& out = location.out.front();
  text << "out[" << batch << "," << row << "," << head << "," << column << "]: "
       << threads_text(location.out) << ", " << out.name << "\n"
       << "         " << location.out_note << "\n";
  if (!col && location.out.size() == 1 && !out.index.empty())
    text << "         other columns: locate B,H,ROW,COL (columns 8n + 2t + {0,1} of a row sit in "
            "lane 4 * (row % 8) + t of the same quad for the tensor-core kernels)\n";
  text << "m (running max): " << threads_text(location.row_max) << ", "
       << location.row_max.front().name << "\n"
       << "l (running sum): " << threads_text(location.row_sum) << ", "
       << location.row_sum.front().name << "\n"
       << "         " << location.state_note << "\n";
  text << "key tiles (block_k " << location.block_k << "): the block visits ";
  if (location.key_tiles.empty()) {
    text << "none (every key is masked for its rows: out 0, lse -inf)\n";
  } else {
    text << join(location.key_tiles, ", ")
         << (kernel.key_tiles_descending ? " (from the last down)" : " (ascending)") << "; ";
    if (location.row_last_tile >= location.row_first_tile)
      text << "row " << row << " sees keys in tiles " << location.row_first_tile << ".."
           << location.row_last_tile << "\n";
    else
      text << "row " << row << " sees no key (fully masked: out 0, lse -inf)\n";
  }

  const int tile = chosen_key_tile(location);
  if (tile < 0 || location.stops.empty()) return text.str();
  const std::string problem = run_options(spec);
  text << "cuda-gdb (debug build: cmake --preset debug && cmake --build --preset debug), key tile "
       << tile << ":\n";
  int number = 0;
  for (const CudaGdbStop& stop : location.stops) {
    ++number;
    text << "stop " << number << (stop.needs_trace ? " (the traced instantiation: --trace-tiles)" : " (any build)")
         << ":\n";
    if (stop.fixed_length_only && spec.is_varlen()) {
      text << "  not for this problem: the traced build takes fixed-length problems only\n";
      continue;
    }
    const int line = marker_line(location.source, stop.marker, stop.line_offset);
    if (line == 0) {
      text << "  not in this source: no line of " << location.source << " holds '" << stop.marker
           << "' (yet)\n";
      continue;
    }
    const std::string tile_text = std::to_string(tile);
    text << "  CUDA_MODULE_LOADING=EAGER cuda-gdb --args " << program << " " << problem
         << " --repeat 0" << (stop.needs_trace ? " --trace-tiles" : "") << "\n"
         << "  (cuda-gdb) set cuda break_on_launch application\n"
         << "  (cuda-gdb) run\n"
         << "  (cuda-gdb) set cuda break_on_launch none\n"
         << "  (cuda-gdb) break " << base_name(location.source) << ":" << line << " if "
         << replaced(stop.condition, "{tile}", tile_text) << "\n"
         << "  (cuda-gdb) continue\n";
    const RegisterSlot& focus = stop.focus_needed ? out : location.row_max.front();
    if (stop.focus_needed)
      text << "  (cuda-gdb) cuda block " << triple(location.block) << " thread "
           << triple(focus.thread) << "\n";
    else
      text << "  (cuda-gdb) cuda kernel block thread      # the thread that stopped: expect block "
           << triple(location.block) << " thread " << triple(focus.thread) << "\n";
    for (const std::string& print : stop.prints) text << "  (cuda-gdb) print " << print << "\n";
    text << "  shows " << replaced(stop.what, "{tile}", tile_text) << "\n";
    if (location.row_sum.size() > 1 && stop.focus_needed)
      for (const RegisterSlot& lane : location.row_sum)
        if (lane.thread[0] != focus.thread[0])
          text << "  (cuda-gdb) cuda thread " << triple(lane.thread) << "\n"
               << "  (cuda-gdb) print " << lane.name << "\n";
  }
  if (spec.is_fp8()) {
    text << "expected: no tile trace for e4m3 (flashlab-run " << problem
         << " compares the output with the FP8 path's arithmetic)\n";
  } else if (!spec.is_varlen()) {
    text << "expected (float64): " << program << " " << problem << " --trace-tiles --show-state "
         << batch << "," << head << "," << row << "," << tile;
    if (!kernel.supports_tile_trace)
      text << "  (needs tile tracing, which " << kernel.name << " does not record yet)";
    text << "\n";
  }
  return text.str();
}

BackwardElementLocation locate_backward_element(const KernelVariant& kernel, const ProblemSpec& spec,
                                                bool deterministic, int batch, int head, int row, int col) {
  TORCH_CHECK(kernel.backward_locate != nullptr, "kernel ", kernel.name,
              " does not describe where its backward's elements live (KernelVariant::backward_locate is not set)");
  check_locate_indices(spec, batch, head, col);
  return with_host_shape_params(
      spec,
      [&](const ProblemSpec& shape_only, const ProblemInputs& inputs) {
        return backward_params(shape_only, inputs, {}, at::Tensor(), {}, deterministic);
      },
      [&](const AttentionBackwardParams& params) { return kernel.backward_locate(params, batch, head, row, col); });
}

std::string format_backward_location(const KernelVariant& kernel, const ProblemSpec& spec, bool deterministic,
                                     int batch, int head, int row, std::optional<int> col,
                                     const std::string& program) {
  const int column = col.value_or(0);
  const BackwardElementLocation location =
      locate_backward_element(kernel, spec, deterministic, batch, head, row, column);
  const int kv_head = head / (spec.heads / spec.kv_heads);
  std::ostringstream text;
  text << "locate (backward" << (deterministic ? ", deterministic" : "") << "): kernel " << kernel.name
       << ", batch " << batch << ", head " << head << " (kv head " << kv_head << "), row " << row << ", col "
       << column << (col ? "" : " (no COL given: column 0)") << "\n"
       << "problem " << spec.describe() << "\n"
       << "launch:  grid " << triple(location.grid) << ", block " << triple(location.block_threads)
       << " threads; " << location.block_q << " query rows a step, " << location.block_k << " keys a block\n";
  const auto slot_text = [](const RegisterSlot& slot) {
    return "thread " + triple(slot.thread) + " (warp " + std::to_string(slot.warp) + ", lane " +
           std::to_string(slot.lane) + "), " + slot.name;
  };
  const std::string element = "[" + std::to_string(batch) + "," + std::to_string(row) + ",";
  if (!location.keys_unavailable.empty()) {
    text << "dk/dv" << element << kv_head << "," << column << "]: " << location.keys_unavailable << "\n";
  } else {
    text << "dk/dv" << element << kv_head << "," << column << "]: key block " << location.key_block << ", "
         << (location.key_block_cta[0] >= 0 ? "block " + triple(location.key_block_cta)
                                            : std::string("the block that takes it from the tile counter"))
         << (location.key_block_tile >= 0 ? " (tile " + std::to_string(location.key_block_tile) + ")" : "") << "\n"
         << "         dk: " << slot_text(location.dk) << "\n"
         << "         dv: " << slot_text(location.dv) << "\n"
         << "         " << location.key_note << "\n"
         << "         the block walks " << location.walk_note << "\n";
  }
  if (!location.queries_unavailable.empty()) {
    text << "dq" << element << head << "," << column << "]: " << location.queries_unavailable << "\n";
  } else {
    text << "dq" << element << head << "," << column << "]: query block " << location.query_block << "; ";
    if (location.adding_key_blocks.empty())
      text << "no key block sees it (dq 0)\n";
    else
      text << "added by key blocks " << join(location.adding_key_blocks, ", ")
           << (location.dq_ordered ? " (in this order)" : " (in any order)") << "\n";
    text << "         in each: " << slot_text(location.dq) << "\n"
         << "         " << location.dq_note << "\n";
  }
  if (location.stops.empty()) return text.str();
  const std::string problem = run_options(spec);
  text << "cuda-gdb (debug build: cmake --preset debug && cmake --build --preset debug):\n";
  int number = 0;
  for (const CudaGdbStop& stop : location.stops) {
    ++number;
    const int line = marker_line(location.source, stop.marker, stop.line_offset);
    text << "stop " << number << ":\n";
    if (line == 0) {
      text << "  not in this source: no line of " << location.source << " holds '" << stop.marker << "'\n";
      continue;
    }
    text << "  CUDA_MODULE_LOADING=EAGER cuda-gdb --args " << program << " " << problem << " --backward"
         << (deterministic ? " --deterministic" : "") << " --repeat 0\n"
         << "  (cuda-gdb) set cuda break_on_launch application\n"
         << "  (cuda-gdb) run\n"
         << "  (cuda-gdb) set cuda break_on_launch none\n"
         << "  (cuda-gdb) break " << base_name(location.source) << ":" << line << " if " << stop.condition << "\n"
         << "  (cuda-gdb) continue\n";
    for (const std::string& print : stop.prints) text << "  (cuda-gdb) print " << print << "\n";
    text << "  shows " << stop.what << "\n";
  }
  return text.str();
}

}  // namespace flashlab
