// Internal to the op library: the one host path every mode takes from its
// parameter block to the launch. A mode is a parameter block type
// (AttentionParams: the forward, fixed-length or varlen; AttentionBackwardParams;
// KvCacheParams); KernelMode<Params> below is the one place that says what the
// path needs of a KernelVariant for that mode (its hooks, its words in the
// messages). Written once here, for every mode:
//   mode_cannot_run_reason   why a kernel cannot run a problem (problem, device,
//                            the mode's own extras), empty when it can;
//   select_mode_kernel       "auto" or a named kernel, with or without head-dim
//                            padding, and the errors that list every reason;
//   launch_mode_kernel       the launch: pointers, an empty problem, the
//                            workspace (prepare_launch), the mode's hook;
//                            run_mode_kernel checks the kernel's reason first;
//   run_at_kernel_head_dim   the tensors as they are, or zero-padded to the
//                            head dim the kernel runs, with the results sliced
//                            back into the caller's tensors.
// A new mode is a new KernelMode specialization and its entry points, not a
// copy of this path.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/attention.h"
#include "validation.h"

namespace flashlab::detail {

template <class Params>
struct KernelMode;  // one specialization a mode

// The forward (fixed-length and variable-length).
template <>
struct KernelMode<AttentionParams> {
  static constexpr const char* kEntry = "attention_forward";   // the entry that pads head dims
  static constexpr const char* kCannotRun = " cannot run ";     // "kernel X cannot run <problem>"
  static constexpr const char* kNoneCanRun = "no registered kernel can run ";
  static constexpr auto kModifications = &KernelVariant::forward_score_modifications;
  static constexpr const char* kModeWords = "";
  static bool has(const KernelVariant& kernel) { return kernel.launch != nullptr; }
  static std::string missing(const KernelVariant& kernel) { return kernel.name + " has no forward"; }
  static std::string problem_reason(const KernelVariant& kernel, const AttentionParams& params) {
    return kernel.unsupported_reason(params);
  }
  static std::string extra_reason(const KernelVariant& kernel, const AttentionParams& params) {
    if (params.dtype == DataType::e4m3 && !kernel.supports_e4m3)
      return kernel.name + " takes no e4m3 (FP8) inputs (supports_e4m3 is off; fa3_wgmma_sm90 takes them on sm_90a)";
    if (params.trace.enabled() && !kernel.supports_tile_trace)
      return kernel.name + " does not record tile states (supports_tile_trace is off)";
    // The traced instantiations are the plain ones (the trace's m and l would hold the sink otherwise).
    if (params.trace.enabled() && params.modification.any())
      return kernel.name + " records tile states only without score modifications (softcap, alibi_slopes, sinks)";
    return {};
  }
  static std::string describe(const AttentionParams& params) { return describe_problem(params); }
  static AttentionParams at_head_dim(const AttentionParams& params, int head_dim) {
    return params_at_head_dim(params, head_dim);
  }
  static void check_pointers(const AttentionParams&) {}
  // true: nothing to launch (what an empty problem must still write is written).
  static bool finish_empty(const AttentionParams& params) { return params.seqlen_q == 0 || params.batch == 0; }
  static void prepare(AttentionParams&) {}
  static auto workspace_bytes(const KernelVariant& kernel) { return kernel.workspace_bytes; }
  static void launch(const KernelVariant& kernel, const AttentionParams& params) { kernel.launch(params); }
};

// The backward (attention_backward.cpp defines the hooks it does not inline).
template <>
struct KernelMode<AttentionBackwardParams> {
  static constexpr const char* kEntry = "attention_backward";
  static constexpr const char* kCannotRun = " cannot run the backward of ";
  static constexpr const char* kNoneCanRun = "no registered kernel has a backward that can run ";
  static constexpr auto kModifications = &KernelVariant::backward_score_modifications;
  static constexpr const char* kModeWords = "'s backward";
  static bool has(const KernelVariant& kernel) { return kernel.backward_launch != nullptr; }
  static std::string missing(const KernelVariant& kernel);  // "X has no backward pass (kernels with one: ...)"
  static std::string problem_reason(const KernelVariant& kernel, const AttentionBackwardParams& params) {
    return kernel.backward_unsupported_reason != nullptr ? kernel.backward_unsupported_reason(params) : "";
  }
  static std::string extra_reason(const KernelVariant& kernel, const AttentionBackwardParams& params) {
    if (params.dtype == DataType::e4m3)
      return kernel.name + "'s backward takes no e4m3 (FP8) inputs (the FP8 path is a forward only)";
    if (params.trace.enabled())
      return kernel.name + "'s backward does not record tile states (tile traces are forward only)";
    return {};
  }
  static std::string describe(const AttentionBackwardParams& params) { return describe_problem(params); }
  static AttentionBackwardParams at_head_dim(const AttentionBackwardParams& params, int head_dim) {
    return params_at_head_dim(params, head_dim);
  }
  static void check_pointers(const AttentionBackwardParams& params);
  static bool finish_empty(const AttentionBackwardParams& params);  // zeroes the gradients that have rows
  static void prepare(AttentionBackwardParams& params) {
    // softmax_d and dq_accum are the kernel's to carve from the workspace.
    params.softmax_d = nullptr;
    params.dq_accum = nullptr;
    params.workspace = nullptr;
    params.workspace_bytes = 0;
  }
  static auto workspace_bytes(const KernelVariant& kernel) { return kernel.backward_workspace_bytes; }
  static void launch(const KernelVariant& kernel, const AttentionBackwardParams& params) {
    kernel.backward_launch(params);
  }
};

// Decoding with a KV cache (attention_kvcache.cpp defines the hooks it does not inline).
template <>
struct KernelMode<KvCacheParams> {
  static constexpr const char* kEntry = "attention_with_kvcache";
  static constexpr const char* kCannotRun = " cannot run ";
  static constexpr const char* kNoneCanRun = "no registered kernel can run ";
  static constexpr auto kModifications = &KernelVariant::kvcache_score_modifications;
  static constexpr const char* kModeWords = "'s KV-cache path";
  static bool has(const KernelVariant& kernel) { return kernel.kvcache_launch != nullptr; }
  static std::string missing(const KernelVariant& kernel);  // "X has no KV-cache path; kernels with one: ..."
  static std::string problem_reason(const KernelVariant& kernel, const KvCacheParams& params) {
    return kernel.kvcache_unsupported_reason(params);
  }
  static std::string extra_reason(const KernelVariant& kernel, const KvCacheParams& params) {
    if (params.block_timeline != nullptr && !kernel.supports_block_timeline)
      return kernel.name + " records no block timeline (supports_block_timeline is off); got a block_timeline buffer";
    return {};
  }
  static std::string describe(const KvCacheParams& params) { return describe_kvcache_problem(params); }
  static KvCacheParams at_head_dim(const KvCacheParams& params, int head_dim);
  static void check_pointers(const KvCacheParams& params) {
    TORCH_CHECK(params.q != nullptr && params.k != nullptr && params.v != nullptr && params.out != nullptr,
                "run_kvcache_kernel needs q, k_cache, v_cache and out pointers");
  }
  static bool finish_empty(const KvCacheParams& params) { return params.batch == 0 || params.seqlen_q == 0; }
  static void prepare(KvCacheParams&) {}
  static auto workspace_bytes(const KernelVariant& kernel) { return kernel.kvcache_workspace_bytes; }
  static void launch(const KernelVariant& kernel, const KvCacheParams& params) { kernel.kvcache_launch(params); }
};

// The launch's device, q's, made current for the call; `names` (e.g. "q, k and
// v") must be on a CUDA device. (The last check of every entry: the others
// can be provoked on CPU tensors.)
inline c10::cuda::CUDAGuard cuda_device_guard(const at::Tensor& q, const char* names) {
  TORCH_CHECK(q.is_cuda(), names, " must be on a CUDA device; got ", q.device());
  return c10::cuda::CUDAGuard(q.device());
}

// "fa2_mma_sm80, fa1_scalar": the registered kernels that have the mode ("none").
template <class Params>
std::string kernels_with_mode() {
  std::string names;
  for (const auto& kernel : registered_kernels())
    if (KernelMode<Params>::has(kernel)) names += (names.empty() ? "" : ", ") + kernel.name;
  return names.empty() ? "none" : names;
}

// Why `kernel` cannot run `params` in their mode: it has none, the problem
// (the mode's unsupported_reason), the device, the mode's extras. Empty: it can.
template <class Params>
std::string mode_cannot_run_reason(const KernelVariant& kernel, const Params& params) {
  using Mode = KernelMode<Params>;
  if (!Mode::has(kernel)) return Mode::missing(kernel);
  std::string reason = score_modification_reason(kernel, params.modification, Mode::kModifications, Mode::kModeWords);
  if (reason.empty()) reason = Mode::problem_reason(kernel, params);
  if (reason.empty()) reason = architecture_reason(kernel, params.device_compute_capability);
  if (reason.empty()) reason = Mode::extra_reason(kernel, params);
  return reason;
}

// As mode_cannot_run_reason, at the head dim the kernel would pad params to
// (padded_head_dim). A kernel with no head dim that large gives its problem
// reason at the head dim given, else says it has none.
template <class Params>
std::string padded_mode_cannot_run_reason(const KernelVariant& kernel, const Params& params) {
  using Mode = KernelMode<Params>;
  if (!Mode::has(kernel)) return Mode::missing(kernel);
  const int padded = padded_head_dim(kernel, params.head_dim);
  if (padded == params.head_dim) return mode_cannot_run_reason(kernel, params);
  if (padded <= 0) {
    const std::string own = Mode::problem_reason(kernel, params);
    return own.empty() ? kernel.name + " has no head_dim of " + std::to_string(params.head_dim) + " or more" : own;
  }
  return mode_cannot_run_reason(kernel, Mode::at_head_dim(params, padded));
}

// " (attention_forward would zero-pad head_dim 96 to 128 for fa3_wgmma_sm90; ...)"
// when padding is off and the kernel would pad; else empty.
template <class Params>
std::string unpadded_note(const KernelVariant& kernel, int head_dim, HeadDimPadding padding) {
  const int padded = padded_head_dim(kernel, head_dim);
  if (padding == HeadDimPadding::allowed || padded == head_dim || padded <= 0) return {};
  return std::string(" (") + KernelMode<Params>::kEntry + " would zero-pad head_dim " + std::to_string(head_dim) +
         " to " + std::to_string(padded) + " for " + kernel.name +
         "; the lower-level run_*_kernel entries and the harness run a kernel at its own head dims)";
}

// The kernel that runs `params`: "auto" is the first registered kernel that can
// (else an error listing every kernel's reason), a name is that kernel (else an
// error with its reason), and "NAME,auto" is NAME where it can, else auto (the
// autograd's choice: the forward's kernel when its backward takes the problem).
// With padding allowed a kernel is asked at the head dim it pads to.
template <class Params>
const KernelVariant& select_mode_kernel(const Params& params, const std::string& kernel_name,
                                        HeadDimPadding padding) {
  using Mode = KernelMode<Params>;
  const bool pad = padding == HeadDimPadding::allowed;
  const auto reason_for = [&](const KernelVariant& kernel) {
    return pad ? padded_mode_cannot_run_reason(kernel, params) : mode_cannot_run_reason(kernel, params);
  };
  constexpr std::string_view kOrAuto = ",auto";
  if (kernel_name.size() > kOrAuto.size() && kernel_name.ends_with(kOrAuto)) {
    const std::string preferred = kernel_name.substr(0, kernel_name.size() - kOrAuto.size());
    const KernelVariant* kernel = find_kernel(preferred);
    TORCH_CHECK(kernel != nullptr, "unknown kernel '", preferred, "'; registered kernels: ",
                registered_kernel_names(), " (or auto)");
    return reason_for(*kernel).empty() ? *kernel : select_mode_kernel(params, "auto", padding);
  }
  // The padding note goes after the reasons when a kernel's head dims ran out.
  const auto ran_out = [&](const KernelVariant& kernel) {
    return pad && Mode::has(kernel) && padded_head_dim(kernel, params.head_dim) <= 0;
  };
  if (kernel_name == "auto") {
    std::string reasons;
    bool head_dims_ran_out = false;
    for (const auto& kernel : registered_kernels()) {
      const std::string reason = reason_for(kernel);
      if (reason.empty()) return kernel;
      reasons += "\n  " + reason;
      head_dims_ran_out = head_dims_ran_out || ran_out(kernel);
    }
    TORCH_CHECK(false, Mode::kNoneCanRun, Mode::describe(params), ":", reasons,
                head_dims_ran_out ? kPaddingNote : "");
  }
  const KernelVariant* kernel = find_kernel(kernel_name);
  TORCH_CHECK(kernel != nullptr, "unknown kernel '", kernel_name, "'; registered kernels: ",
              registered_kernel_names(), " (or auto)");
  TORCH_CHECK(Mode::has(*kernel), "kernel ", Mode::missing(*kernel));
  const std::string reason = reason_for(*kernel);
  TORCH_CHECK(reason.empty(), "kernel ", kernel->name, Mode::kCannotRun, Mode::describe(params), ": ", reason,
              ran_out(*kernel) ? kPaddingNote : "", unpadded_note<Params>(*kernel, params.head_dim, padding));
  return *kernel;
}

// The launch on params.stream (null: the current stream) of a kernel known to
// take params as they are (selected for them, no padding): every pointer the
// mode needs set, nothing launched for an empty problem, the workspace
// (prepare_launch), the mode's hook.
template <class Params>
void launch_mode_kernel(const KernelVariant& kernel, Params params) {
  using Mode = KernelMode<Params>;
  Mode::check_pointers(params);
  params.stream = stream_or_current(params.stream);
  if (Mode::finish_empty(params)) return;  // no grid to launch
  Mode::prepare(params);
  // Freed when this returns (allocate_workspace records the stream).
  const at::Tensor workspace = prepare_launch(params, Mode::workspace_bytes(kernel));
  Mode::launch(kernel, params);
}

// launch_mode_kernel after checking that `kernel` takes params as they are:
// the lower-level run_kernel / run_backward_kernel / run_kvcache_kernel.
template <class Params>
void run_mode_kernel(const KernelVariant& kernel, const Params& params) {
  using Mode = KernelMode<Params>;
  const std::string reason = mode_cannot_run_reason(kernel, params);
  TORCH_CHECK(reason.empty(), "kernel ", kernel.name, Mode::kCannotRun, Mode::describe(params), ": ", reason);
  launch_mode_kernel(kernel, params);
}

// The tensors of one launch, for run_at_kernel_head_dim: inputs are read
// (undefined ones stay undefined); outputs are written: a defined one is the
// caller's, an undefined one is made like output_like[i] (same index) and
// returned; caches are read and written in place.
struct LaunchTensors {
  std::vector<at::Tensor> inputs, outputs, output_like, caches;
};

// Calls launch(tensors, options) with the tensors as they are when `kernel`
// runs head_dim itself, else with zero-padded copies of the inputs and the
// caches, fresh padded outputs and the unpadded softmax scale; then the padded
// outputs' first head_dim columns are the results (returned as views where the
// caller gave no output, else copied into its), and the caches' are copied
// back (O(cache): correct, not fast). Returns the outputs.
template <class Options, class Launch>
std::vector<at::Tensor> run_at_kernel_head_dim(const KernelVariant& kernel, int64_t head_dim, LaunchTensors tensors,
                                               const Options& options, const Launch& launch) {
  const int padded = padded_head_dim(kernel, static_cast<int>(head_dim));
  TORCH_CHECK(padded >= head_dim, kernel.name, " has no head_dim of ", head_dim, " or more");
  if (padded == head_dim) {
    for (size_t i = 0; i < tensors.outputs.size(); ++i)
      if (!tensors.outputs[i].defined())
        tensors.outputs[i] = at::empty(tensors.output_like[i].sizes(), tensors.output_like[i].options());
    launch(tensors, options);
    return tensors.outputs;
  }
  const auto pad = [&](const at::Tensor& tensor) { return tensor.defined() ? pad_head_dim(tensor, padded) : tensor; };
  LaunchTensors padded_tensors;
  for (const auto& input : tensors.inputs) padded_tensors.inputs.push_back(pad(input));
  for (const auto& cache : tensors.caches) padded_tensors.caches.push_back(pad(cache));
  for (size_t i = 0; i < tensors.outputs.size(); ++i) {
    const at::Tensor& like = tensors.outputs[i].defined() ? tensors.outputs[i] : tensors.output_like[i];
    std::vector<int64_t> sizes = like.sizes().vec();
    sizes.back() = padded;
    padded_tensors.outputs.push_back(at::empty(sizes, like.options()));
  }
  launch(padded_tensors, keep_softmax_scale(options, head_dim));
  for (size_t i = 0; i < tensors.outputs.size(); ++i) {
    const at::Tensor result = padded_tensors.outputs[i].narrow(-1, 0, head_dim);
    if (tensors.outputs[i].defined()) tensors.outputs[i].copy_(result);
    else tensors.outputs[i] = result;
  }
  for (size_t i = 0; i < tensors.caches.size(); ++i)
    tensors.caches[i].copy_(padded_tensors.caches[i].narrow(-1, 0, head_dim));
  return tensors.outputs;
}

}  // namespace flashlab::detail
