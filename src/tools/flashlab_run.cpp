// flashlab-run: one seeded problem through one kernel and the reference.
// Exit codes: 0 pass, 1 mismatch, 2 bad arguments, 3 no usable GPU.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <iomanip>
#include <vector>
#include <iostream>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/memory_report.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/tile_trace.h"

namespace {

constexpr int kExitPass = 0, kExitMismatch = 1, kExitBadArguments = 2, kExitNoGpu = 3;

const char* kUsage = R"(usage: flashlab-run [options]
  --kernel NAME          registered kernel or auto (default auto); --list-kernels lists them
  --batch B              (default 2)
  --heads H              query heads (default 8)
  --kv-heads HKV         key/value heads, H % HKV == 0 (default: H)
  --seqlen-q SQ          (default 113)
  --seqlen-k SK          (default: SQ)
  --seqlens L1,L2,...    variable-length batch: per-sequence query lengths (>= 0; replaces
                         --batch, --seqlen-q and --seqlen-k), inputs packed (total, H, D)
  --seqlens-k L1,L2,...  per-sequence key lengths, as many as --seqlens (default: --seqlens)
  --head-dim D           (default 64)
  --dtype fp32|fp16|bf16 (default fp16)
  --causal               bottom-right aligned causal mask
  --window-left N        sliding window, -1 = unbounded (default -1)
  --window-right N       (default -1)
  --softmax-scale X      (default 1/sqrt(D))
  --seed N               (default: a fresh seed, printed so the run can be repeated)
  --layout bshd|packed-qkv  packed-qkv: Q, K, V are views of one (B, S, H+2*HKV, D) tensor
  --float64-reference    compare against a float64 reference (always for fp32)
  --repeat N             timed launches for the median kernel time (default 20, 0 = no timing)
  --json                 print one JSON object last
  --trace-tiles          record the kernel's running max/sum per (row, key tile) and report the
                         first state that differs from a float64 online softmax (kernels that
                         support tracing; test-only kernels such as fa1_scalar_planted_bug allowed)
  --show-state B,H,R,T   with --trace-tiles: also print the expected m and l of batch B, head H,
                         row R after key tile T (what cuda-gdb should show)
  --memory               peak device memory of the kernel against naive attention at seqlens
                         256, 1024, 4096 (the other sizes from the options)
exit codes: 0 pass, 1 mismatch, 2 bad arguments, 3 no usable GPU
)";

long long parse_integer(std::string_view flag, const std::string& text);

struct Arguments {
  flashlab::ProblemSpec spec;
  bool json = false;
  int repeat = 20;
  bool trace_tiles = false;
  bool memory = false;
  std::vector<long long> show_state;  // batch, head, row, key tile
};

std::vector<long long> parse_integer_list(std::string_view flag, const std::string& text) {
  std::vector<long long> values;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    values.push_back(parse_integer(flag, text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

long long parse_integer(std::string_view flag, const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty())
    throw std::invalid_argument(std::string(flag) + " expects an integer, got '" + text + "'");
  return value;
}

// "100,0,513" -> {100, 0, 513}; every entry an integer >= 0.
std::vector<int> parse_lengths(std::string_view flag, const std::string& text) {
  std::vector<int> lengths;
  for (const long long length : parse_integer_list(flag, text)) {
    if (length < 0 || length > std::numeric_limits<int>::max())
      throw std::invalid_argument(std::string(flag) + " expects lengths from 0 to " +
                                  std::to_string(std::numeric_limits<int>::max()) + ", got " +
                                  std::to_string(length));
    lengths.push_back(static_cast<int>(length));
  }
  return lengths;
}

Arguments parse_arguments(int argc, char** argv) {
  Arguments arguments;
  auto& spec = arguments.spec;
  bool kv_heads_given = false, seqlen_k_given = false, seed_given = false;
  bool fixed_length_given = false;  // --batch, --seqlen-q or --seqlen-k
  for (int index = 1; index < argc; ++index) {
    const std::string_view flag = argv[index];
    auto value = [&]() -> std::string {
      if (index + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
      return argv[++index];
    };
    auto integer = [&]() { return static_cast<int>(parse_integer(flag, value())); };
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(kExitPass);
    } else if (flag == "--list-kernels") {
      for (const auto& kernel : flashlab::registered_kernels())
        std::cout << kernel.name << "\t" << kernel.summary << "\n";
      std::exit(kExitPass);
    } else if (flag == "--kernel") spec.kernel = value();
    else if (flag == "--batch") spec.batch = integer(), fixed_length_given = true;
    else if (flag == "--heads") spec.heads = integer();
    else if (flag == "--kv-heads") spec.kv_heads = integer(), kv_heads_given = true;
    else if (flag == "--seqlen-q") spec.seqlen_q = integer(), fixed_length_given = true;
    else if (flag == "--seqlen-k") spec.seqlen_k = integer(), seqlen_k_given = true, fixed_length_given = true;
    else if (flag == "--seqlens") spec.seqlens_q = parse_lengths(flag, value());
    else if (flag == "--seqlens-k") spec.seqlens_k = parse_lengths(flag, value());
    else if (flag == "--head-dim") spec.head_dim = integer();
    else if (flag == "--causal") spec.causal = true;
    else if (flag == "--window-left") spec.window_left = integer();
    else if (flag == "--window-right") spec.window_right = integer();
    else if (flag == "--float64-reference") spec.float64_reference = true;
    else if (flag == "--json") arguments.json = true;
    else if (flag == "--trace-tiles") arguments.trace_tiles = true;
    else if (flag == "--memory") arguments.memory = true;
    else if (flag == "--show-state") {
      arguments.show_state = parse_integer_list(flag, value());
      if (arguments.show_state.size() != 4)
        throw std::invalid_argument("--show-state expects B,H,ROW,TILE (four integers)");
    }
    else if (flag == "--repeat") arguments.repeat = integer();
    else if (flag == "--seed") spec.seed = static_cast<uint64_t>(parse_integer(flag, value())), seed_given = true;
    else if (flag == "--softmax-scale") {
      const std::string text = value();
      try {
        spec.softmax_scale = std::stod(text);
      } catch (const std::exception&) {
        throw std::invalid_argument("--softmax-scale expects a number, got '" + text + "'");
      }
    } else if (flag == "--dtype") {
      const std::string name = value();
      if (name == "fp32") spec.dtype = at::kFloat;
      else if (name == "fp16") spec.dtype = at::kHalf;
      else if (name == "bf16") spec.dtype = at::kBFloat16;
      else throw std::invalid_argument("--dtype expects fp32, fp16 or bf16, got '" + name + "'");
    } else if (flag == "--layout") {
      const std::string name = value();
      if (name == "bshd") spec.layout = flashlab::Layout::bshd;
      else if (name == "packed-qkv") spec.layout = flashlab::Layout::packed_qkv;
      else throw std::invalid_argument("--layout expects bshd or packed-qkv, got '" + name + "'");
    } else {
      throw std::invalid_argument("unknown option '" + std::string(flag) + "' (see --help)");
    }
  }
  if (!kv_heads_given) spec.kv_heads = spec.heads;
  if (!seqlen_k_given) spec.seqlen_k = spec.seqlen_q;
  if (!seed_given) spec.seed = std::random_device{}() % 1000000;
  if (!spec.seqlens_k.empty() && spec.seqlens_q.empty())
    throw std::invalid_argument("--seqlens-k needs --seqlens (the query lengths)");
  if (spec.is_varlen()) {
    if (fixed_length_given)
      throw std::invalid_argument(
          "--seqlens replaces --batch, --seqlen-q and --seqlen-k; give one or the other");
    if (spec.key_seqlens().size() != spec.seqlens_q.size())
      throw std::invalid_argument("--seqlens-k must give as many lengths as --seqlens; got " +
                                  std::to_string(spec.seqlens_k.size()) + " and " +
                                  std::to_string(spec.seqlens_q.size()));
    if (spec.layout == flashlab::Layout::packed_qkv && spec.key_seqlens() != spec.seqlens_q)
      throw std::invalid_argument("--layout packed-qkv needs --seqlens-k equal to --seqlens");
    if (arguments.trace_tiles || arguments.memory)
      throw std::invalid_argument("--trace-tiles and --memory take fixed-length problems, not --seqlens");
  }
  if (!spec.is_varlen() && spec.layout == flashlab::Layout::packed_qkv &&
      spec.seqlen_q != spec.seqlen_k)
    throw std::invalid_argument("--layout packed-qkv needs --seqlen-q == --seqlen-k");
  if (spec.batch < 1 || spec.heads < 1 || spec.kv_heads < 1 || spec.seqlen_q < 1 ||
      spec.seqlen_k < 1 || spec.head_dim < 1)
    throw std::invalid_argument("batch, heads, kv-heads, seqlens and head-dim must be >= 1");
  return arguments;
}

int run_tile_trace(const Arguments& arguments) {
  const flashlab::KernelVariant* kernel =
      arguments.spec.kernel == "auto" ? nullptr
                                      : flashlab::find_any_kernel(arguments.spec.kernel);
  TORCH_CHECK(kernel != nullptr, "--trace-tiles needs --kernel NAME of a kernel that records tile states; got '",
              arguments.spec.kernel, "'");
  const flashlab::TileTraceReport report = flashlab::trace_tiles(arguments.spec, *kernel);
  std::cout << report.format();
  if (!arguments.show_state.empty()) {
    const auto& at = arguments.show_state;
    const auto [row_max, row_sum] =
        flashlab::expected_state_at(arguments.spec, report.tiles.block_k, at[0], at[1], at[2], at[3],
                                    report.key_tiles_descending);
    std::cout << std::setprecision(9) << "expected state batch " << at[0] << " head " << at[1]
              << " row " << at[2] << " key_tile " << at[3] << ": m " << row_max << " l " << row_sum
              << "\n";
  }
  return report.matches() ? kExitPass : kExitMismatch;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  try {
    arguments = parse_arguments(argc, argv);
  } catch (const std::invalid_argument& error) {
    std::cerr << "flashlab-run: " << error.what() << "\n";
    return kExitBadArguments;
  }
  const std::string unavailable = flashlab::cuda_unavailable_reason();
  if (!unavailable.empty()) {
    std::cerr << "flashlab-run: cannot run: " << unavailable
              << ". flashlab-run needs an NVIDIA GPU (the CPU tests run without one: make test).\n";
    return kExitNoGpu;
  }
  std::cout << "seed " << arguments.spec.seed << " (pass --seed " << arguments.spec.seed
            << " to repeat this problem)\n";
  try {
    if (arguments.trace_tiles) return run_tile_trace(arguments);
    if (arguments.memory) {
      const auto rows = flashlab::measure_memory(arguments.spec, {256, 1024, 4096});
      std::cout << flashlab::format_memory_table(arguments.spec, rows);
      return kExitPass;
    }
  } catch (const c10::Error& error) {
    std::cerr << "flashlab-run: " << error.what_without_backtrace() << "\n";
    return kExitBadArguments;
  }
  flashlab::CheckResult result;
  try {
    flashlab::CheckOptions options;
    options.timed_launches = arguments.repeat;
    result = flashlab::check_kernel(arguments.spec, options);
  } catch (const c10::Error& error) {
    // Input validation: the problem or kernel choice is not runnable as given.
    std::cerr << "flashlab-run: " << error.what_without_backtrace() << "\n";
    return kExitBadArguments;
  } catch (const std::exception& error) {
    // A CUDA error during the launch or the check: the kernel is broken.
    std::cerr << "flashlab-run: kernel run failed: " << error.what() << "\n";
    return kExitMismatch;
  }
  std::cout << result.format();
  if (arguments.json) std::cout << result.to_json() << "\n";
  return result.passed() ? kExitPass : kExitMismatch;
}
