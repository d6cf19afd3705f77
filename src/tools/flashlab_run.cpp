// flashlab-run: one seeded problem through one kernel and the reference.
// Exit codes: 0 pass, 1 mismatch, 2 bad arguments, 3 no usable GPU.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <vector>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/arguments.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/kvcache_check.h"
#include "flashlab/harness/locate.h"
#include "flashlab/harness/memory_report.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/problem_options.h"
#include "flashlab/harness/tile_trace.h"

namespace {

constexpr int kExitPass = 0, kExitMismatch = 1, kExitBadArguments = 2, kExitNoGpu = 3;

struct Arguments {
  flashlab::ProblemSpec spec;
  int device = -1;  // --device: -1 the current CUDA device
  bool json = false;
  int repeat = 20;
  bool trace_tiles = false;
  bool memory = false;
  bool backward = false;       // forward then backward: out, lse, dq, dk, dv
  bool deterministic = false;  // BackwardOptions::deterministic
  std::vector<int> show_state;  // batch, head, row, key tile
  std::vector<int> show_element;  // batch, head, row, col (--backward)
  std::vector<int> locate;      // batch, head, row[, col]
  bool kvcache = false;         // decoding with a KV cache: kvcache_spec, not spec, is the problem
  flashlab::KvCacheSpec kvcache_spec;
  bool timeline = false;        // --kvcache: the split kernel's block timeline
  std::string timeline_csv;     // and its records, a line per block
};

constexpr int kIntMax = std::numeric_limits<int>::max();
// The capacity --cache-seqlens random draws lengths under when --seqlen-k is not given.
constexpr int kDefaultRandomCapacity = 4096;

// The KV-cache problem from the forward's options (--seqlen-k: the capacity)
// and the --kvcache ones. Throws flashlab::ArgumentError.
flashlab::KvCacheSpec kvcache_spec(const flashlab::ProblemSpec& spec, bool seqlen_q_given,
                                   bool seqlen_k_given, const std::optional<std::string>& lengths_text,
                                   int page_size, int num_splits, int append, bool cpu_reference) {
  using flashlab::ArgumentError;
  flashlab::KvCacheSpec kv;
  kv.kernel = spec.kernel;
  kv.batch = spec.batch, kv.heads = spec.heads, kv.kv_heads = spec.kv_heads;
  kv.seqlen_q = seqlen_q_given ? spec.seqlen_q : 1;  // a decode step unless told otherwise
  kv.head_dim = spec.head_dim;
  kv.dtype = spec.dtype;
  kv.causal = spec.causal;
  kv.softmax_scale = spec.softmax_scale;
  kv.window_left = spec.window_left, kv.window_right = spec.window_right;
  kv.seed = spec.seed;
  kv.float64_reference = spec.float64_reference;
  kv.softcap = spec.softcap, kv.alibi = spec.alibi, kv.sinks = spec.sinks;
  kv.cpu_reference = cpu_reference;
  kv.page_size = page_size, kv.num_splits = num_splits, kv.seqlen_new = append;
  const std::string text = lengths_text.value_or("random");
  if (text == "random") {
    kv.capacity = seqlen_k_given ? spec.seqlen_k : kDefaultRandomCapacity;
    if (append > kv.resolved_capacity())
      throw ArgumentError("--append " + std::to_string(append) + " is more rows than the cache holds (capacity " +
                          std::to_string(kv.resolved_capacity()) + "; --seqlen-k sets it)");
    kv.cache_seqlens = flashlab::random_cache_seqlens(kv.batch, kv.resolved_capacity(), append, kv.seed);
  } else {
    try {
      kv.cache_seqlens = flashlab::parse_int_list("--cache-seqlens", text, 0, kIntMax);
    } catch (const ArgumentError&) {
      throw ArgumentError("--cache-seqlens expects lengths >= 0 (L1,L2,... one per sequence, or one for all) "
                          "or random; got '" + text + "'");
    }
    if (kv.cache_seqlens.size() == 1) kv.cache_seqlens.assign(kv.batch, kv.cache_seqlens.front());
    if (static_cast<int>(kv.cache_seqlens.size()) != kv.batch)
      throw ArgumentError("--cache-seqlens gives " + std::to_string(kv.cache_seqlens.size()) +
                          " lengths for --batch " + std::to_string(kv.batch) +
                          "; give one per sequence or one for all");
    kv.capacity = seqlen_k_given ? spec.seqlen_k : 0;  // 0: the least that fits
  }
  const std::string invalid = kv.invalid_reason();
  if (!invalid.empty())
    throw ArgumentError("--cache-seqlens and --append do not fit the cache: " + invalid +
                        " (--seqlen-k sets the capacity)");
  return kv;
}

// Throws flashlab::ArgumentError (exit 2). Returns nothing for --help / --list-kernels
// (printed here; exit 0).
std::optional<Arguments> parse_arguments(int argc, char** argv) {
  Arguments arguments;
  flashlab::ProblemOptions problem;  // the problem's options: arguments.spec once finished
  auto& spec = problem.spec;
  bool list_kernels = false;
  // --kvcache's own options.
  std::optional<std::string> cache_seqlens;
  int page_size = 0, num_splits = 0, append = 0;
  bool cpu_reference = false;
  bool kvcache_option_given = false;
  using flashlab::parse_int;
  flashlab::ArgumentParser parser(
      "flashlab-run", "One seeded problem through one kernel and the reference, with the report.",
      "exit codes: 0 pass, 1 mismatch (or a CUDA error in the kernel), 2 bad arguments or a problem "
      "the kernel does not take, 3 no usable GPU\n");
  parser
      .option("--kernel", "NAME",
              "a registered kernel, a developer kernel (planted bug, tuning) or auto (default auto)",
              [&](const std::string& v) { spec.kernel = v; })
      .flag("--list-kernels", "list the registered and developer kernels", [&] { list_kernels = true; });
  flashlab::add_problem_options(parser, problem);
  parser
      .option("--device", "N", "the CUDA device to run on (default: the current one, 0 unless\nCUDA_VISIBLE_DEVICES says otherwise)",
              [&](const std::string& v) { arguments.device = parse_int("--device", v, 0, kIntMax); })
      .option("--repeat", "N", "timed launches for the median kernel time (default 20, 0 = no timing)",
              [&](const std::string& v) { arguments.repeat = parse_int("--repeat", v, 0, kIntMax); })
      .flag("--json", "print one JSON object last", [&] { arguments.json = true; })
      .flag("--trace-tiles",
            "record the kernel's running max/sum per (row, key tile) and report the\nfirst state that "
            "differs from a float64 online softmax (kernels that\nsupport tracing; test-only kernels such "
            "as fa1_scalar_planted_bug allowed)",
            [&] { arguments.trace_tiles = true; })
      .option("--show-state", "B,H,R,T",
              "with --trace-tiles: also print the expected m and l of batch B, head H,\nrow R after key "
              "tile T (what cuda-gdb should show)",
              [&](const std::string& v) {
                arguments.show_state = flashlab::parse_int_list("--show-state", v, 0, kIntMax);
                if (arguments.show_state.size() != 4)
                  throw flashlab::ArgumentError("--show-state expects B,H,ROW,TILE (four integers), got '" + v + "'");
              })
      .option("--locate", "B,H,ROW[,COL]",
              "print where out[B, ROW, H, COL] and the row's running max/sum live in\nthe kernel "
              "(block, warp, lanes, register slots), the key tiles its\nblock visits and the cuda-gdb "
              "commands that stop there; runs\nnothing, needs no GPU (--kernel NAME; ROW counts within "
              "sequence B);\nwith --backward: where dK/dV of key row ROW (kv head H / group) and\ndQ of "
              "query row ROW live (--deterministic: that mode's order)",
              [&](const std::string& v) {
                arguments.locate = flashlab::parse_int_list("--locate", v, 0, kIntMax);
                if (arguments.locate.size() != 3 && arguments.locate.size() != 4)
                  throw flashlab::ArgumentError("--locate expects B,H,ROW or B,H,ROW,COL, got '" + v + "'");
              })
      .flag("--memory",
            "peak device memory of the kernel against naive attention at seqlens\n256, 1024, 4096 (the "
            "other sizes from the options)",
            [&] { arguments.memory = true; })
      .flag("--backward",
            "forward then backward (dout normal(0, 1) from the seed): reports out, lse,\ndq, dk, dv "
            "against autograd through the reference (kernels with a\nbackward pass); with --memory, "
            "forward + backward memory too",
            [&] { arguments.backward = true; })
      .flag("--deterministic", "with --backward: the deterministic backward (bitwise reproducible dq)",
            [&] { arguments.deterministic = true; })
      .option("--show-element", "B,H,ROW,COL",
              "with --backward: also print the kernel's and the reference's dk, dv of key\nrow ROW (kv "
              "head H / group) and dq of query row ROW at column COL (what\ncuda-gdb should show at "
              "--locate's stops)",
              [&](const std::string& v) {
                arguments.show_element = flashlab::parse_int_list("--show-element", v, 0, kIntMax);
                if (arguments.show_element.size() != 4)
                  throw flashlab::ArgumentError("--show-element expects B,H,ROW,COL (four integers), got '" + v +
                                                "'");
              })
      .flag("--kvcache",
            "decoding with a KV cache (attention_with_kvcache): --seqlen-q query rows\n(default 1) a "
            "sequence against its cache of --seqlen-k rows (the\ncapacity; default: the least that fits); "
            "reports out, lse and the caches",
            [&] { arguments.kvcache = true; })
      .option("--cache-seqlens", "L1,L2,...|L|random",
              "with --kvcache: rows cached before the append, one per sequence, one\nfor all, or random "
              "(seeded, 0 to capacity - append; capacity --seqlen-k,\ndefault 4096) (default random)",
              [&](const std::string& v) { cache_seqlens = v, kvcache_option_given = true; })
      .option("--page-size", "N", "with --kvcache: a paged cache of N-row pages (0 = contiguous, default 0)",
              [&](const std::string& v) {
                page_size = parse_int("--page-size", v, 0, kIntMax), kvcache_option_given = true;
              })
      .option("--num-splits", "N", "with --kvcache: splits of each sequence's keys (0 = the kernel's heuristic, default 0)",
              [&](const std::string& v) {
                num_splits = parse_int("--num-splits", v, 0, kIntMax), kvcache_option_given = true;
              })
      .option("--append", "N", "with --kvcache: new k/v rows a sequence, written into the cache at\nits "
              "cached length before attending (default 0)",
              [&](const std::string& v) {
                append = parse_int("--append", v, 0, kIntMax), kvcache_option_given = true;
              })
      .flag("--cpu-reference",
            "with --kvcache: compute the references on the CPU (the sanitizer's\nracecheck runs: "
            "compute-sanitizer 13.0 fails cuBLAS's fp16 GEMM under racecheck)",
            [&] { cpu_reference = true, kvcache_option_given = true; })
      .flag("--timeline",
            "with --kvcache: one more launch, after an L2 flush, recording when each\nblock of the split "
            "kernel starts and ends and on which SM; prints how\nevenly the grid kept the SMs busy",
            [&] { arguments.timeline = true, kvcache_option_given = true; })
      .option("--timeline-csv", "FILE",
              "with --kvcache: --timeline, and its records to FILE\n(block,sm,start_us,end_us; "
              "scripts/plot_timeline.py draws them)",
              [&](const std::string& v) {
                arguments.timeline = true, arguments.timeline_csv = v, kvcache_option_given = true;
              });
  if (parser.parse(argc, argv).help) {
    std::cout << parser.usage();
    return std::nullopt;
  }
  if (list_kernels) {
    for (const auto& kernel : flashlab::registered_kernels())
      std::cout << kernel.name << "\t" << kernel.summary << "\n";
    std::cout << "developer kernels (by name only; never picked by auto):\n";
    for (const auto* list : {&flashlab::test_only_kernels(), &flashlab::tuning_kernels()})
      for (const auto& kernel : *list) std::cout << kernel.name << "\t" << kernel.summary << "\n";
    return std::nullopt;
  }
  using flashlab::ArgumentError;
  flashlab::finish_problem_options(problem);
  if (spec.is_varlen() && (arguments.trace_tiles || arguments.memory))
    throw ArgumentError("--trace-tiles and --memory take fixed-length problems, not --seqlens");
  if (spec.is_fp8() && (arguments.backward || arguments.kvcache || arguments.trace_tiles || arguments.memory))
    throw ArgumentError("--dtype e4m3 is the FP8 forward: it goes with the forward check and --locate, not "
                        "--backward, --kvcache, --trace-tiles or --memory");
  if (spec.outliers && arguments.kvcache)
    throw ArgumentError("--outliers goes with the forward and --backward checks, --trace-tiles and --memory "
                        "(--kvcache draws its caches its own way)");
  if (kvcache_option_given && !arguments.kvcache)
    throw ArgumentError("--cache-seqlens, --page-size, --num-splits, --append, --cpu-reference and --timeline go "
                        "with --kvcache");
  if (arguments.kvcache) {
    if (spec.is_varlen())
      throw ArgumentError("--kvcache takes a fixed-length batch (--batch; the keys come from --cache-seqlens), "
                          "not --seqlens");
    if (spec.layout == flashlab::Layout::packed_qkv)
      throw ArgumentError("--kvcache takes the bshd layout (the caches are tensors of their own), not --layout "
                          "packed-qkv");
    if (arguments.backward || arguments.trace_tiles || !arguments.locate.empty())
      throw ArgumentError("--kvcache checks the decoding forward; it takes no --backward, --trace-tiles or --locate");
    arguments.kvcache_spec =
        kvcache_spec(spec, problem.seqlen_q_given, problem.seqlen_k_given, cache_seqlens, page_size, num_splits, append,
                     cpu_reference);
    if (!arguments.timeline_csv.empty() && !std::ofstream(arguments.timeline_csv))
      throw ArgumentError("cannot write --timeline-csv " + arguments.timeline_csv +
                          " (a file path in a writable directory)");
  }
  if (!arguments.show_state.empty() && !arguments.trace_tiles)
    throw ArgumentError("--show-state goes with --trace-tiles");
  if (arguments.deterministic && !arguments.backward)
    throw ArgumentError("--deterministic goes with --backward");
  if (spec.modified() && (arguments.trace_tiles || arguments.memory))
    throw ArgumentError("--softcap, --alibi and --sinks go with the forward, --backward and --kvcache checks "
                        "and --locate (not --trace-tiles: traces are recorded without modifications; not "
                        "--memory)");
  if (!arguments.show_element.empty() && !arguments.backward)
    throw ArgumentError("--show-element goes with --backward");
  if (!arguments.locate.empty()) {
    if (spec.kernel == "auto")
      throw ArgumentError("--locate needs --kernel NAME: the layout is the kernel's");
    if (arguments.trace_tiles || arguments.memory || arguments.json)
      throw ArgumentError("--locate runs nothing; leave out --trace-tiles, --memory and --json");
  }
  if (arguments.backward && arguments.trace_tiles)
    throw ArgumentError("--trace-tiles traces the forward's tile states; leave out --backward");
  arguments.spec = spec;
  return arguments;
}

// flashlab-run runs a kernel at its own head dims (run_kernel); the public
// entries pad. When the kernel takes the problem at the head dim
// attention_forward would pad it to, a line saying so; else empty.
std::string padding_hint(const flashlab::KernelVariant& kernel, const Arguments& arguments) {
  const int head_dim = arguments.spec.head_dim;
  const int padded = flashlab::padded_head_dim(kernel, head_dim);
  if (padded <= 0 || padded == head_dim) return {};
  flashlab::ProblemSpec at_padded = arguments.spec;
  at_padded.head_dim = padded;
  const std::string reason = arguments.backward
                                 ? flashlab::backward_unsupported_reason(kernel, at_padded)
                                 : flashlab::unsupported_reason(kernel, at_padded);
  if (!reason.empty()) return {};
  return "\nflashlab-run runs a kernel at its own head dims; attention_forward" +
         std::string(arguments.backward ? " and attention_backward" : "") +
         " would zero-pad head_dim " + std::to_string(head_dim) + " to " +
         std::to_string(padded) + " for " + kernel.name + " (--head-dim " +
         std::to_string(padded) + " runs the kernel there)";
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

// Runs `check` (a harness check: forward, backward or KV cache) and reports its
// result (format(), and to_json() with --json). Exit codes: kExitBadArguments
// for input validation (c10::Error: the problem or kernel choice is not
// runnable as given), kExitMismatch for any other failure (a CUDA error during
// the launch or the check: the kernel is broken) or a failed check, kExitPass
// when it passed.
template <class Check>
int run_and_report(const Arguments& arguments, const Check& check) {
  std::invoke_result_t<const Check&> result;
  try {
    result = check();
  } catch (const c10::Error& error) {
    std::cerr << "flashlab-run: " << error.what_without_backtrace() << "\n";
    return kExitBadArguments;
  } catch (const std::exception& error) {
    std::cerr << "flashlab-run: kernel run failed: " << error.what() << "\n";
    return kExitMismatch;
  }
  std::cout << result.format();
  if (arguments.json) std::cout << result.to_json() << "\n";
  return result.passed() ? kExitPass : kExitMismatch;
}

// --kvcache: the decoding call against the reference, and the caches. Exit codes
// as for the forward.
int run_kvcache_check(const Arguments& arguments) {
  return run_and_report(arguments, [&] {
    flashlab::CheckOptions options;
    options.timed_launches = arguments.repeat;
    options.block_timeline = arguments.timeline;
    flashlab::KvCacheCheckResult result = flashlab::check_kvcache(arguments.kvcache_spec, options);
    if (!arguments.timeline_csv.empty() && result.block_timeline) {
      std::ofstream csv(arguments.timeline_csv);
      csv << flashlab::block_timeline_csv(*result.block_timeline);
      if (!csv) std::cerr << "flashlab-run: could not write --timeline-csv " << arguments.timeline_csv << "\n";
    }
    return result;
  });
}

// --backward: the kernel's forward, then its backward; out, lse, dq, dk, dv
// against the reference. Exit codes as for the forward.
int run_backward_check(const Arguments& arguments) {
  return run_and_report(arguments, [&] {
    flashlab::BackwardCheckOptions options;
    options.deterministic = arguments.deterministic;
    options.timed_launches = arguments.repeat;
    options.show_element = arguments.show_element;
    return flashlab::check_backward(arguments.spec, options);
  });
}

// The forward: the kernel against the reference.
int run_forward_check(const Arguments& arguments) {
  return run_and_report(arguments, [&] {
    flashlab::CheckOptions options;
    options.timed_launches = arguments.repeat;
    return flashlab::check_kernel(arguments.spec, options);
  });
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  try {
    std::optional<Arguments> parsed = parse_arguments(argc, argv);
    if (!parsed) return kExitPass;  // --help, --list-kernels
    arguments = *parsed;
  } catch (const flashlab::ArgumentError& error) {
    std::cerr << "flashlab-run: " << error.what() << " (see --help)\n";
    return kExitBadArguments;
  }
  // A named kernel and what it takes are known without a device: say so before the GPU check.
  if (arguments.spec.kernel != "auto") {
    const flashlab::KernelVariant* kernel = flashlab::find_any_kernel(arguments.spec.kernel);
    if (kernel == nullptr) {
      std::cerr << "flashlab-run: unknown --kernel '" << arguments.spec.kernel
                << "'; registered: " << flashlab::registered_kernel_names()
                << " (developer kernels: --list-kernels)\n";
      return kExitBadArguments;
    }
    const std::string reason =
        arguments.kvcache    ? flashlab::kvcache_unsupported_reason(*kernel, arguments.kvcache_spec)
        : arguments.backward ? flashlab::backward_unsupported_reason(*kernel, arguments.spec)
                             : flashlab::unsupported_reason(*kernel, arguments.spec);
    if (!reason.empty()) {
      std::cerr << "flashlab-run: " << reason << padding_hint(*kernel, arguments) << "\n";
      return kExitBadArguments;
    }
  }
  if (!arguments.locate.empty()) {
    const auto& at = arguments.locate;
    try {
      const auto col = at.size() == 4 ? std::optional<int>(at[3]) : std::nullopt;
      const flashlab::KernelVariant& kernel = *flashlab::find_any_kernel(arguments.spec.kernel);
      std::cout << (arguments.backward
                        ? flashlab::format_backward_location(kernel, arguments.spec, arguments.deterministic,
                                                             at[0], at[1], at[2], col)
                        : flashlab::format_location(kernel, arguments.spec, at[0], at[1], at[2], col));
    } catch (const c10::Error& error) {
      std::cerr << "flashlab-run: " << error.what_without_backtrace() << "\n";
      return kExitBadArguments;
    }
    return kExitPass;
  }
  const std::string unavailable = flashlab::cuda_unavailable_reason();
  if (!unavailable.empty()) {
    std::cerr << "flashlab-run: cannot run: " << unavailable
              << ". flashlab-run needs an NVIDIA GPU (the CPU tests run without one: make test).\n";
    return kExitNoGpu;
  }
  if (arguments.device >= 0) {
    const std::string problem = flashlab::select_cuda_device(arguments.device);
    if (!problem.empty()) {
      std::cerr << "flashlab-run: " << problem << "\n";
      return kExitBadArguments;
    }
  }
  std::cout << "seed " << arguments.spec.seed << " (pass --seed " << arguments.spec.seed
            << " to repeat this problem)\n";
  try {
    if (arguments.trace_tiles) return run_tile_trace(arguments);
    if (arguments.memory && arguments.kvcache) {
      std::cout << flashlab::format_kvcache_memory(arguments.kvcache_spec,
                                                   flashlab::measure_kvcache_memory(arguments.kvcache_spec));
      return kExitPass;
    }
    if (arguments.memory) {
      flashlab::MemoryOptions memory_options;
      memory_options.backward = arguments.backward;
      memory_options.deterministic = arguments.deterministic;
      const auto rows = flashlab::measure_memory(arguments.spec, {256, 1024, 4096}, memory_options);
      std::cout << flashlab::format_memory_table(arguments.spec, rows);
      return kExitPass;
    }
  } catch (const c10::Error& error) {
    std::cerr << "flashlab-run: " << error.what_without_backtrace() << "\n";
    return kExitBadArguments;
  }
  if (arguments.kvcache) return run_kvcache_check(arguments);
  if (arguments.backward) return run_backward_check(arguments);
  return run_forward_check(arguments);
}
