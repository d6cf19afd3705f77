// flashlab-bench: every registered kernel and torch SDPA's backends (pinned one
// at a time) on the same inputs, timed with CUDA events (Google Benchmark
// manual time), with a summary of medians, TFLOP/s, the fraction of the bf16
// matmul peak measured in the same run, and ratios to torch's FLASH and cuDNN.
//
// Own flags (Google Benchmark's --benchmark_* flags work as usual):
//   --head-dims=64,128  --seqlens=1024,4096,16384  --tokens=32768 (batch = tokens / seqlen)
//   --model-dim=2048 (heads = model-dim / head_dim)  --dtype=fp32|fp16|bf16  --causal=both|on|off
//   --kernels=all|name,name  --backends=all|flash,cudnn,efficient,math|none
//   --direction=fwd|bwd|fwdbwd (a list times each): bwd times the backward
//     alone, given the forward's saved out and lse (each implementation's own
//     forward, run once before timing); fwdbwd times forward then backward.
//     FLOPs: 2.5x (bwd) and 3.5x (fwdbwd) the forward's. Every registered
//     kernel with a backward runs in default mode and deterministic mode
//     ("<kernel>(det)"); torch's FLASH and cuDNN backends through their own
//     backward ops (at::_scaled_dot_product_{flash,cudnn}_attention_backward)
//     on their own forward's outputs, same inputs and dout.
// (flashlab-run's grammar: --name value or --name=value; bad values exit 2, see --help)
//   --sweep: instead of the registered kernels and all SDPA backends, every
//     tuning_kernels() tile configuration that takes the case (fa2_mma_sm80
//     block sizes, warps, stages, Q in registers or shared memory; --kernels
//     filters them) plus sdpa_flash as the yardstick (--backends overrides it).
//     Each configuration first has to pass flashlab::check_kernel on a small
//     odd causal problem (batch 1, 2 heads, seqlen 257 x 300, its head dim, the
//     bench dtype); one that fails is reported with the reason and not timed.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <benchmark/benchmark.h>
#include <torch/version.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
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
using flashlab::median;
using flashlab::ProblemSpec;

const std::vector<std::string> kBackends = {"flash", "cudnn", "efficient", "math"};
// The torch backends with a backward op of their own that can be pinned.
const std::vector<std::string> kBackwardBackends = {"flash", "cudnn"};
// A registered kernel's backward in deterministic mode: "<kernel>(det)".
const std::string kDeterministicSuffix = "(det)";

struct BenchConfig {
  std::vector<int> head_dims = {64, 128};
  std::vector<int> seqlens = {1024, 4096, 16384};
  int tokens = 32768;
  int model_dim = 2048;
  at::ScalarType dtype = at::kBFloat16;
  std::vector<bool> causal = {false, true};
  std::vector<std::string> kernels;  // empty: all registered
  std::vector<std::string> backends = kBackends;
  bool backends_given = false;
  bool sweep = false;  // tuning_kernels() instead of registered_kernels()
  std::vector<Direction> directions = {Direction::forward};
};

// Our flags; Google Benchmark's --benchmark_* flags are handed back in `passed_through`.
// Throws flashlab::ArgumentError (exit 2). nullopt: --help was printed.
std::optional<BenchConfig> parse_own_flags(int argc, char** argv, std::vector<std::string>& passed_through) {
  BenchConfig config;
  std::vector<std::string> kernels;
  bool kernels_given = false;
  using flashlab::parse_int;
  constexpr int kIntMax = std::numeric_limits<int>::max();
  flashlab::ArgumentParser parser(
      "flashlab-bench",
      "Every registered kernel and torch SDPA's backends on the same inputs, timed with CUDA events.",
      "exit codes: 0 done, 2 bad arguments, 3 no usable GPU\n");
  parser
      .option("--head-dims", "D1,D2,...", "(default 64,128)",
              [&](const std::string& v) { config.head_dims = flashlab::parse_int_list("--head-dims", v, 1, kIntMax); })
      .option("--seqlens", "S1,S2,...", "seqlen_q = seqlen_k (default 1024,4096,16384)",
              [&](const std::string& v) { config.seqlens = flashlab::parse_int_list("--seqlens", v, 1, kIntMax); })
      .option("--tokens", "N", "batch = tokens / seqlen (default 32768)",
              [&](const std::string& v) { config.tokens = parse_int("--tokens", v, 1, kIntMax); })
      .option("--model-dim", "N", "heads = model-dim / head_dim (default 2048)",
              [&](const std::string& v) { config.model_dim = parse_int("--model-dim", v, 1, kIntMax); })
      .option("--dtype", "fp32|fp16|bf16", "(default bf16)",
              [&](const std::string& v) { config.dtype = flashlab::parse_dtype("--dtype", v); })
      .option("--causal", "both|on|off", "(default both)",
              [&](const std::string& v) {
                config.causal = flashlab::parse_choice<std::vector<bool>>(
                    "--causal", v, {{"both", {false, true}}, {"on", {true}}, {"off", {false}}});
              })
      .option("--kernels", "all|NAME,...",
              "registered kernels to time (with --sweep: tuning configurations) (default all)",
              [&](const std::string& v) {
                kernels = v == "all" ? std::vector<std::string>{} : flashlab::parse_list("--kernels", v);
                kernels_given = true;
              })
      .option("--backends", "all|none|flash,cudnn,efficient,math", "torch SDPA backends (default all)",
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
              })
      .flag("--sweep",
            "time every tuning configuration that takes the case (after a correctness\ncheck) against "
            "sdpa_flash, instead of the registered kernels",
            [&] { config.sweep = true; })
      .pass_through("--benchmark_", "Google Benchmark's own flags (--benchmark_filter=REGEX, --benchmark_out=FILE, ...)");
  const auto result = parser.parse(argc, argv);
  if (result.help) {
    std::cout << parser.usage();
    return std::nullopt;
  }
  passed_through = result.passed_through;
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
  const auto options = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA);
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
};
std::vector<Measurement> measurements;
double matmul_peak_tflops = 0;

// Inputs of the case being timed; all implementations of a case share them.
struct CurrentInputs {
  std::string case_name;
  flashlab::ProblemInputs inputs;
  at::Tensor dout;  // the upstream gradient of the backward directions
} current;

const CurrentInputs& inputs_for(const std::string& case_name, const ProblemSpec& spec, Direction direction) {
  if (current.case_name != case_name) {
    current = {};
    c10::cuda::CUDACachingAllocator::emptyCache();
    current.inputs = flashlab::make_inputs(spec, at::Device(at::kCUDA, 0));
    if (direction != Direction::forward) current.dout = flashlab::make_dout(spec, current.inputs);
    current.case_name = case_name;
  }
  return current;
}

// "fa2_mma_sm80(det)" -> "fa2_mma_sm80", deterministic.
std::string kernel_of(const std::string& implementation, bool* deterministic = nullptr) {
  const size_t suffix = implementation.size() >= kDeterministicSuffix.size()
                            ? implementation.size() - kDeterministicSuffix.size()
                            : 0;
  const bool det = implementation.compare(suffix, std::string::npos, kDeterministicSuffix) == 0;
  if (deterministic) *deterministic = det;
  return det ? implementation.substr(0, suffix) : implementation;
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
  const flashlab::ProblemInputs& inputs = current.inputs;
  const at::Tensor q = inputs.q.transpose(1, 2), k = inputs.k.transpose(1, 2), v = inputs.v.transpose(1, 2);
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
  const std::string kernel = kernel_of(implementation, &deterministic);
  const flashlab::ProblemInputs& inputs = current.inputs;
  ProblemSpec named = spec;
  named.kernel = kernel;
  const flashlab::BackwardOptions options = flashlab::backward_options(named, deterministic);
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
    // SDPA wants (batch, heads, seqlen, head_dim): the same memory, transposed views.
    const at::Tensor q = inputs.q.transpose(1, 2), k = inputs.k.transpose(1, 2), v = inputs.v.transpose(1, 2);
    const bool gqa = spec.heads != spec.kv_heads;
    return [=] {
      pin_sdpa_backend(backend);
      at::scaled_dot_product_attention(q, k, v, {}, 0.0, spec.causal, std::nullopt, gqa);
    };
  }
  at::Tensor out = at::empty(inputs.q.sizes(), inputs.q.options());
  at::Tensor lse = at::empty({spec.batch, spec.heads, spec.seqlen_q}, inputs.q.options().dtype(at::kFloat));
  if (flashlab::find_kernel(implementation) != nullptr) {
    // A registered kernel: the public call, validation and dispatch included.
    const flashlab::AttentionOptions options = spec.attention_options();
    return [=] { flashlab::attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse, options); };
  }
  // A tuning configuration: the harness's entry (validates, then launches).
  const flashlab::KernelVariant* kernel = flashlab::find_any_kernel(implementation);
  const flashlab::AttentionParams params = flashlab::forward_params(spec, inputs, out, lse);
  return [=] { flashlab::run_kernel(*kernel, params); };
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
    EventTimer timer;
    for (int warmup = 0; warmup < 3; ++warmup) call();
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> times;
    for (auto _ : state) {
      const float ms = timer.time_ms(call);
      times.push_back(ms);
      state.SetIterationTime(ms * 1e-3);
    }
    measurement.median_ms = median(times);
    measurement.tflops = flashlab::attention_flops(spec, direction) / (measurement.median_ms * 1e-3) / 1e12;
    state.counters["median_ms"] = measurement.median_ms;
    state.counters["TFLOPS"] = measurement.tflops;
    state.counters["peak_fraction"] = measurement.tflops / matmul_peak_tflops;
    // Device memory one call allocates on top of its inputs (outputs, LSE, workspaces).
    state.counters["peak_MB"] = flashlab::peak_bytes_during(call) / 1e6;
  } catch (const std::exception& error) {
    std::string message = error.what();
    if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error))
      message = torch_error->what_without_backtrace();
    message = message.substr(0, message.find('\n'));
    measurement.error = message;
    c10::cuda::CUDACachingAllocator::emptyCache();
    cudaGetLastError();
    state.SkipWithError(message.c_str());
  }
  // Google Benchmark calls this more than once per benchmark (to size the
  // iteration count); the last call, with the most iterations, is kept.
  for (auto& existing : measurements)
    if (existing.case_name == case_name && existing.implementation == implementation) {
      existing = measurement;
      return;
    }
  measurements.push_back(measurement);
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
  std::printf("%-44s %-*s %10s %9s %7s %9s %9s%s\n", "case", width, "implementation", "median ms", "TFLOP/s",
              "% peak", "vs flash", "vs cudnn", backward ? "   det/def" : "");
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
      char flash_ratio[16] = "-", cudnn_ratio[16] = "-", det_ratio[24] = "";
      if (flash_ms > 0) std::snprintf(flash_ratio, sizeof flash_ratio, "%.2fx", flash_ms / m.median_ms);
      if (cudnn_ms > 0) std::snprintf(cudnn_ratio, sizeof cudnn_ratio, "%.2fx", cudnn_ms / m.median_ms);
      if (backward) {
        bool deterministic = false;
        const std::string kernel = kernel_of(m.implementation, &deterministic);
        const double default_ms = deterministic ? reference_ms(kernel.c_str()) : 0;
        if (default_ms > 0) std::snprintf(det_ratio, sizeof det_ratio, " %9.2fx", m.median_ms / default_ms);
        else std::snprintf(det_ratio, sizeof det_ratio, " %9s", "-");
      }
      std::printf("%-44s %-*s %10.3f %9.1f %6.1f%% %9s %9s%s\n", case_name.c_str(), width, m.implementation.c_str(),
                  m.median_ms, m.tflops, 100 * m.tflops / matmul_peak_tflops, flash_ratio, cudnn_ratio, det_ratio);
    }
  }
  std::printf("ratios > 1 mean faster than that torch backend (time of the backend / time of the row)\n");
  if (backward)
    std::printf("bwd: the backward alone, given the forward's out and lse; fwdbwd: both in one timed call; "
                "TFLOP/s count 2.5x / 3.5x the forward's FLOPs; det/def: a deterministic row's time over "
                "its kernel's default mode\n");
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
  cudaDeviceProp properties{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  benchmark::AddCustomContext("gpu", properties.name);
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
          spec.kernel = torch ? "auto" : kernel_of(implementation);
          if (!torch) {
            const flashlab::KernelVariant& kernel = *flashlab::find_any_kernel(spec.kernel);
            const std::string reason = forward ? flashlab::unsupported_reason(kernel, spec)
                                               : flashlab::backward_unsupported_reason(kernel, spec);
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
