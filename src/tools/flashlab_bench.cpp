// flashlab-bench: every registered kernel and torch SDPA's backends (pinned one
// at a time) on the same inputs, timed with CUDA events (Google Benchmark
// manual time), with a summary of medians, TFLOP/s, the fraction of the bf16
// matmul peak measured in the same run, and ratios to torch's FLASH and cuDNN.
//
// Own flags (Google Benchmark's --benchmark_* flags work as usual):
//   --head-dims=64,128  --seqlens=1024,4096,16384  --tokens=32768 (batch = tokens / seqlen)
//   --model-dim=2048 (heads = model-dim / head_dim)  --dtype=fp32|fp16|bf16|e4m3  --causal=both|on|off
//   --dtype=e4m3: every row in bf16 as usual, and each kernel with an FP8 forward also as
//     NAME+e4m3: the same draws quantized to e4m3 with one descale per (batch, kv head)
//     (FA3's), bf16 output, FLOPs counted as the bf16 rows'; "vs plain" is its time over
//     NAME's bf16 row in the same run (forward only; torch's SDPA has no FP8 path)
//   --kernels=all|name,name  --backends=all|flash,cudnn,efficient,math|none
//   --direction=fwd|bwd|fwdbwd (a list times each): bwd times the backward
//     alone, given the forward's saved out and lse (each implementation's own
//     forward, run once before timing); fwdbwd times forward then backward.
//     FLOPs: 2.5x (bwd) and 3.5x (fwdbwd) the forward's. Every registered
//     kernel with a backward runs in default mode and deterministic mode
//     ("<kernel>(det)"); torch's FLASH and cuDNN backends through their own
//     backward ops (at::_scaled_dot_product_{flash,cudnn}_attention_backward)
//     on their own forward's outputs, same inputs and dout.
//   --torch-layout=views|bhsd: SDPA's q, k, v as transposed views of the
//     kernels' (B, S, H, D) tensors (default: what a model that transposes its
//     projections hands SDPA), or contiguous (B, H, S, D) copies made untimed
//     (H200, session 34, d128: on copies cuDNN's forward rows ran 0.3-1.7%
//     faster, its backward rows 0.5% faster to 5.7% slower, ours moved up to
//     2.5% between the two runs: session 33's 12-13% gap to a Python loop was
//     not the layout). dout takes the layout of each backend's out.
//   Timing: every timed call waits behind a LaunchGate (as --decode's), so a
//     row is one call's device time, the host's dispatch left out (until
//     session 34 the start event fired before the host had launched the call).
//     The rows keep the GPU busy: on the H200 (700 W) the SM clock read
//     1635-1860 MHz of 1980 in d128 rows (session 34; likely the power limit), so short
//     bursts with idle time between them (a Python loop's first calls) can
//     run faster than these sustained rows; compare rows of one run.
//   --api: a row is one call of a loop of 10 back-to-back calls timed as a
//     whole, host time included (a call's host work then overlaps the
//     previous call's kernel, as in a Python loop).
// (flashlab-run's grammar: --name value or --name=value; bad values exit 2, see --help)
//   --sweep: instead of the registered kernels and all SDPA backends, every
//     tuning_kernels() tile configuration that takes the case (fa2_mma_sm80
//     block sizes, warps, stages, Q in registers or shared memory;
//     fa3_wgmma_sm90 on its static schedule alone; --kernels filters them)
//     plus sdpa_flash as the yardstick (--backends overrides it).
//     Each configuration first has to pass flashlab::check_kernel on a small
//     odd causal problem (batch 1, 2 heads, seqlen 257 x 300, its head dim, the
//     bench dtype); one that fails is reported with the reason and not timed.
//   --decode: decoding with a KV cache (flash_attn_with_kvcache semantics,
//     issue 11) instead of the forward: one query row per sequence against a
//     full cache of L keys (cache_seqlens = L, no append, not causal), every
//     registered kernel with a KV-cache path (contiguous cache, and paged with
//     --cache) and torch SDPA's flash and cudnn backends with enable_gqa. Its
//     own flags: --batches=1,8,32 --cache-lens=1024,...,131072
//     --heads=32/8,64/8 (query/kv heads) --head-dims (default 128) --dtype
//     --cache=contiguous|paged|both --page-size=256 --num-splits=0 (heuristic)
//     --flush-l2=on|off --torch-layout=bhsd|views (or cache) --samples=100. Reports the
//     achieved GB/s of K/V read and its fraction of a device-to-device copy's
//     bandwidth measured in the same run (see "--decode" below).
//   --decode --api: what a caller of the public C++ API gets: a loop of 200
//     decode steps through flashlab::attention_with_kvcache (validation,
//     allocation, launch; host time included) against the same loop of SDPA
//     calls, timed with events around the whole loop (scripts/bench_api.py
//     does the same through the Python API).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/version.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"
#include "flashlab/kernel_registry.h"
#include "flashlab/harness/arguments.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/flops.h"
#include "flashlab/harness/memory_report.h"
#include "flashlab/harness/problem.h"

namespace {

using flashlab::Direction;
using flashlab::EventTimer;
using flashlab::LaunchGate;
using flashlab::median;
using flashlab::ProblemSpec;

const std::vector<std::string> kBackends = {"flash", "cudnn", "efficient", "math"};
// The torch backends with a backward op of their own that can be pinned.
const std::vector<std::string> kBackwardBackends = {"flash", "cudnn"};
// A registered kernel's backward in deterministic mode: "<kernel>(det)".
const std::string kDeterministicSuffix = "(det)";
// --decode's default torch backends (the yardsticks).
const std::vector<std::string> kDecodeBackends = {"flash", "cudnn"};
// --decode --api: loops of kApiSteps calls, kApiLoops of them a row by default.
constexpr int kApiSteps = 200, kApiLoops = 15;
// --api for the forward and backward: loops of kForwardApiSteps calls.
constexpr int kForwardApiSteps = 10;

// The cap a --modifications entry asks for: 30 for softcap and all, X for
// softcap=X (positive as a float; anything else there is an ArgumentError);
// nullopt for entries without softcap.
std::optional<double> softcap_of_modification(const std::string& modification) {
  if (modification == "softcap" || modification == "all") return 30.0;
  constexpr std::string_view kPrefix = "softcap=";
  if (modification.rfind(kPrefix, 0) != 0) return std::nullopt;
  const double cap = flashlab::parse_number("--modifications softcap=X", modification.substr(kPrefix.size()));
  if (!(static_cast<float>(cap) > 0.f) || !std::isfinite(static_cast<float>(cap)))  // kernels take a float
    throw flashlab::ArgumentError("--modifications softcap=X takes a cap > 0; got '" + modification + "'");
  return cap;
}

struct BenchConfig {
  std::vector<int> head_dims = {64, 128};
  std::vector<int> seqlens = {1024, 4096, 16384};
  int tokens = 32768;
  int model_dim = 2048;
  at::ScalarType dtype = at::kBFloat16;
  bool fp8 = false;  // --dtype=e4m3: NAME+e4m3 rows beside the bf16 ones
  std::vector<bool> causal = {false, true};
  std::vector<std::string> kernels;  // empty: all registered
  std::vector<std::string> backends = kBackends;
  bool backends_given = false;
  bool sweep = false;  // tuning_kernels() instead of registered_kernels()
  std::vector<Direction> directions = {Direction::forward};
  // --modifications: each kernel also runs as NAME+softcap, +alibi, +sinks, +all
  // (score modifications; SDPA's rows stay plain: cuDNN has no softcap).
  std::vector<std::string> modifications;

  // --decode (see the decode section below).
  bool decode = false;
  std::vector<int> batches = {1, 8, 32};
  std::vector<int> cache_lens = {1024, 4096, 8192, 16384, 32768, 65536, 131072};
  std::vector<std::pair<int, int>> head_counts = {{32, 8}, {64, 8}};  // (query heads, kv heads)
  bool contiguous_cache = true, paged_cache = true;
  int page_size = 256;
  int num_splits = 0;        // 0: each kernel's heuristic
  bool flush_l2 = true;      // read a buffer larger than L2 before every timed call
  // SDPA's inputs: contiguous (B, H, L, D) copies, or transposed views of the
  // kernels' (B, L, H, D) tensors. Unset: each mode's default (--decode: copies;
  // the forward and backward: views, what a model that transposes its
  // projections hands SDPA, and every table before session 33 used).
  std::optional<bool> torch_bhsd;
  bool decode_torch_bhsd() const { return torch_bhsd.value_or(true); }
  bool forward_torch_bhsd() const { return torch_bhsd.value_or(false); }
  bool plain_read = true;    // a plain_read row per case: K and V read and nothing else
  int samples = 100;         // timed calls per row (fixed: Google Benchmark's Iterations)
  bool api = false;          // time loops of the public API's calls (host time included)
  int device = -1;           // --device: -1 the current CUDA device
};

// "32/8,64/8" -> {(32, 8), (64, 8)}; "16" -> {(16, 16)}. Query heads a multiple of kv heads.
std::vector<std::pair<int, int>> parse_head_counts(const std::string& text) {
  std::vector<std::pair<int, int>> counts;
  for (const std::string& entry : flashlab::parse_list("--heads", text)) {
    const size_t slash = entry.find('/');
    const int heads = flashlab::parse_int("--heads", entry.substr(0, slash), 1);
    const int kv_heads =
        slash == std::string::npos ? heads : flashlab::parse_int("--heads", entry.substr(slash + 1), 1);
    if (heads % kv_heads != 0)
      throw flashlab::ArgumentError("--heads " + entry + ": query heads must be a multiple of kv heads");
    counts.emplace_back(heads, kv_heads);
  }
  return counts;
}

// Our flags; Google Benchmark's --benchmark_* flags are handed back in `passed_through`.
// Throws flashlab::ArgumentError (exit 2). nullopt: --help was printed.
std::optional<BenchConfig> parse_own_flags(int argc, char** argv, std::vector<std::string>& passed_through) {
  BenchConfig config;
  std::vector<std::string> kernels;
  bool kernels_given = false;
  bool head_dims_given = false;
  bool samples_given = false;
  // Flags that belong to one mode only, to say so when given in the other.
  std::vector<std::string> forward_only, decode_only;
  using flashlab::parse_int;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  flashlab::ArgumentParser parser(
      "flashlab-bench",
      "Every registered kernel and torch SDPA's backends on the same inputs, timed with CUDA events.",
      "exit codes: 0 done, 2 bad arguments, 3 no usable GPU\n");
  parser
      .option("--head-dims", "D1,D2,...", "(default 64,128; --decode: 128)",
              [&](const std::string& v) {
                config.head_dims = flashlab::parse_int_list("--head-dims", v, 1, kIntMax);
                head_dims_given = true;
              })
      .option("--seqlens", "S1,S2,...", "seqlen_q = seqlen_k (default 1024,4096,16384)",
              [&](const std::string& v) {
                config.seqlens = flashlab::parse_int_list("--seqlens", v, 1, kIntMax);
                forward_only.push_back("--seqlens");
              })
      .option("--tokens", "N", "batch = tokens / seqlen (default 32768)",
              [&](const std::string& v) {
                config.tokens = parse_int("--tokens", v, 1, kIntMax);
                forward_only.push_back("--tokens");
              })
      .option("--model-dim", "N", "heads = model-dim / head_dim (default 2048)",
              [&](const std::string& v) {
                config.model_dim = parse_int("--model-dim", v, 1, kIntMax);
                forward_only.push_back("--model-dim");
              })
      .option("--dtype", "fp32|fp16|bf16|e4m3",
              "(default bf16) e4m3: bf16 rows, and kernels with an FP8 forward\nalso as NAME+e4m3 on the "
              "same values quantized (forward only)",
              [&](const std::string& v) {
                config.dtype = flashlab::parse_dtype("--dtype", v);
                config.fp8 = config.dtype == at::kFloat8_e4m3fn;
                if (config.fp8) config.dtype = at::kBFloat16;
              })
      .option("--causal", "both|on|off", "(default both)",
              [&](const std::string& v) {
                config.causal = flashlab::parse_choice<std::vector<bool>>(
                    "--causal", v, {{"both", {false, true}}, {"on", {true}}, {"off", {false}}});
                forward_only.push_back("--causal");
              })
      .option("--kernels", "all|NAME,...",
              "registered kernels to time (with --sweep: tuning configurations) (default all)",
              [&](const std::string& v) {
                kernels = v == "all" ? std::vector<std::string>{} : flashlab::parse_list("--kernels", v);
                kernels_given = true;
              })
      .option("--backends", "all|none|flash,cudnn,efficient,math", "torch SDPA backends (default all; --decode: flash,cudnn)",
              [&](const std::string& v) {
                if (v == "all") config.backends = kBackends;
                else if (v == "none") config.backends.clear();
                else {
                  config.backends = flashlab::parse_list("--backends", v);
                  std::vector<std::string> accepted = {"all", "none"};
                  accepted.insert(accepted.end(), kBackends.begin(), kBackends.end());
                  flashlab::check_choices("--backends", config.backends, accepted);
                }
                config.backends_given = true;
              })
      .option("--direction", "fwd|bwd|fwdbwd[,...]",
              "forward, backward (given the forward's out and lse) or both in one\ntimed call; kernels "
              "with a backward also run deterministic, as NAME(det);\ntorch: flash and cudnn "
              "(default fwd)",
              [&](const std::string& v) {
                config.directions.clear();
                for (const std::string& name : flashlab::parse_list("--direction", v))
                  config.directions.push_back(
                      flashlab::parse_choice("--direction", name, flashlab::direction_choices()));
                forward_only.push_back("--direction");
              })
      .option("--modifications", "softcap,alibi,sinks,all",
              "each registered kernel also runs with the score modification,\nas NAME+softcap (softcap 30; "
              "softcap=X: cap X, e.g. Gemma 2's 50), NAME+alibi (ALiBi per head),\nNAME+sinks, NAME+all (the "
              "three); torch's rows stay plain (--decode: contiguous cache rows)",
              [&](const std::string& v) {
                config.modifications = flashlab::parse_list("--modifications", v);
                std::vector<std::string> named;
                for (const std::string& name : config.modifications)
                  if (!softcap_of_modification(name) || name == "softcap" || name == "all") named.push_back(name);
                // (softcap=X entries were parsed above; the name is listed for the message)
                flashlab::check_choices("--modifications", named, {"softcap", "softcap=X", "alibi", "sinks", "all"});
              })
      .flag("--sweep",
            "time every tuning configuration that takes the case (after a correctness\ncheck) against "
            "sdpa_flash, instead of the registered kernels",
            [&] {
              config.sweep = true;
              forward_only.push_back("--sweep");
            })
      .flag("--decode",
            "decoding with a KV cache instead of the forward: one query row per sequence,\nthe kernels' "
            "KV-cache path and SDPA flash/cudnn with enable_gqa; GB/s of K/V\nread against a "
            "device-to-device copy measured in the same run",
            [&] { config.decode = true; })
      .option("--batches", "B1,B2,...", "--decode: batch sizes (default 1,8,32)",
              [&](const std::string& v) {
                config.batches = flashlab::parse_int_list("--batches", v, 1, kIntMax);
                decode_only.push_back("--batches");
              })
      .option("--cache-lens", "L1,L2,...",
              "--decode: keys in each sequence's cache (default\n1024,4096,8192,16384,32768,65536,131072)",
              [&](const std::string& v) {
                config.cache_lens = flashlab::parse_int_list("--cache-lens", v, 1, kIntMax);
                decode_only.push_back("--cache-lens");
              })
      .option("--heads", "H/HKV,...", "--decode: query heads / kv heads (default 32/8,64/8; H alone: HKV = H)",
              [&](const std::string& v) {
                config.head_counts = parse_head_counts(v);
                decode_only.push_back("--heads");
              })
      .option("--cache", "contiguous|paged|both",
              "--decode: the kernels' cache layouts (default both); torch\nalways reads a contiguous cache",
              [&](const std::string& v) {
                const auto layouts = flashlab::parse_choice<std::pair<bool, bool>>(
                    "--cache", v, {{"both", {true, true}}, {"contiguous", {true, false}}, {"paged", {false, true}}});
                config.contiguous_cache = layouts.first;
                config.paged_cache = layouts.second;
                decode_only.push_back("--cache");
              })
      .option("--page-size", "N", "--decode: rows per page of the paged cache (default 256)",
              [&](const std::string& v) {
                config.page_size = parse_int("--page-size", v, 1, kIntMax);
                decode_only.push_back("--page-size");
              })
      .option("--num-splits", "N", "--decode: splits of each sequence's keys (default 0: the\nkernel's heuristic)",
              [&](const std::string& v) {
                config.num_splits = parse_int("--num-splits", v, 0, kIntMax);
                decode_only.push_back("--num-splits");
              })
      .option("--flush-l2", "on|off",
              "--decode: read a buffer 4x the L2 size before every timed call,\nuntimed (default on: "
              "a decode step finds its layer's K/V in DRAM)",
              [&](const std::string& v) {
                config.flush_l2 = flashlab::parse_choice<bool>("--flush-l2", v, {{"on", true}, {"off", false}});
                decode_only.push_back("--flush-l2");
              })
      .option("--plain-read", "on|off",
              "--decode: a plain_read row per case, the cache's K and V streamed\nby a read-only kernel: what "
              "reading them alone costs\n(default on)",
              [&](const std::string& v) {
                config.plain_read = flashlab::parse_choice<bool>("--plain-read", v, {{"on", true}, {"off", false}});
                decode_only.push_back("--plain-read");
              })
      .option("--torch-layout", "bhsd|views",
              "SDPA's inputs: contiguous (B, H, L, D) copies made untimed, or\ntransposed views of the kernels' "
              "(B, L, H, D) tensors (--decode:\nof the cache; 'cache' is the same). Default: views, --decode: "
              "bhsd",
              [&](const std::string& v) {
                config.torch_bhsd = flashlab::parse_choice<bool>("--torch-layout", v,
                                                                 {{"bhsd", true}, {"views", false}, {"cache", false}});
              })
      .flag("--api",
            "time loops of back-to-back calls, host time included: 10 forward\nor backward calls (default: one "
            "call a sample, behind a launch\ngate: device time); --decode: 200 steps through the public C++\n"
            "API (flashlab::attention_with_kvcache: checks, allocation,\nlaunch) and of SDPA calls (--decode --api: "
            "--samples loops a\nrow, default 15)",
            [&] { config.api = true; })
      .option("--samples", "N", "--decode: timed calls per row, after at least 3 warm-ups\nand 50 ms of them (default 100)",
              [&](const std::string& v) {
                config.samples = parse_int("--samples", v, 1, kIntMax);
                samples_given = true;
                decode_only.push_back("--samples");
              })
      .option("--device", "N", "the CUDA device to time on (default: the current one, 0 unless\nCUDA_VISIBLE_DEVICES says otherwise)",
              [&](const std::string& v) { config.device = parse_int("--device", v, 0, kIntMax); })
      .pass_through("--benchmark_", "Google Benchmark's own flags (--benchmark_filter=REGEX, --benchmark_out=FILE, ...)");
  const auto result = parser.parse(argc, argv);
  if (result.help) {
    std::cout << parser.usage();
    return std::nullopt;
  }
  passed_through = result.passed_through;
  if (config.decode && !forward_only.empty())
    throw flashlab::ArgumentError(forward_only.front() +
                                  " times forward problems; --decode takes --batches, --cache-lens, --heads");
  if (!config.decode && !decode_only.empty())
    throw flashlab::ArgumentError(decode_only.front() + " goes with --decode");
  if (config.fp8 && (config.decode || config.sweep))
    throw flashlab::ArgumentError("--dtype=e4m3 times the FP8 forward beside bf16; --decode and --sweep have no "
                                  "FP8 rows");
  if (config.fp8 && std::find(config.directions.begin(), config.directions.end(), Direction::forward) ==
                        config.directions.end())
    throw flashlab::ArgumentError("--dtype=e4m3 adds forward rows (the FP8 path has no backward); give "
                                  "--direction with fwd");
  if (config.decode) {
    if (!head_dims_given) config.head_dims = {128};
    if (!config.backends_given) config.backends = kDecodeBackends;
    if (config.api) {
      if (!samples_given) config.samples = kApiLoops;
      config.flush_l2 = false, config.plain_read = false;  // a loop of steps; nothing to stream
    }
    if (kernels_given) {
      // Only kernels with a KV-cache path time decoding.
      std::vector<std::string> accepted = {"all"};
      for (const auto& kernel : flashlab::registered_kernels())
        if (kernel.kvcache_launch != nullptr) accepted.push_back(kernel.name);
      flashlab::check_choices("--kernels (kernels with a KV-cache path)", kernels, accepted);
    }
    config.kernels = kernels;
    return config;
  }
  // Kernel names are checked once --sweep is known (it chooses the list they come from).
  std::vector<std::string> accepted = {"all"};
  for (const auto& kernel : config.sweep ? flashlab::tuning_kernels() : flashlab::registered_kernels())
    accepted.push_back(kernel.name);
  if (kernels_given) flashlab::check_choices("--kernels", kernels, accepted);
  config.kernels = kernels;
  if (config.sweep && !config.backends_given) config.backends = {"flash"};
  const bool backward = std::any_of(config.directions.begin(), config.directions.end(),
                                    [](Direction d) { return d != Direction::forward; });
  if (backward && config.sweep)
    throw flashlab::ArgumentError("--sweep times forward tile configurations; give --direction=fwd");
  if (backward && config.backends_given)
    for (const auto& backend : config.backends)
      if (std::find(kBackwardBackends.begin(), kBackwardBackends.end(), backend) == kBackwardBackends.end())
        throw flashlab::ArgumentError("--backends " + backend +
                                      " has no pinned backward op; --direction bwd and fwdbwd time "
                                      "torch's flash and cudnn");
  return config;
}

// The bf16 matmul rate this GPU reaches now, the ceiling attention is measured against.
double measure_matmul_peak_tflops() {
  const int n = 8192;
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(flashlab::current_cuda_device());
  const at::Tensor a = at::randn({n, n}, options), b = at::randn({n, n}, options);
  at::Tensor c = at::empty({n, n}, options);
  EventTimer timer;
  const float ms = timer.median_ms([&] { at::mm_out(c, a, b); }, 10);
  return 2.0 * n * n * double(n) / (ms * 1e-3) / 1e12;
}

// Kernels that failed the pre-sweep correctness check: name -> reason. A
// failing kernel is reported, never timed, so a wrong result cannot post a time.
std::map<std::string, std::string> failed_check;

// Runs each tuning configuration once on a small odd problem (partial tiles in
// both dimensions, seqlen_q != seqlen_k, causal) and records those that fail.
void check_tuning_kernels(const BenchConfig& config) {
  for (const auto& kernel : flashlab::tuning_kernels()) {
    if (!config.kernels.empty() &&
        std::find(config.kernels.begin(), config.kernels.end(), kernel.name) == config.kernels.end())
      continue;
    for (const int head_dim : config.head_dims) {
      ProblemSpec spec;
      spec.kernel = kernel.name;
      spec.batch = 1;
      spec.heads = spec.kv_heads = 2;
      spec.seqlen_q = 257;
      spec.seqlen_k = 300;
      spec.head_dim = head_dim;
      spec.dtype = config.dtype;
      spec.causal = true;
      spec.seed = 257;
      if (!flashlab::unsupported_reason(kernel, spec).empty()) continue;  // another head dim's
      std::string failure;
      try {
        const flashlab::CheckResult result = flashlab::check_kernel(spec);
        if (!result.passed()) {
          std::ostringstream text;
          text << "failed the correctness check (" << spec.describe() << "): max |out err| "
               << result.out.max_abs_error << " (tolerance " << result.out.tolerance << "), "
               << result.out.over_tolerance << " over, " << result.out.nan_count << " NaN; max |lse err| "
               << result.lse.max_abs_error << ", " << result.lse.over_tolerance << " over";
          failure = text.str();
        }
      } catch (const std::exception& error) {
        std::string message = error.what();
        if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error))
          message = torch_error->what_without_backtrace();
        failure = "failed the correctness check: " + message.substr(0, message.find('\n'));
        cudaGetLastError();
      }
      std::printf("correctness check d%d %-40s %s\n", head_dim, kernel.name.c_str(),
                  failure.empty() ? "passed" : failure.c_str());
      if (!failure.empty()) failed_check[kernel.name] = failure;
    }
  }
  std::fflush(stdout);
}

struct Measurement {
  std::string case_name, implementation;
  double median_ms = 0, tflops = 0;
  std::string error;
  // --decode: GB/s of K/V read, the splits a kernel chose (0: a torch row),
  // the largest |out - reference| of the checked sequences.
  double gbps = 0, max_abs_error = 0;
  int splits = 0;
};
std::vector<Measurement> measurements;
double matmul_peak_tflops = 0;
bool api_loops = false;  // --api: rows time loops of kForwardApiSteps calls, not gated single calls

// Inputs of the case being timed; all implementations of a case share them.
struct CurrentInputs {
  std::string case_name;
  flashlab::ProblemInputs inputs;
  at::Tensor dout;  // the upstream gradient of the backward directions
  // SDPA's (batch, heads, seqlen, head_dim) q, k, v: transposed views of the
  // above, or contiguous copies (--torch-layout=bhsd, with SDPA rows to run).
  at::Tensor sdpa_q, sdpa_k, sdpa_v;
} current;
bool sdpa_bhsd_copies = false;  // BenchConfig::forward_torch_bhsd() and a backend to time

// SDPA's (batch, heads, length, head_dim) form of a (batch, length, heads,
// head_dim) tensor: a transposed view, or a contiguous copy (--torch-layout=bhsd).
at::Tensor sdpa_layout(const at::Tensor& t, bool bhsd_copy) {
  return bhsd_copy ? t.transpose(1, 2).contiguous() : t.transpose(1, 2);
}

// Returns the previous case's tensors to the driver (emptyCache) and waits:
// for a while after a large free, whatever runs first reads DRAM slower (H100,
// decode batch 32 x 1k right after the 8.6 GB of the batch 8 x 128k case: 59.3
// us without this wait, 51.0 us with it; torch's backends, timed later, were
// not slowed). The likely cause, not measured directly: the driver clearing
// the freed memory.
void settle_after_free() {
  c10::cuda::CUDACachingAllocator::emptyCache();
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
}

const CurrentInputs& inputs_for(const std::string& case_name, const ProblemSpec& spec, Direction direction) {
  if (current.case_name != case_name) {
    current = {};
    settle_after_free();
    current.inputs = flashlab::make_inputs(spec, flashlab::current_cuda_device());
    if (direction != Direction::forward) current.dout = flashlab::make_dout(spec, current.inputs);
    current.sdpa_q = sdpa_layout(current.inputs.q, sdpa_bhsd_copies);
    current.sdpa_k = sdpa_layout(current.inputs.k, sdpa_bhsd_copies);
    current.sdpa_v = sdpa_layout(current.inputs.v, sdpa_bhsd_copies);
    current.case_name = case_name;
  }
  return current;
}

// "fa2_mma_sm80+softcap(det)" -> "fa2_mma_sm80", deterministic, modification "softcap".
std::string kernel_of(const std::string& implementation, bool* deterministic = nullptr,
                      std::string* modification = nullptr) {
  const size_t suffix = implementation.size() >= kDeterministicSuffix.size()
                            ? implementation.size() - kDeterministicSuffix.size()
                            : 0;
  const bool det = implementation.compare(suffix, std::string::npos, kDeterministicSuffix) == 0;
  if (deterministic) *deterministic = det;
  std::string name = det ? implementation.substr(0, suffix) : implementation;
  const size_t plus = name.find('+');
  if (modification) *modification = plus == std::string::npos ? "" : name.substr(plus + 1);
  return name.substr(0, plus);
}

// The spec with --modifications' entry applied (softcap 30 or softcap=X's cap,
// ALiBi per head, sinks), or with e4m3 inputs (--dtype=e4m3's rows).
ProblemSpec modified_spec(ProblemSpec spec, const std::string& modification) {
  if (modification == "e4m3") spec.dtype = at::kFloat8_e4m3fn;
  if (const auto cap = softcap_of_modification(modification)) spec.softcap = *cap;
  if (modification == "alibi" || modification == "all") spec.alibi = ProblemSpec::Alibi::per_head;
  if (modification == "sinks" || modification == "all") spec.sinks = true;
  return spec;
}

// The case's inputs with the implementation's score modifications drawn
// (slopes and sinks; Q, K, V shared with the other rows); for an e4m3 spec,
// Q, K, V quantized from the case's values with their descales.
flashlab::ProblemInputs modified_inputs(const ProblemSpec& spec, const flashlab::ProblemInputs& inputs) {
  flashlab::ProblemInputs modified = inputs;
  flashlab::draw_score_modifications(spec, inputs.q.device(), modified);
  if (spec.is_fp8()) flashlab::quantize_inputs(spec, modified);
  return modified;
}

void pin_sdpa_backend(const std::string& backend) {
  auto& context = at::globalContext();
  context.setSDPUseFlash(backend == "flash");
  context.setSDPUseCuDNN(backend == "cudnn");
  context.setSDPUseMemEfficient(backend == "efficient");
  context.setSDPUseMath(backend == "math");
}

// torch's FLASH or cuDNN attention, pinned through its own forward and
// backward ops (what autograd calls for scaled_dot_product_attention): the
// forward runs once here for the backward's saved tensors.
std::function<void()> make_torch_backward_call(const std::string& backend, Direction direction,
                                               const ProblemSpec& spec, const CurrentInputs& current) {
  const at::Tensor q = current.sdpa_q, k = current.sdpa_k, v = current.sdpa_v;
  const bool causal = spec.causal;
  const std::optional<double> scale = spec.softmax_scale;
  if (backend == "flash") {
    const auto forward = [=] { return at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale); };
    const auto saved = forward();
    const at::Tensor out = std::get<0>(saved);
    // dout laid out like out (the layout autograd hands the backward).
    const at::Tensor dout = at::empty_like(out).copy_(current.dout.transpose(1, 2));
    const auto backward = [=](const decltype(saved)& s) {
      at::_scaled_dot_product_flash_attention_backward(
          dout, q, k, v, std::get<0>(s), std::get<1>(s), std::get<2>(s), std::get<3>(s),
          std::get<4>(s).guard_int(__FILE__, __LINE__), std::get<5>(s).guard_int(__FILE__, __LINE__), 0.0,
          causal, std::get<6>(s), std::get<7>(s), scale);
    };
    if (direction == Direction::backward) return [=] { backward(saved); };
    return [=] { backward(forward()); };
  }
  TORCH_CHECK(backend == "cudnn", "no pinned backward op for torch backend ", backend);
  const auto forward = [=] {
    return at::_scaled_dot_product_cudnn_attention(q, k, v, std::nullopt, /*compute_log_sumexp=*/true, 0.0,
                                                   causal, false, scale);
  };
  const auto saved = forward();
  const at::Tensor dout = at::empty_like(std::get<0>(saved)).copy_(current.dout.transpose(1, 2));
  const auto backward = [=](const decltype(saved)& s) {
    at::_scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, std::get<0>(s), std::get<1>(s), std::get<6>(s), std::get<7>(s), at::Tensor(),
        std::get<2>(s), std::get<3>(s), std::get<4>(s).guard_int(__FILE__, __LINE__),
        std::get<5>(s).guard_int(__FILE__, __LINE__), 0.0, causal, scale);
  };
  if (direction == Direction::backward) return [=] { backward(saved); };
  return [=] { backward(forward()); };
}

// A registered kernel's backward (default or deterministic) through the public
// API, given its own forward's out and lse.
std::function<void()> make_kernel_backward_call(const std::string& implementation, Direction direction,
                                                const ProblemSpec& spec, const CurrentInputs& current) {
  bool deterministic = false;
  std::string modification;
  const std::string kernel = kernel_of(implementation, &deterministic, &modification);
  ProblemSpec named = modified_spec(spec, modification);
  named.kernel = kernel;
  const flashlab::ProblemInputs inputs = modified_inputs(named, current.inputs);
  const flashlab::BackwardOptions options = flashlab::backward_options(named, inputs, deterministic);
  const at::Tensor out = at::empty(inputs.q.sizes(), inputs.q.options());
  const at::Tensor lse = at::empty({spec.batch, spec.heads, spec.seqlen_q}, inputs.q.options().dtype(at::kFloat));
  const at::Tensor dq = at::empty(inputs.q.sizes(), inputs.q.options());
  const at::Tensor dk = at::empty(inputs.k.sizes(), inputs.k.options());
  const at::Tensor dv = at::empty(inputs.v.sizes(), inputs.v.options());
  const at::Tensor dout = current.dout;
  const auto forward = [=] { flashlab::attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse, options); };
  const auto backward = [=] {
    flashlab::attention_backward_into(dout, inputs.q, inputs.k, inputs.v, out, lse, dq, dk, dv, options);
  };
  forward();  // the saved out and lse
  if (direction == Direction::backward) return backward;
  return [=] { forward(), backward(); };
}

std::function<void()> make_call(const std::string& implementation, Direction direction, const ProblemSpec& spec,
                                const CurrentInputs& current) {
  const flashlab::ProblemInputs& inputs = current.inputs;
  if (direction != Direction::forward) {
    if (implementation.rfind("sdpa_", 0) == 0)
      return make_torch_backward_call(implementation.substr(5), direction, spec, current);
    return make_kernel_backward_call(implementation, direction, spec, current);
  }
  if (implementation.rfind("sdpa_", 0) == 0) {
    const std::string backend = implementation.substr(5);
    // SDPA wants (batch, heads, seqlen, head_dim): views or copies (--torch-layout).
    const at::Tensor q = current.sdpa_q, k = current.sdpa_k, v = current.sdpa_v;
    const bool gqa = spec.heads != spec.kv_heads;
    return [=] {
      pin_sdpa_backend(backend);
      at::scaled_dot_product_attention(q, k, v, {}, 0.0, spec.causal, std::nullopt, gqa);
    };
  }
  at::Tensor out = at::empty(inputs.q.sizes(), inputs.q.options());
  at::Tensor lse = at::empty({spec.batch, spec.heads, spec.seqlen_q}, inputs.q.options().dtype(at::kFloat));
  std::string modification;
  if (flashlab::find_kernel(kernel_of(implementation, nullptr, &modification)) != nullptr) {
    // A registered kernel: the public call, validation and dispatch included.
    ProblemSpec named = modified_spec(spec, modification);
    const flashlab::ProblemInputs called = modified_inputs(named, inputs);
    const flashlab::AttentionOptions options = flashlab::attention_options(named, called);
    return [=] { flashlab::attention_forward_into(called.q, called.k, called.v, out, lse, options); };
  }
  // A tuning configuration: the harness's entry (validates, then launches).
  const flashlab::KernelVariant* kernel = flashlab::find_any_kernel(implementation);
  const flashlab::AttentionParams params = flashlab::forward_params(spec, inputs, out, lse);
  return [=] { flashlab::run_kernel(*kernel, params); };
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string error_text(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error))
    return first_line(torch_error->what_without_backtrace());
  return first_line(error.what());
}

// A row's timed calls, one a Google Benchmark iteration: one call behind a
// LaunchGate (device time, the host's dispatch left out), or with loop_steps
// > 0 a loop of that many back-to-back calls timed as a whole, host time
// included (the row's time is a call's share). min_time counts the whole
// window. before_each runs before the start event, untimed. Returns the
// median.
double time_row(benchmark::State& state, const std::string& row, const std::function<void()>& call,
                int loop_steps, const std::function<void()>& before_each = {}) {
  EventTimer timer;
  LaunchGate gate;
  std::vector<float> times;
  int expired = 0;
  for (auto _ : state) {
    float window_ms = 0;
    if (loop_steps > 0) {
      window_ms = timer.time_ms([&] {
        for (int step = 0; step < loop_steps; ++step) call();
      });
    } else {
      if (before_each) before_each();
      window_ms = timer.time_ms(call, &gate);
      expired += gate.expired();
    }
    times.push_back(loop_steps > 0 ? window_ms / loop_steps : window_ms);
    state.SetIterationTime(window_ms * 1e-3);
  }
  // A call that waits on the device while the gate holds it is let through
  // after the timeout: its times then include host time.
  if (expired > 0)
    std::fprintf(stderr, "  warning: %s: %d of %zu timed calls waited on the device behind the launch gate (%.1f s "
                 "each): those times include host time\n",
                 row.c_str(), expired, times.size(), LaunchGate::kTimeoutNs * 1e-9);
  state.counters["gate_expired"] = expired;
  return median(times);
}

// A row that could not run: its error in the table, the allocator's cache and
// CUDA's sticky error cleared for the next row.
void fail_row(benchmark::State& state, Measurement& measurement, const std::exception& error) {
  measurement.error = error_text(error);
  c10::cuda::CUDACachingAllocator::emptyCache();
  cudaGetLastError();
  state.SkipWithError(measurement.error.c_str());
}

// Google Benchmark calls a row's function more than once (to size the
// iteration count); the last call, with the most iterations, is kept.
void keep_measurement(const Measurement& measurement) {
  for (auto& existing : measurements)
    if (existing.case_name == measurement.case_name && existing.implementation == measurement.implementation) {
      existing = measurement;
      return;
    }
  measurements.push_back(measurement);
}

void run_benchmark(benchmark::State& state, const std::string& case_name,
                   const std::string& implementation, Direction direction, const ProblemSpec& spec) {
  Measurement measurement{case_name, implementation};
  try {
    if (auto failed = failed_check.find(implementation); failed != failed_check.end())
      throw std::runtime_error(failed->second);
    if (implementation == "sdpa_math") {
      // The math path materializes (batch, heads, Sq, Sk) scores several times over.
      const double score_bytes = 4.0 * spec.batch * spec.heads * spec.seqlen_q * double(spec.seqlen_k);
      if (score_bytes > 16e9) throw std::runtime_error("skipped: math backend would need > 16 GB of scores");
    }
    const auto& inputs = inputs_for(case_name, spec, direction);
    const auto call = make_call(implementation, direction, spec, inputs);
    for (int warmup = 0; warmup < 3; ++warmup) call();
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    measurement.median_ms =
        time_row(state, case_name + " " + implementation, call, api_loops ? kForwardApiSteps : 0);
    measurement.tflops = flashlab::attention_flops(spec, direction) / (measurement.median_ms * 1e-3) / 1e12;
    state.counters["median_ms"] = measurement.median_ms;
    state.counters["TFLOPS"] = measurement.tflops;
    state.counters["peak_fraction"] = measurement.tflops / matmul_peak_tflops;
    // Device memory one call allocates on top of its inputs (outputs, LSE, workspaces).
    state.counters["peak_MB"] = flashlab::peak_bytes_during(call) / 1e6;
  } catch (const std::exception& error) {
    fail_row(state, measurement, error);
  }
  keep_measurement(measurement);
}

void print_summary(const BenchConfig& config) {
  std::printf("\nbf16 matmul peak measured in this run: %.1f TFLOP/s (8192^3, median of 10)\n", matmul_peak_tflops);
  std::map<std::string, std::map<std::string, const Measurement*>> by_case;
  std::vector<std::string> case_order;
  for (const auto& m : measurements) {
    if (by_case.find(m.case_name) == by_case.end()) case_order.push_back(m.case_name);
    by_case[m.case_name][m.implementation] = &m;
  }
  int width = 16;  // the implementation column fits the longest name (tuning names run to ~40)
  for (const auto& m : measurements) width = std::max(width, static_cast<int>(m.implementation.size()));
  // Backward directions: the deterministic rows' time over the default mode's.
  const bool backward = std::any_of(config.directions.begin(), config.directions.end(),
                                    [](Direction d) { return d != Direction::forward; });
  // NAME+modification and NAME+e4m3 rows: "vs plain", NAME's time over theirs.
  const bool variants = std::any_of(measurements.begin(), measurements.end(),
                                    [](const Measurement& m) { return m.implementation.find('+') != std::string::npos; });
  std::printf("%-44s %-*s %10s %9s %7s %9s %9s%s%s\n", "case", width, "implementation", "median ms", "TFLOP/s",
              "% peak", "vs flash", "vs cudnn", variants ? "  vs plain" : "", backward ? "   det/def" : "");
  for (const auto& case_name : case_order) {
    const auto& row = by_case[case_name];
    auto reference_ms = [&](const char* name) -> double {
      auto found = row.find(name);
      return found == row.end() || !found->second->error.empty() ? 0 : found->second->median_ms;
    };
    const double flash_ms = reference_ms("sdpa_flash"), cudnn_ms = reference_ms("sdpa_cudnn");
    for (const auto& m : measurements) {
      if (m.case_name != case_name) continue;
      if (!m.error.empty()) {
        std::printf("%-44s %-*s   %s\n", case_name.c_str(), width, m.implementation.c_str(),
                    m.error.substr(0, config.sweep ? 200 : 90).c_str());
        continue;
      }
      char flash_ratio[16] = "-", cudnn_ratio[16] = "-", det_ratio[24] = "", plain_ratio[24] = "";
      if (variants) {
        bool deterministic = false;
        std::string modification;
        const std::string kernel = kernel_of(m.implementation, &deterministic, &modification);
        const double plain_ms =
            modification.empty() ? 0 : reference_ms((kernel + (deterministic ? kDeterministicSuffix : "")).c_str());
        if (plain_ms > 0) std::snprintf(plain_ratio, sizeof plain_ratio, " %9.2fx", plain_ms / m.median_ms);
        else std::snprintf(plain_ratio, sizeof plain_ratio, " %9s", "-");
      }
      if (flash_ms > 0) std::snprintf(flash_ratio, sizeof flash_ratio, "%.2fx", flash_ms / m.median_ms);
      if (cudnn_ms > 0) std::snprintf(cudnn_ratio, sizeof cudnn_ratio, "%.2fx", cudnn_ms / m.median_ms);
      if (backward) {
        bool deterministic = false;
        const std::string kernel = kernel_of(m.implementation, &deterministic);
        const double default_ms = deterministic ? reference_ms(kernel.c_str()) : 0;
        if (default_ms > 0) std::snprintf(det_ratio, sizeof det_ratio, " %9.2fx", m.median_ms / default_ms);
        else std::snprintf(det_ratio, sizeof det_ratio, " %9s", "-");
      }
      std::printf("%-44s %-*s %10.3f %9.1f %6.1f%% %9s %9s%s%s\n", case_name.c_str(), width, m.implementation.c_str(),
                  m.median_ms, m.tflops, 100 * m.tflops / matmul_peak_tflops, flash_ratio, cudnn_ratio, plain_ratio,
                  det_ratio);
    }
  }
  std::printf("ratios > 1 mean faster than that torch backend (time of the backend / time of the row); torch's "
              "inputs: %s\n",
              config.forward_torch_bhsd() ? "contiguous (B, H, S, D) copies (--torch-layout=bhsd)"
                                          : "transposed views of the (B, S, H, D) inputs (--torch-layout=views)");
  if (config.api)
    std::printf("--api: a row's time is one call of a loop of %d back-to-back calls timed as a whole, host time "
                "included (Google Benchmark's own Time column is the whole loop)\n",
                kForwardApiSteps);
  else
    std::printf("times: one call behind a launch gate (device time, the host's dispatch left out)\n");
  if (variants)
    std::printf("vs plain: the time of the row's kernel without its +modification (or in bf16, for +e4m3) over the "
                "row's; e4m3 rows count the bf16 rows' FLOPs, and %% peak is of the bf16 matmul rate\n");
  if (backward)
    std::printf("bwd: the backward alone, given the forward's out and lse; fwdbwd: both in one timed call; "
                "TFLOP/s count 2.5x / 3.5x the forward's FLOPs; det/def: a deterministic row's time over "
                "its kernel's default mode\n");
}

// ---------------------------------------------------------------------------
// --decode: decoding with a KV cache (flash_attn_with_kvcache semantics, issue 11).
//
// A case is one decode step of a batch: q (batch, 1, heads, head_dim) against
// a cache that holds exactly cache_len keys per sequence (cache_seqlens =
// cache_len = the capacity), nothing appended, not causal (one query row sees
// every key anyway), softmax scale 1/sqrt(head_dim). Its rows:
//   <kernel>             a registered kernel's KV-cache path on the contiguous
//                        cache (batch, cache_len, kv_heads, head_dim)
//   <kernel>(paged256)   the same kernel on the same keys and values as pages of
//                        --page-size rows: the contiguous cache viewed as
//                        (batch * cache_len / 256, 256, kv_heads, head_dim)
//                        pages, every sequence given a random set of them by
//                        block_table (a random permutation: scattered like a
//                        real page pool, the same bytes, no second copy)
//   plain_read           the contiguous cache's K and V streamed by a read-only
//                        kernel (enqueue_stream_read) and nothing else, with the
//                        fastest of 4 / 8 / 16 blocks an SM (each timed as the
//                        rows are, median of 10): what a kernel that reads those
//                        bytes once can reach on this GPU, at this size
//   sdpa_flash, sdpa_cudnn  torch's backends pinned one at a time: q (batch,
//                        heads, 1, head_dim), k/v (batch, kv_heads, cache_len,
//                        head_dim), enable_gqa=true. What torch does with GQA
//                        inside is its own business; a backend that refuses the
//                        case is reported as unavailable with torch's reasons
//                        (the warnings its dispatcher gives), never replaced.
// Kernels are timed through the lower-level entry: make_kvcache_params once,
// then only run_kvcache_kernel in the timed call (no validation, no host
// copies). attention_with_kvcache_into runs once before, untimed, so the
// problem is one the public API validates. Then every row's output for the
// first and last sequence is compared with a float32 reference (for kernels
// the timed path's own output, poisoned with NaN first): a wrong result is
// reported and not timed.
//
// Timing: CUDA events around each call on the current stream (EventTimer),
// warm-ups (at least 3 calls and 50 ms: warm_up_decode_row), --samples timed
// calls, the median. With --flush-l2 on (default)
// every timed call is preceded, outside the events, by a read of a buffer 4x
// the L2 size: K/V then come from DRAM, as in a real decode step where the
// other layers ran in between. Then a LaunchGate holds the stream until the
// start event, the call and the stop event are all enqueued, so the host's
// launch overhead stays out of the timed window even when the host falls
// behind (times are device times, as in a decoder that replays a CUDA graph;
// without the gate one row of a session-14 run read 141 us instead of 21.5,
// its host time per call 394 us against 130). A new case starts 250 ms after
// the previous case's memory was freed (settle_after_free).
//
// GB/s: the bytes of K and V read, 2 x batch x cache_len x kv_heads x head_dim
// x element size (q and out are negligible), over the median time; 1 GB = 1e9
// bytes. The copy bandwidth: a 2 GiB device-to-device at::Tensor::copy_ timed
// the same way (median of 20 after 3 warm-ups) and counted (read + write) /
// time, 4 GiB of DRAM traffic per copy, which is what a streaming kernel can
// reach; "% copy" is a row's GB/s over it.
//
// Memory: the largest default case, batch 32 x 131072 keys x 8 kv heads x 128
// x 2 B x 2 (K and V) = 16 GiB, 32 GiB with torch's bhsd copies, fits an 80 GB
// H100. A case that needs more than the device has free when the cases are
// registered is skipped, and stdout says so.

struct DecodeCase {
  int batch = 0, heads = 0, kv_heads = 0, head_dim = 0, cache_len = 0;
  at::ScalarType dtype = at::kBFloat16;
  // "decode/d128/b8/h32/kv8/L16384" (scripts/bench_table.py and plot_bench.py parse it).
  std::string name() const {
    return "decode/d" + std::to_string(head_dim) + "/b" + std::to_string(batch) + "/h" + std::to_string(heads) +
           "/kv" + std::to_string(kv_heads) + "/L" + std::to_string(cache_len);
  }
  double kv_bytes() const {
    return 2.0 * batch * double(cache_len) * kv_heads * head_dim * double(c10::elementSize(dtype));
  }
};

// A paged row's implementation name: "<kernel>(paged256)".
const std::string kPagedMarker = "(paged";
std::string decode_kernel_of(const std::string& implementation, bool* paged = nullptr) {
  const size_t marker = implementation.find(kPagedMarker);
  if (paged) *paged = marker != std::string::npos;
  return implementation.substr(0, marker);
}

constexpr size_t kCopyBytes = size_t(2) << 30;
double copy_gbps = 0;

// Device-to-device copy of `bytes`, (read + write) bytes per second / 1e9.
double measure_copy_gbps(size_t bytes) {
  const auto options = at::TensorOptions().dtype(at::kByte).device(flashlab::current_cuda_device());
  const at::Tensor source = at::ones({static_cast<int64_t>(bytes)}, options);
  at::Tensor target = at::empty_like(source);
  EventTimer timer;
  const float ms = timer.median_ms([&] { target.copy_(source); }, 20);
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

// --flush-l2's flush (made once in run_decode when the flag is on).
std::optional<flashlab::L2Flush> l2_flush;

// float32 attention of one sequence: q (heads, head_dim) over k, v (keys,
// kv_heads, head_dim); query head h uses kv head h / (heads / kv_heads).
// Returns (heads, head_dim).
// With score modifications (--modifications): softcap, ALiBi slopes (heads)
// over the distance keys - 1 - j of the one query row, sinks (heads).
struct DecodeModification {
  double softcap = 0.0;
  at::Tensor alibi_slopes, sinks;
};
at::Tensor decode_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const DecodeModification& m = {}) {
  const int64_t heads = q.size(0), kv_heads = k.size(1), head_dim = q.size(1), keys = k.size(0);
  const at::Tensor qf = q.to(at::kFloat).reshape({kv_heads, heads / kv_heads, head_dim});
  const at::Tensor kf = k.to(at::kFloat).permute({1, 2, 0});  // (kv_heads, head_dim, keys)
  const at::Tensor vf = v.to(at::kFloat).permute({1, 0, 2});  // (kv_heads, keys, head_dim)
  at::Tensor scores = at::matmul(qf, kf) / std::sqrt(double(head_dim));  // (kv_heads, group, keys)
  if (m.softcap > 0) scores = at::tanh(scores / m.softcap) * m.softcap;
  if (m.alibi_slopes.defined()) {
    const at::Tensor distance = keys - 1 - at::arange(keys, scores.options());
    scores = scores - m.alibi_slopes.view({kv_heads, heads / kv_heads, 1}) * distance;
  }
  if (!m.sinks.defined()) return at::matmul(at::softmax(scores, -1), vf).reshape({heads, head_dim});
  const at::Tensor with_sink = at::cat({scores, m.sinks.view({kv_heads, heads / kv_heads, 1})}, -1);
  return at::matmul(at::softmax(with_sink, -1).narrow(-1, 0, keys), vf).reshape({heads, head_dim});
}

// The inputs of the case being timed; every row of a case shares them.
struct DecodeInputs {
  std::string case_name;
  at::Tensor q;                 // (batch, 1, heads, head_dim)
  at::Tensor k_cache, v_cache;  // (batch, cache_len, kv_heads, head_dim)
  at::Tensor cache_seqlens;     // int32 (batch), all cache_len
  // The paged view (first paged row): pages of the contiguous cache and a
  // random permutation of them as block_table (batch, cache_len / page_size).
  at::Tensor k_pages, v_pages, block_table;
  at::Tensor torch_q, torch_k, torch_v;  // SDPA's (batch, heads, 1, d), (batch, kv_heads, L, d)
  std::vector<int> checked;  // the sequences whose output is checked: first and last
  std::vector<at::Tensor> reference, paged_reference;  // float32 (heads, head_dim) per checked sequence
} decode_current;

DecodeInputs& decode_inputs_for(const DecodeCase& c) {
  if (decode_current.case_name == c.name()) return decode_current;
  decode_current = {};
  settle_after_free();
  DecodeInputs& in = decode_current;
  at::manual_seed(1234);
  const auto options = at::TensorOptions().dtype(c.dtype).device(flashlab::current_cuda_device());
  in.q = at::randn({c.batch, 1, c.heads, c.head_dim}, options);
  in.k_cache = at::randn({c.batch, c.cache_len, c.kv_heads, c.head_dim}, options);
  in.v_cache = at::randn({c.batch, c.cache_len, c.kv_heads, c.head_dim}, options);
  in.cache_seqlens = at::full({c.batch}, c.cache_len, options.dtype(at::kInt));
  in.checked = {0};
  if (c.batch > 1) in.checked.push_back(c.batch - 1);
  for (const int b : in.checked)
    in.reference.push_back(decode_reference(in.q[b][0], in.k_cache[b], in.v_cache[b]));
  in.case_name = c.name();  // last: a case whose inputs failed half-way is made again
  return in;
}

void make_paged_view(DecodeInputs& in, const DecodeCase& c, int page_size) {
  if (in.block_table.defined()) return;
  const int64_t per_sequence = c.cache_len / page_size, pages = c.batch * per_sequence;
  in.k_pages = in.k_cache.view({pages, page_size, c.kv_heads, c.head_dim});
  in.v_pages = in.v_cache.view({pages, page_size, c.kv_heads, c.head_dim});
  const at::Tensor table =
      at::randperm(pages, at::TensorOptions().dtype(at::kLong).device(flashlab::current_cuda_device())).view({c.batch, per_sequence});
  for (const int b : in.checked) {
    const at::Tensor rows = table[b];
    in.paged_reference.push_back(decode_reference(in.q[b][0], in.k_pages.index_select(0, rows).flatten(0, 1),
                                                  in.v_pages.index_select(0, rows).flatten(0, 1)));
  }
  in.block_table = table.to(at::kInt).contiguous();
}

void make_torch_inputs(DecodeInputs& in, bool bhsd) {
  if (in.torch_q.defined()) return;
  // (batch, heads, 1, head_dim) and (batch, kv_heads, cache_len, head_dim).
  in.torch_k = sdpa_layout(in.k_cache, bhsd), in.torch_v = sdpa_layout(in.v_cache, bhsd);
  in.torch_q = sdpa_layout(in.q, bhsd);  // last: the mark that they are made
}

// Untimed calls before a row's samples: at least 3, and for at least
// kDecodeWarmup of wall time. A row timed right after the case's set-up (the
// first, ours) had found the device idle, while torch's rows came after their
// own set-up (the (B, H, L, D) copies of K/V) and after the rows before
// them: on the H100 (session 16, call 15) cuDNN's batch 32 x 1k took
// 49.86-49.95 us timed after flashlab's row and 50.56-50.75 us timed first
// (alone in its process); flashlab's 51.04-51.39 either way.
constexpr std::chrono::milliseconds kDecodeWarmup{50};

void warm_up_decode_row(const std::function<void()>& call) {
  const auto start = std::chrono::steady_clock::now();
  for (int calls = 0; calls < 3 || std::chrono::steady_clock::now() - start < kDecodeWarmup; ++calls) {
    call();
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

struct DecodeCall {
  std::function<void()> call;        // what is timed
  std::function<at::Tensor()> run;   // one untimed call: its output as (batch, heads, head_dim)
  int splits = 0;                    // kernels: the splits the launch uses
  std::vector<at::Tensor> reference;  // a modified row's own references (else the case's)
};

DecodeCall make_kernel_decode_call(const std::string& implementation, const DecodeCase& c, DecodeInputs& in,
                                   const BenchConfig& config) {
  bool paged = false;
  std::string modification;
  const std::string name = kernel_of(decode_kernel_of(implementation, &paged), nullptr, &modification);
  if (paged) make_paged_view(in, c, config.page_size);
  const at::Tensor k = paged ? in.k_pages : in.k_cache, v = paged ? in.v_pages : in.v_cache;
  flashlab::KvCacheOptions options;
  options.kernel = name;
  DecodeCall result;
  if (!modification.empty()) {  // modified_spec's values; slopes ALiBi's geometric ones, sinks normal
    const ProblemSpec spec = modified_spec(ProblemSpec{}, modification);
    const auto float32 = in.q.options().dtype(at::kFloat);
    DecodeModification m;
    m.softcap = spec.softcap;
    if (spec.alibi != ProblemSpec::Alibi::none)
      m.alibi_slopes = at::pow(2.0, at::arange(1, c.heads + 1, float32) * (-8.0 / c.heads));
    if (spec.sinks) m.sinks = at::randn({c.heads}, float32);
    options.softcap = m.softcap;
    options.alibi_slopes = m.alibi_slopes;
    options.sinks = m.sinks;
    for (const int b : in.checked) result.reference.push_back(decode_reference(in.q[b][0], k[b], v[b], m));
  }
  options.cache_seqlens = in.cache_seqlens;
  if (paged) options.block_table = in.block_table;
  options.num_splits = config.num_splits;
  const at::Tensor out = at::empty_like(in.q);
  const at::Tensor lse = at::empty({c.batch, c.heads, 1}, in.q.options().dtype(at::kFloat));
  // Once through the public entry: it validates this very problem (lengths, pages).
  flashlab::attention_with_kvcache_into(in.q, k, v, out, lse, options);
  const flashlab::KvCacheParams params = flashlab::make_kvcache_params(in.q, k, v, out, lse, options);
  const flashlab::KernelVariant& kernel = flashlab::select_kvcache_kernel(params, name);
  result.splits = flashlab::kvcache_splits(kernel, params);
  // out and lse ride along: params points into them.
  result.call = [&kernel, params, out, lse] { flashlab::run_kvcache_kernel(kernel, params); };
  if (config.api) {  // what a caller gets: checks, allocation, launch
    result.call = [q = in.q, k, v, options] { flashlab::attention_with_kvcache(q, k, v, options); };
    result.run = [q = in.q, k, v, options] { return flashlab::attention_with_kvcache(q, k, v, options).out.select(1, 0); };
    return result;
  }
  result.run = [out, call = result.call] {
    out.fill_(std::numeric_limits<float>::quiet_NaN());
    call();
    return out.select(1, 0);
  };
  return result;
}

// The plain_read row's call: enqueue_stream_read of the contiguous K and V
// with the fastest of kPlainReadBlocksPerSm, its count in `splits`.
const std::string kPlainRead = "plain_read";
constexpr int kPlainReadBlocksPerSm[] = {4, 8, 16};

DecodeCall make_plain_read_call(const DecodeInputs& in) {
  const at::Tensor k = in.k_cache, v = in.v_cache;
  const auto enqueue = [k, v](int blocks_per_sm) {
    flashlab::enqueue_stream_read(k.data_ptr(), k.nbytes(), v.data_ptr(), v.nbytes(), blocks_per_sm,
                                  c10::cuda::getCurrentCUDAStream().stream());
  };
  EventTimer timer;
  LaunchGate gate;
  DecodeCall result;
  float best_ms = std::numeric_limits<float>::infinity();
  for (const int blocks_per_sm : kPlainReadBlocksPerSm) {
    const auto call = [&] { enqueue(blocks_per_sm); };
    warm_up_decode_row(call);
    std::vector<float> times;
    for (int sample = 0; sample < 10; ++sample) {
      if (l2_flush) (*l2_flush)();
      times.push_back(timer.time_ms(call, &gate));
    }
    if (median(times) < best_ms) best_ms = median(times), result.splits = blocks_per_sm;
  }
  result.call = [enqueue, blocks_per_sm = result.splits] { enqueue(blocks_per_sm); };
  return result;
}

DecodeCall make_torch_decode_call(const std::string& backend, DecodeInputs& in, bool bhsd) {
  make_torch_inputs(in, bhsd);
  const at::Tensor q = in.torch_q, k = in.torch_k, v = in.torch_v;
  DecodeCall result;
  result.call = [=] {
    pin_sdpa_backend(backend);
    at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, std::nullopt, /*enable_gqa=*/true);
  };
  result.run = [=] {
    pin_sdpa_backend(backend);
    return at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, std::nullopt, true).select(2, 0);
  };
  return result;
}

// torch's dispatcher says why a pinned backend cannot run through warnings,
// then throws "No available kernel"; this keeps them for the report.
struct WarningCollector : c10::WarningHandler {
  std::vector<std::string> messages;
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
};

// A torch row's untimed call; a refusal becomes "unavailable: <error> (<torch's reasons>)".
at::Tensor run_torch_row(const DecodeCall& call) {
  WarningCollector collector;
  const bool warn_always = c10::WarningUtils::get_warnAlways();
  c10::WarningUtils::set_warnAlways(true);
  c10::WarningUtils::WarningHandlerGuard guard(&collector);
  try {
    at::Tensor out = call.run();
    c10::WarningUtils::set_warnAlways(warn_always);
    return out;
  } catch (const std::exception& error) {
    c10::WarningUtils::set_warnAlways(warn_always);
    std::string reasons;
    for (const auto& message : collector.messages) reasons += (reasons.empty() ? "" : "; ") + first_line(message);
    throw std::runtime_error("unavailable: " + error_text(error) + (reasons.empty() ? "" : " (" + reasons + ")"));
  }
}

// Largest |out - reference| over the checked sequences (out: (batch, heads,
// head_dim)). Allowed: 2% of the reference's largest magnitude, about ten
// times what bf16 rounding of P and of the output gives.
double decode_output_error(const at::Tensor& out, const std::vector<int>& checked,
                           const std::vector<at::Tensor>& reference, std::string& failure) {
  double worst = 0;
  for (size_t i = 0; i < checked.size(); ++i) {
    const double error = (out[checked[i]].to(at::kFloat) - reference[i]).abs().max().item<double>();
    const double tolerance = 0.02 * reference[i].abs().max().item<double>() + 1e-6;
    if (!(error <= tolerance) && failure.empty()) {
      char text[160];
      std::snprintf(text, sizeof text, "wrong result, not timed: sequence %d max |out - reference| %.3g > %.3g",
                    checked[i], error, tolerance);
      failure = text;
    }
    if (std::isnan(error) || (!std::isnan(worst) && error > worst)) worst = error;  // NaN sticks
  }
  return worst;
}

void run_decode_benchmark(benchmark::State& state, const DecodeCase& c, const std::string& implementation,
                          const BenchConfig& config, const std::string& skip_reason, const std::string& progress) {
  Measurement measurement{c.name(), implementation};
  std::fprintf(stderr, "%s %s/%s\n", progress.c_str(), c.name().c_str(), implementation.c_str());
  try {
    if (!skip_reason.empty()) throw std::runtime_error(skip_reason);
    DecodeInputs& in = decode_inputs_for(c);
    const bool torch = implementation.rfind("sdpa_", 0) == 0, read = implementation == kPlainRead;
    const DecodeCall call = torch  ? make_torch_decode_call(implementation.substr(5), in, config.decode_torch_bhsd())
                            : read ? make_plain_read_call(in)
                                   : make_kernel_decode_call(implementation, c, in, config);
    if (!read) {  // plain_read computes nothing to check
      const at::Tensor out = torch ? run_torch_row(call) : call.run();
      bool paged = false;
      decode_kernel_of(implementation, &paged);
      std::string failure;
      measurement.max_abs_error = decode_output_error(
          out, in.checked, !call.reference.empty() ? call.reference : paged ? in.paged_reference : in.reference,
          failure);
      if (!failure.empty()) throw std::runtime_error(failure);
    }
    warm_up_decode_row(call.call);
    const std::function<void()> flush = [] {
      if (l2_flush) (*l2_flush)();
    };
    measurement.median_ms =
        time_row(state, c.name() + " " + implementation, call.call, config.api ? kApiSteps : 0, flush);
    measurement.gbps = c.kv_bytes() / (measurement.median_ms * 1e-3) / 1e9;
    measurement.splits = call.splits;
    state.counters["median_ms"] = measurement.median_ms;
    state.counters["GBps"] = measurement.gbps;
    state.counters["copy_fraction"] = measurement.gbps / copy_gbps;
    state.counters["kv_bytes"] = c.kv_bytes();
    state.counters["max_abs_err"] = measurement.max_abs_error;
    if (read) state.counters["blocks_per_sm"] = measurement.splits;
    else if (!torch) state.counters["splits"] = measurement.splits;
    const std::string launch = torch ? ""
                               : read ? ", " + std::to_string(measurement.splits) + " blocks an SM"
                                      : ", splits " + std::to_string(measurement.splits);
    std::fprintf(stderr, "  %.2f us, %.0f GB/s, %.1f%% of copy%s\n", measurement.median_ms * 1e3, measurement.gbps,
                 100 * measurement.gbps / copy_gbps, launch.c_str());
  } catch (const std::exception& error) {
    fail_row(state, measurement, error);
    std::fprintf(stderr, "  %s\n", measurement.error.c_str());
  }
  keep_measurement(measurement);
}

void print_decode_summary(const BenchConfig& config) {
  std::printf("\ncopy bandwidth measured in this run: %.0f GB/s (at::Tensor::copy_ of %zu GiB device to device, "
              "(read + write) / time, median of 20)\n",
              copy_gbps, kCopyBytes >> 30);
  std::printf("%-34s %-24s %6s %10s %8s %7s %9s %9s\n", "case", "implementation", "splits", "median us", "GB/s",
              "% copy", "vs flash", "vs cudnn");
  std::vector<std::string> case_order;
  for (const auto& m : measurements)
    if (std::find(case_order.begin(), case_order.end(), m.case_name) == case_order.end())
      case_order.push_back(m.case_name);
  for (const auto& case_name : case_order) {
    auto reference_ms = [&](const char* name) {
      for (const auto& m : measurements)
        if (m.case_name == case_name && m.implementation == name && m.error.empty()) return m.median_ms;
      return 0.0;
    };
    const double flash_ms = reference_ms("sdpa_flash"), cudnn_ms = reference_ms("sdpa_cudnn");
    for (const auto& m : measurements) {
      if (m.case_name != case_name) continue;
      if (!m.error.empty()) {
        std::printf("%-34s %-24s   %s\n", case_name.c_str(), m.implementation.c_str(), m.error.substr(0, 200).c_str());
        continue;
      }
      char splits[16] = "-", flash_ratio[16] = "-", cudnn_ratio[16] = "-";
      if (m.implementation.rfind("sdpa_", 0) != 0 && m.implementation != kPlainRead)
        std::snprintf(splits, sizeof splits, "%d", m.splits);
      if (flash_ms > 0) std::snprintf(flash_ratio, sizeof flash_ratio, "%.2fx", flash_ms / m.median_ms);
      if (cudnn_ms > 0) std::snprintf(cudnn_ratio, sizeof cudnn_ratio, "%.2fx", cudnn_ms / m.median_ms);
      std::printf("%-34s %-24s %6s %10.2f %8.0f %6.1f%% %9s %9s\n", case_name.c_str(), m.implementation.c_str(),
                  splits, m.median_ms * 1e3, m.gbps, 100 * m.gbps / copy_gbps, flash_ratio, cudnn_ratio);
    }
  }
  std::printf("GB/s: K and V bytes read (2 x batch x L x kv_heads x head_dim x element size) / median time; "
              "%% copy: of the copy bandwidth above; ratios > 1 mean faster than that torch backend; splits: "
              "the kernel's split-KV count (--num-splits %d%s); L2 %s before each timed call; torch inputs %s\n",
              config.num_splits, config.num_splits == 0 ? ": its heuristic" : "",
              config.flush_l2 ? "flushed" : "not flushed",
              config.decode_torch_bhsd() ? "contiguous (B, H, L, D) copies"
                                         : "transposed views of the (B, L, H, D) cache");
  if (config.api)
    std::printf("--api: a row's time is one step of a loop of %d calls timed as a whole (median of %d loops): "
                "kernels through flashlab::attention_with_kvcache, host time included\n",
                kApiSteps, config.samples);
}

// --decode in place of the forward benchmark; returns the exit code.
int run_decode(const BenchConfig& config) {
  copy_gbps = measure_copy_gbps(kCopyBytes);
  if (config.flush_l2) l2_flush.emplace();
  c10::cuda::CUDACachingAllocator::emptyCache();
  size_t free_bytes = 0, total_bytes = 0;
  FLASHLAB_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  benchmark::AddCustomContext("mode", "decode");
  benchmark::AddCustomContext("copy_GBps", std::to_string(copy_gbps));
  benchmark::AddCustomContext("copy_bytes", std::to_string(kCopyBytes));
  benchmark::AddCustomContext("copy_convention", "(read + write) / time");
  benchmark::AddCustomContext("l2_flush", config.flush_l2 ? "on" : "off");
  benchmark::AddCustomContext("torch_layout", config.decode_torch_bhsd() ? "bhsd" : "cache");  // older JSONs' name
  benchmark::AddCustomContext("page_size", std::to_string(config.page_size));
  benchmark::AddCustomContext("num_splits", std::to_string(config.num_splits));
  benchmark::AddCustomContext("timing", config.api ? "api loop of " + std::to_string(kApiSteps) : "device, gated");
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);
  std::printf("copy bandwidth: %.0f GB/s ((read + write) / time, %zu GiB copy_); %.1f GiB free for the cases\n",
              copy_gbps, kCopyBytes >> 30, free_bytes / double(1 << 30));

  std::vector<std::string> kernels;
  for (const auto& kernel : flashlab::registered_kernels())
    if (kernel.kvcache_launch != nullptr &&
        (config.kernels.empty() ||
         std::find(config.kernels.begin(), config.kernels.end(), kernel.name) != config.kernels.end()))
      kernels.push_back(kernel.name);
  if (kernels.empty()) std::printf("no registered kernel has a KV-cache path: timing torch's backends only\n");

  struct Row {
    DecodeCase c;
    std::string implementation, skip_reason;
  };
  std::vector<Row> rows;
  for (const int head_dim : config.head_dims)
    for (const auto& [heads, kv_heads] : config.head_counts)
      for (const int batch : config.batches)
        for (const int cache_len : config.cache_lens) {
          const DecodeCase c{batch, heads, kv_heads, head_dim, cache_len, config.dtype};
          std::vector<std::string> implementations;
          if (config.contiguous_cache) {
            implementations = kernels;
            for (const auto& kernel : kernels)
              for (const std::string& modification : config.modifications)
                implementations.push_back(kernel + "+" + modification);
          }
          for (const auto& backend : config.backends) implementations.push_back("sdpa_" + backend);
          if (config.plain_read) implementations.push_back(kPlainRead);
          if (config.paged_cache)
            for (const auto& kernel : kernels)
              implementations.push_back(kernel + kPagedMarker + std::to_string(config.page_size) + ")");
          // K/V, SDPA's copies of them, and 2 GiB for q, out, split partials,
          // the float32 reference of one sequence and torch's workspaces.
          const bool torch_copies = config.decode_torch_bhsd() && !config.backends.empty();
          const double needed = c.kv_bytes() * (torch_copies ? 2 : 1) + double(size_t(2) << 30);
          std::string case_skip;
          if (needed > double(free_bytes)) {
            char text[200];
            std::snprintf(text, sizeof text, "skipped: needs about %.1f GiB of device memory, %.1f GiB free",
                          needed / double(1 << 30), free_bytes / double(1 << 30));
            case_skip = text;
            std::printf("%s: %s\n", c.name().c_str(), text);
          }
          for (const auto& implementation : implementations) {
            bool paged = false;
            decode_kernel_of(implementation, &paged);
            std::string skip = case_skip;
            if (skip.empty() && paged && cache_len % config.page_size != 0) {
              skip = "skipped: cache length " + std::to_string(cache_len) + " is not a multiple of --page-size " +
                     std::to_string(config.page_size);
              std::printf("%s/%s: %s\n", c.name().c_str(), implementation.c_str(), skip.c_str());
            }
            rows.push_back({c, implementation, skip});
          }
        }
  std::fflush(stdout);
  for (size_t index = 0; index < rows.size(); ++index) {
    const Row row = rows[index];
    const std::string progress = "[" + std::to_string(index + 1) + "/" + std::to_string(rows.size()) + "]";
    benchmark::RegisterBenchmark((row.c.name() + "/" + row.implementation).c_str(),
                                 [row, progress, &config](benchmark::State& state) {
                                   run_decode_benchmark(state, row.c, row.implementation, config, row.skip_reason,
                                                        progress);
                                 })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(config.samples);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_decode_summary(config);
  decode_current = {};  // device memory goes back before the CUDA context does
  l2_flush.reset();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchConfig config;
  std::vector<std::string> benchmark_flags;
  try {
    const std::optional<BenchConfig> parsed = parse_own_flags(argc, argv, benchmark_flags);
    if (!parsed) return 0;  // --help
    config = *parsed;
  } catch (const flashlab::ArgumentError& error) {
    std::cerr << "flashlab-bench: " << error.what() << " (see --help)\n";
    return 2;
  }
  // Google Benchmark sees the program name and its own flags only.
  std::vector<char*> benchmark_argv = {argv[0]};
  for (auto& flag : benchmark_flags) benchmark_argv.push_back(flag.data());
  int benchmark_argc = static_cast<int>(benchmark_argv.size());
  benchmark::Initialize(&benchmark_argc, benchmark_argv.data());
  if (benchmark::ReportUnrecognizedArguments(benchmark_argc, benchmark_argv.data())) return 2;
  const std::string unavailable = flashlab::cuda_unavailable_reason();
  if (!unavailable.empty()) {
    std::cerr << "flashlab-bench: cannot run: " << unavailable << "\n";
    return 3;
  }
  if (config.device >= 0) {
    const std::string problem = flashlab::select_cuda_device(config.device);
    if (!problem.empty()) {
      std::cerr << "flashlab-bench: " << problem << "\n";
      return 2;
    }
  }
  cudaDeviceProp properties{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&properties, flashlab::current_cuda_device().index()));
  benchmark::AddCustomContext("gpu", properties.name);
  if (config.decode) return run_decode(config);
  if (config.sweep) {
    benchmark::AddCustomContext("sweep", "tuning_kernels");
    check_tuning_kernels(config);
  }
  matmul_peak_tflops = measure_matmul_peak_tflops();
  benchmark::AddCustomContext("matmul_peak_tflops", std::to_string(matmul_peak_tflops));
  benchmark::AddCustomContext("torch_version", TORCH_VERSION);

  std::string direction_names;
  for (const Direction direction : config.directions)
    direction_names += (direction_names.empty() ? "" : ",") + std::string(flashlab::direction_name(direction));
  benchmark::AddCustomContext("directions", direction_names);
  sdpa_bhsd_copies = config.forward_torch_bhsd() && !config.backends.empty();
  benchmark::AddCustomContext("torch_layout", config.forward_torch_bhsd() ? "bhsd" : "views");
  api_loops = config.api;
  benchmark::AddCustomContext("timing", api_loops ? "api loop of " + std::to_string(kForwardApiSteps) : "device, gated");

  const auto selected = [&](const std::string& name) {
    return config.kernels.empty() || std::find(config.kernels.begin(), config.kernels.end(), name) != config.kernels.end();
  };
  for (const Direction direction : config.directions) {
    const bool forward = direction == Direction::forward;
    // Forward: every selected kernel and backend. Backward directions: kernels
    // with a backward, in default and deterministic mode, and torch's backends
    // with a pinned backward op.
    std::vector<std::string> implementations;
    for (const auto& kernel : config.sweep ? flashlab::tuning_kernels() : flashlab::registered_kernels()) {
      if (!selected(kernel.name) || (!forward && kernel.backward_launch == nullptr)) continue;
      implementations.push_back(kernel.name);
      if (!forward) implementations.push_back(kernel.name + kDeterministicSuffix);
      for (const std::string& modification : config.modifications) implementations.push_back(kernel.name + "+" + modification);
      if (forward && config.fp8) implementations.push_back(kernel.name + "+e4m3");  // kept where the kernel takes it
    }
    for (const auto& backend : config.backends)
      if (forward || std::find(kBackwardBackends.begin(), kBackwardBackends.end(), backend) != kBackwardBackends.end())
        implementations.push_back("sdpa_" + backend);

  for (const int head_dim : config.head_dims)
    for (const int seqlen : config.seqlens)
      for (const bool causal : config.causal) {
        ProblemSpec spec;
        spec.head_dim = head_dim;
        spec.heads = spec.kv_heads = std::max(1, config.model_dim / head_dim);
        spec.seqlen_q = spec.seqlen_k = seqlen;
        spec.batch = std::max(1, config.tokens / seqlen);
        spec.dtype = config.dtype;
        spec.causal = causal;
        spec.seed = 1234;
        // Forward names as they always were; the backward directions lead with theirs.
        const std::string case_name = (forward ? "" : std::string(flashlab::direction_name(direction)) + "/") +
                                      "d" + std::to_string(head_dim) + "/s" + std::to_string(seqlen) + "/b" +
                                      std::to_string(spec.batch) + "/h" + std::to_string(spec.heads) +
                                      (causal ? "/causal" : "/full");
        for (const auto& implementation : implementations) {
          const bool torch = implementation.rfind("sdpa_", 0) == 0;
          std::string modification;
          spec.kernel = torch ? "auto" : kernel_of(implementation, nullptr, &modification);
          if (!torch) {
            const flashlab::KernelVariant& kernel = *flashlab::find_any_kernel(spec.kernel);
            const ProblemSpec asked = modified_spec(spec, modification);
            const std::string reason = forward ? flashlab::unsupported_reason(kernel, asked)
                                               : flashlab::backward_unsupported_reason(kernel, asked);
            if (!reason.empty()) continue;
          }
          benchmark::RegisterBenchmark((case_name + "/" + implementation).c_str(),
                                       [=](benchmark::State& state) {
                                         run_benchmark(state, case_name, implementation, direction, spec);
                                       })
              ->UseManualTime()
              ->Unit(benchmark::kMillisecond)
              ->MinTime(0.3);
        }
      }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  print_summary(config);
  return 0;
}
