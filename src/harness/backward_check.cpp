#include "flashlab/harness/backward_check.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <iomanip>
#include <sstream>
#include <vector>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/event_timer.h"
#include "flashlab/harness/random_inputs.h"
#include "check_pipeline.h"
#include "json_text.h"

namespace flashlab {
namespace {

// Tensors of the right shapes and no values for what the caller left undefined.
ForwardOutputs shaped_outputs(const ProblemSpec& spec, const ProblemInputs& inputs,
                              const ForwardOutputs& outputs) {
  if (outputs.out.defined() && outputs.lse.defined()) return outputs;
  const std::vector<int64_t> lse_shape =
      spec.is_varlen() ? std::vector<int64_t>{spec.heads, inputs.q.size(0)}
                       : std::vector<int64_t>{inputs.q.size(0), spec.heads, inputs.q.size(1)};
  return {at::empty(inputs.q.sizes(), inputs.q.options().memory_format(at::MemoryFormat::Contiguous)),
          at::empty(lse_shape, inputs.q.options().dtype(at::kFloat))};
}

std::string tolerance_text(const Tolerance& tolerance, const char* rule) {
  std::ostringstream text;
  text << std::setprecision(4) << "torch same-precision error " << tolerance.same_precision_err
       << ", rounding atol " << tolerance.rounding_atol << ", float32 floor "
       << tolerance.float32_floor;
  if (tolerance.stored_output_term > 0) text << ", stored-output term " << tolerance.stored_output_term;
  text << " -> tolerance " << tolerance.bound() << " (" << tolerance.same_precision_factor
       << " x same-precision error + " << rule << " + 4 float32 ulps"
       << (tolerance.stored_output_term > 0 ? " + 2 x what storing the output moves dsinks)" : ")");
  return text.str();
}

std::string tensor_json(const ComparisonReport& report, const Tolerance& tolerance) {
  std::string text = report.to_json();
  text.pop_back();  // the closing brace: the tolerance's terms follow
  std::ostringstream terms;
  terms << ", \"same_precision_err\": " << json::number(tolerance.same_precision_err)
        << ", \"same_precision_factor\": " << json::number(tolerance.same_precision_factor)
        << ", \"rounding_atol\": " << json::number(tolerance.rounding_atol)
        << ", \"float32_floor\": " << json::number(tolerance.float32_floor)
        << ", \"stored_output_term\": " << json::number(tolerance.stored_output_term) << "}";
  return text + terms.str();
}

}  // namespace

uint64_t dout_seed(uint64_t seed) {
  // Q, K and V are one MT19937 stream from `seed`; dout is another stream.
  return seed ^ 0x5DEECE66DULL;
}

at::Tensor make_dout(const ProblemSpec& spec, const ProblemInputs& inputs) {
  return mt19937_normal(inputs.q.sizes(), dout_seed(spec.seed), inputs.q.device()).to(spec.dtype);
}

BackwardOptions backward_options(const ProblemSpec& spec, bool deterministic) {
  BackwardOptions options;
  static_cast<AttentionOptions&>(options) = spec.attention_options();
  options.deterministic = deterministic;
  return options;
}

BackwardOptions backward_options(const ProblemSpec& spec, const ProblemInputs& inputs, bool deterministic) {
  BackwardOptions options;
  static_cast<AttentionOptions&>(options) = attention_options(spec, inputs);
  options.deterministic = deterministic;
  return options;
}

AttentionBackwardParams backward_params(const ProblemSpec& spec, const ProblemInputs& inputs,
                                        const ForwardOutputs& outputs, const at::Tensor& dout,
                                        const Gradients& gradients, bool deterministic) {
  const ForwardOutputs forward = shaped_outputs(spec, inputs, outputs);
  const at::Tensor upstream = dout.defined() ? dout : at::empty_like(forward.out);
  const BackwardOptions options = backward_options(spec, inputs, deterministic);
  AttentionBackwardParams params =
      spec.is_varlen()
          ? make_varlen_backward_params(upstream, inputs.q, inputs.k, inputs.v, forward.out,
                                        forward.lse, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                                        inputs.max_seqlen_q, inputs.max_seqlen_k, gradients.dq,
                                        gradients.dk, gradients.dv, options)
          : make_backward_params(upstream, inputs.q, inputs.k, inputs.v, forward.out, forward.lse,
                                 gradients.dq, gradients.dk, gradients.dv, options);
  params.deterministic = deterministic;
  if (gradients.dsinks.defined()) params.dsinks = gradients.dsinks.data_ptr<float>();
  return params;
}

std::string backward_unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                                        int compute_capability) {
  // The check runs the kernel's own forward first.
  std::string reason = unsupported_reason(kernel, spec, compute_capability);
  if (!reason.empty()) return reason;
  return with_host_shape_params(
      spec,
      [](const ProblemSpec& shape_only, const ProblemInputs& inputs) { return backward_params(shape_only, inputs); },
      [&](AttentionBackwardParams& params) {
        params.device_compute_capability = compute_capability;
        // The op library's own words: no backward ("<kernel> has no backward pass (kernels with
        // one: ...)"), the problem, the device.
        return cannot_run_reason(kernel, params);
      });
}

const KernelVariant& resolve_backward_kernel(const ProblemSpec& spec, const ProblemInputs& inputs) {
  const KernelVariant* kernel = nullptr;
  if (spec.kernel != "auto" && find_kernel(spec.kernel) == nullptr) {
    // Developer kernels by name.
    kernel = find_any_kernel(spec.kernel);
    TORCH_CHECK(kernel != nullptr, "unknown kernel '", spec.kernel,
                "'; registered: ", registered_kernel_names());
  } else {
    kernel = &select_backward_kernel(backward_params(spec, inputs), spec.kernel);
  }
  const int compute_capability = forward_params(spec, inputs).device_compute_capability;
  const std::string reason = backward_unsupported_reason(*kernel, spec, compute_capability);
  TORCH_CHECK(reason.empty(), "kernel ", kernel->name, " cannot run the forward and backward of ",
              spec.describe(), ": ", reason);
  return *kernel;
}

Gradients poisoned_gradients(const ProblemSpec& spec, const ProblemInputs& inputs) {
  const at::TensorOptions options = inputs.q.options();
  const at::Tensor dsinks = spec.sinks ? poisoned({spec.heads}, options.dtype(at::kFloat)) : at::Tensor();
  if (spec.layout != Layout::packed_qkv)
    return {poisoned(inputs.q.sizes(), options), poisoned(inputs.k.sizes(), options),
            poisoned(inputs.v.sizes(), options), dsinks};
  // (..., H + 2*HKV, D), split along the head axis like the inputs.
  std::vector<int64_t> packed_shape = inputs.q.sizes().vec();
  const int64_t head_axis = inputs.q.dim() - 2;
  packed_shape[head_axis] = spec.heads + 2 * spec.kv_heads;
  const at::Tensor packed = poisoned(packed_shape, options);
  return {packed.narrow(head_axis, 0, spec.heads),
          packed.narrow(head_axis, spec.heads, spec.kv_heads),
          packed.narrow(head_axis, spec.heads + spec.kv_heads, spec.kv_heads), dsinks};
}

void run_backward(const KernelVariant& kernel, const ProblemSpec& spec, const ProblemInputs& inputs,
                  const ForwardOutputs& outputs, const at::Tensor& dout, const Gradients& gradients,
                  bool deterministic) {
  run_backward_kernel(kernel,
                      backward_params(spec, inputs, outputs, dout, gradients, deterministic));
}

BackwardReference reference_backward(const ProblemSpec& spec, const ProblemInputs& inputs,
                                     const at::Tensor& dout, const AttentionParams& params) {
  ReferenceOptions options;
  options.softmax_scale = params.softmax_scale;
  options.window_left = params.window_left;
  options.window_right = params.window_right;
  options.modification = reference_modification(spec, inputs);
  const auto run = [&] {
    return spec.is_varlen()
               ? reference_attention_varlen_backward(inputs.q, inputs.k, inputs.v, dout,
                                                     inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                                                     options)
               : reference_attention_backward(inputs.q, inputs.k, inputs.v, dout, options);
  };
  BackwardReference reference;
  options.compute_dtype =
      (spec.float64_reference || spec.dtype == at::kFloat) ? at::kDouble : at::kFloat;
  options.stored_output_dtype = spec.output_dtype();  // dsinks' stored-output term
  reference.reference = run();
  options.compute_dtype = spec.dtype;
  options.stored_output_dtype.reset();
  reference.same_precision = run();
  return reference;
}

BackwardTolerance backward_tolerance(const ProblemSpec& spec, const BackwardReference& reference) {
  // flash-attn's tests hold gradients to 3x torch's same-precision error plus
  // the forward's atol term, taken of each gradient.
  const auto rule = [&](const at::Tensor& exact, const at::Tensor& same) {
    return tolerance_rule(exact, same, fwd_atol(exact, spec.dtype), /*same_precision_factor=*/3);
  };
  const ReferenceGradients& exact = reference.reference;
  const ReferenceGradients& same = reference.same_precision;
  BackwardTolerance tolerance{rule(exact.dq, same.dq), rule(exact.dk, same.dk), rule(exact.dv, same.dv)};
  if (exact.dsinks.defined()) {
    tolerance.dsinks = rule(exact.dsinks, same.dsinks);
    // The kernels form D from the stored output, a rounding torch's autograd
    // never makes: alone it put fa1_scalar (float32 P.V, exact tanhf) past the
    // rule above on 2 of 20 fp16 softcap/ALiBi/window problems (session 45).
    // Twice its effect, as flash-attn's atol is twice the storage rounding.
    if (exact.dsinks_stored_output_shift.defined())
      tolerance.dsinks.stored_output_term = 2 * exact.dsinks_stored_output_shift.abs().max().item<double>();
  }
  return tolerance;
}

TileShape backward_tile_shape(const KernelVariant& kernel, const AttentionBackwardParams& params) {
  return kernel.backward_tile_shape != nullptr ? kernel.backward_tile_shape(params)
                                               : kernel.tile_shape(params);
}

TileContext key_tile_context(const ProblemSpec& spec, const AttentionParams& params,
                             const TileShape& tiles) {
  TileContext context = tile_context(spec, params, tiles);
  context.rows_are_keys = true;
  return context;
}

GradientComparison compare_backward(const ProblemSpec& spec, const AttentionParams& params,
                                    const TileShape& tiles, const Gradients& gradients,
                                    const BackwardReference& reference,
                                    const BackwardTolerance& tolerance) {
  const TileContext queries = tile_context(spec, params, tiles);
  const TileContext keys = key_tile_context(spec, params, tiles);
  const ReferenceGradients& exact = reference.reference;
  GradientComparison comparison{compare_rows("dq", gradients.dq, exact.dq, tolerance.dq.bound(), queries),
                                compare_rows("dk", gradients.dk, exact.dk, tolerance.dk.bound(), keys),
                                compare_rows("dv", gradients.dv, exact.dv, tolerance.dv.bound(), keys)};
  if (exact.dsinks.defined() && gradients.dsinks.defined()) {
    // One value a head, as (batch 1, row 1, heads, col 1): the report names the head.
    const auto as_rows = [](const at::Tensor& t) { return t.reshape({1, 1, t.size(0), 1}); };
    comparison.dsinks = compare_elementwise("dsinks", as_rows(gradients.dsinks), as_rows(exact.dsinks),
                                            tolerance.dsinks.bound());
  }
  return comparison;
}

std::vector<GradientElement> gradient_elements(const ProblemSpec& spec, const std::vector<int>& at,
                                               const Gradients& gradients, const Gradients& exact) {
  TORCH_CHECK(at.size() == 4, "show_element expects batch, head, row, col; got ", at.size(), " numbers");
  const int batch = at[0], head = at[1], row = at[2], col = at[3];
  const int sequences = spec.is_varlen() ? static_cast<int>(spec.seqlens_q.size()) : spec.batch;
  TORCH_CHECK(batch >= 0 && batch < sequences && head >= 0 && head < spec.heads && col >= 0 &&
                  col < spec.head_dim && row >= 0,
              "show_element ", batch, ",", head, ",", row, ",", col, " is outside the problem (", sequences,
              " sequences, ", spec.heads, " heads, head_dim ", spec.head_dim, ")");
  const int kv_head = head / (spec.heads / spec.kv_heads);
  // (sequence row, tensor index) of a row of sequence `batch`: packed rows for varlen.
  const auto element = [&](const at::Tensor& tensor, const std::vector<int>& lengths, int h) {
    if (!spec.is_varlen()) return tensor.select(0, batch).select(0, row).select(0, h).select(0, col);
    int64_t first = 0;
    for (int b = 0; b < batch; ++b) first += lengths[b];
    return tensor.select(0, first + row).select(0, h).select(0, col);
  };
  std::vector<GradientElement> shown;
  const auto add = [&](const char* name, const at::Tensor& kernel, const at::Tensor& reference, int h,
                       const std::vector<int>& lengths, int length) {
    if (row >= length) return;
    GradientElement value;
    value.name = std::string(name) + "[" + std::to_string(batch) + "," + std::to_string(row) + "," +
                 std::to_string(h) + "," + std::to_string(col) + "]";
    value.kernel = element(kernel, lengths, h).item<double>();
    value.reference = element(reference, lengths, h).item<double>();
    shown.push_back(value);
  };
  const int seqlen_q = spec.is_varlen() ? spec.seqlens_q[batch] : spec.seqlen_q;
  const int seqlen_k = spec.is_varlen() ? spec.key_seqlens()[batch] : spec.seqlen_k;
  add("dk", gradients.dk, exact.dk, kv_head, spec.key_seqlens(), seqlen_k);
  add("dv", gradients.dv, exact.dv, kv_head, spec.key_seqlens(), seqlen_k);
  add("dq", gradients.dq, exact.dq, head, spec.seqlens_q, seqlen_q);
  return shown;
}

BackwardCheckResult backward_check_result(const std::string& name, const TileShape& tiles,
                                          const TileShape& backward_tiles, const ProblemSpec& spec,
                                          const ProblemInputs& inputs, const ForwardOutputs& outputs,
                                          const at::Tensor& dout, const Gradients& gradients,
                                          const ForwardReference& forward_reference,
                                          const BackwardReference& backward_reference,
                                          const std::vector<int>& show_element) {
  const AttentionParams params = forward_params(spec, inputs);
  BackwardCheckResult result;
  result.kernel = name;
  result.problem = spec.describe();
  result.dout_seed = dout_seed(spec.seed);
  result.tiles = tiles;
  result.backward_tiles = backward_tiles;
  result.backward_tiles_known = true;
  result.forward_tolerance = forward_tolerance(spec, forward_reference);
  result.backward_tolerance = backward_tolerance(spec, backward_reference);
  const CheckResult forward = forward_check_result(name, tiles, spec, inputs, outputs, forward_reference);
  result.out = forward.out;
  result.lse = forward.lse;
  result.lse_checked = forward.lse_checked;
  GradientComparison gradient_reports =
      compare_backward(spec, params, backward_tiles, gradients, backward_reference, result.backward_tolerance);
  result.dq = std::move(gradient_reports.dq);
  result.dk = std::move(gradient_reports.dk);
  result.dv = std::move(gradient_reports.dv);
  result.dsinks = std::move(gradient_reports.dsinks);
  const ReferenceGradients& exact = backward_reference.reference;
  if (!show_element.empty())
    result.shown = gradient_elements(spec, show_element, gradients, {exact.dq, exact.dk, exact.dv});
  // NaN/inf in a gradient: where the first one is and whether its row's inputs were finite.
  bool nonfinite_gradient = result.dsinks && result.dsinks->nan_count + result.dsinks->inf_count > 0;
  for (const ComparisonReport* report : {&result.dq, &result.dk, &result.dv})
    nonfinite_gradient |= report->nan_count + report->inf_count > 0;
  if (nonfinite_gradient) {
    if (!result.out.nonfinite && !result.lse.nonfinite)  // forward_check_result explains its own
      explain_forward_nonfinite(result.out, result.lse, outputs, forward_reference,
                                origin_inputs(spec, inputs, params));
    const OriginInputs origin = origin_inputs(spec, inputs, params, dout);
    explain_nonfinite(result.dq, gradients.dq, exact.dq, origin, RowKind::query);
    explain_nonfinite(result.dk, gradients.dk, exact.dk, origin, RowKind::key);
    explain_nonfinite(result.dv, gradients.dv, exact.dv, origin, RowKind::key);
  }
  return result;
}

namespace {

// check_backward's steps (check_pipeline.h): the kernel's own forward, then
// its backward given that forward's out and lse.
struct BackwardCheck {
  using Spec = ProblemSpec;
  using Options = BackwardCheckOptions;
  using Inputs = ProblemInputs;
  struct Run {
    ForwardOutputs outputs;
    at::Tensor dout;
    Gradients gradients;
  };
  struct Reference {
    ForwardReference forward;
    BackwardReference backward;
  };
  using Result = BackwardCheckResult;
  static constexpr const char* kCheck = "check_backward";

  static Inputs inputs(const Spec& spec, at::Device device) { return make_inputs(spec, device); }
  static const KernelVariant& kernel(const Spec& spec, const Inputs& inputs) {
    return resolve_backward_kernel(spec, inputs);
  }
  static Run run(const KernelVariant& kernel, const Spec& spec, const Inputs& inputs, const Options& options) {
    Run run{poisoned_forward_outputs(spec, inputs), {}, {}};
    run_forward(kernel, spec, inputs, run.outputs);
    run.dout = make_dout(spec, inputs);
    run.gradients = poisoned_gradients(spec, inputs);
    run_backward(kernel, spec, inputs, run.outputs, run.dout, run.gradients, options.deterministic);
    return run;
  }
  static Reference reference(const Spec& spec, const Inputs& inputs, const Run& run) {
    const AttentionParams params = forward_params(spec, inputs);
    return {reference_forward(spec, inputs, params), reference_backward(spec, inputs, run.dout, params)};
  }
  static Result compare(const KernelVariant& kernel, const Spec& spec, const Inputs& inputs, const Run& run,
                        const Reference& reference, const Options& options) {
    const AttentionBackwardParams backward =
        backward_params(spec, inputs, run.outputs, run.dout, run.gradients, options.deterministic);
    BackwardCheckResult result = backward_check_result(
        kernel.name, kernel.tile_shape(forward_params(spec, inputs)), backward_tile_shape(kernel, backward), spec,
        inputs, run.outputs, run.dout, run.gradients, reference.forward, reference.backward, options.show_element);
    result.registered_kernel = true;
    result.deterministic = options.deterministic;
    result.backward_tiles_known = kernel.backward_tile_shape != nullptr;
    if (kernel.backward_workspace_bytes != nullptr)
      result.workspace_bytes = static_cast<int64_t>(kernel.backward_workspace_bytes(backward));
    return result;
  }
  static void time(Result& result, const KernelVariant& kernel, const Spec& spec, const Inputs& inputs,
                   const Run& run, const Options& options) {
    EventTimer timer;
    result.forward_ms =
        timer.median_ms([&] { run_forward(kernel, spec, inputs, run.outputs); }, options.timed_launches);
    result.backward_ms = timer.median_ms(
        [&] { run_backward(kernel, spec, inputs, run.outputs, run.dout, run.gradients, options.deterministic); },
        options.timed_launches);
  }
  static void extras(Result&, const KernelVariant&, const Spec&, const Inputs&, const Run&, const Options&) {}
};

}  // namespace

BackwardCheckResult check_backward(const ProblemSpec& spec, const BackwardCheckOptions& options) {
  return harness_detail::run_check<BackwardCheck>(spec, options);
}

std::string BackwardCheckResult::format() const {
  std::ostringstream text;
  text << std::setprecision(4);
  if (registered_kernel)
    text << "kernel  " << kernel << " (forward tiles " << tiles.block_q << "x" << tiles.block_k
         << ", backward tiles " << backward_tiles.block_q << "x" << backward_tiles.block_k
         << (backward_tiles_known ? "" : ": the forward's, the kernel has no backward_tile_shape")
         << "), backward " << (deterministic ? "deterministic" : "default mode") << ", workspace "
         << workspace_bytes << " bytes\n";
  else
    text << "kernel  " << kernel << " (tiles " << tiles.block_q << "x" << tiles.block_k << ")\n";
  text << "problem " << problem << "\n"
       << "dout    normal(0, 1), MT19937 seed " << dout_seed << "\n"
       << "out: " << tolerance_text(forward_tolerance.out, "flash-attn's fwd_atol") << "\n"
       << out.format() << (lse_checked ? lse.format() : "lse: not returned, not compared\n");
  const std::pair<const ComparisonReport*, const Tolerance*> gradients[] = {
      {&dq, &backward_tolerance.dq}, {&dk, &backward_tolerance.dk}, {&dv, &backward_tolerance.dv}};
  for (const auto& [report, tolerance] : gradients)
    text << report->name << ": " << tolerance_text(*tolerance, "the forward's atol of this gradient")
         << "\n"
         << report->format();
  if (dsinks)
    text << "dsinks: " << tolerance_text(backward_tolerance.dsinks, "the forward's atol of this gradient") << "\n"
         << dsinks->format();
  for (const GradientElement& element : shown)
    text << std::setprecision(9) << "element " << element.name << ": kernel " << element.kernel << ", reference "
         << element.reference << "\n"
         << std::setprecision(4);
  if (forward_ms >= 0) text << "forward time " << forward_ms << " ms, backward time " << backward_ms << " ms (medians)\n";
  text << (passed() ? "PASSED" : "FAILED") << "\n";
  return text.str();
}

std::string BackwardCheckResult::to_json() const {
  std::ostringstream text;
  const auto time = [](double ms) { return ms >= 0 ? json::number(ms) : std::string("null"); };
  // What only a registered kernel has (a Python function's report writes null).
  const auto known = [&](int64_t value) { return registered_kernel ? std::to_string(value) : std::string("null"); };
  text << "{\"passed\": " << json::boolean(passed()) << ", \"kernel\": " << json::string(kernel)
       << ", \"problem\": " << json::string(problem) << ", \"dout_seed\": " << dout_seed
       << ", \"deterministic\": " << (registered_kernel ? json::boolean(deterministic) : std::string("null"))
       << ", \"block_q\": " << tiles.block_q << ", \"block_k\": " << tiles.block_k << ", \"backward_block_q\": "
       << known(backward_tiles.block_q) << ", \"backward_block_k\": " << known(backward_tiles.block_k)
       << ", \"workspace_bytes\": " << known(workspace_bytes) << ", \"forward_ms\": " << time(forward_ms) << ", \"backward_ms\": "
       << time(backward_ms) << ", \"tensors\": {\"out\": "
       << tensor_json(out, forward_tolerance.out) << ", \"lse\": "
       << (lse_checked ? tensor_json(lse, forward_tolerance.lse) : "null") << ", \"dq\": "
       << tensor_json(dq, backward_tolerance.dq) << ", \"dk\": "
       << tensor_json(dk, backward_tolerance.dk) << ", \"dv\": "
       << tensor_json(dv, backward_tolerance.dv);
  if (dsinks) text << ", \"dsinks\": " << tensor_json(*dsinks, backward_tolerance.dsinks);
  text << "}}";
  return text.str();
}

}  // namespace flashlab
