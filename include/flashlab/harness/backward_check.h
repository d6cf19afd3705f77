// The backward check: one seeded problem through a kernel's forward and then
// its backward, every tensor (out, lse, dq, dk, dv) compared element by
// element with the reference. Composed of the forward check's named steps
// (problem.h: make_inputs, poisoned, reference_forward, tolerance_rule,
// compare_rows) plus the backward's own run and reference steps:
//
//   inputs    make_inputs(spec, device), make_dout(spec, inputs)
//   kernel    resolve_backward_kernel(spec, inputs)
//   forward   poisoned_forward_outputs, run_forward (the kernel's own forward)
//   poison    poisoned_gradients(spec, inputs)
//   run       run_backward(kernel, spec, inputs, outputs, dout, gradients, deterministic)
//   reference reference_forward, reference_backward(spec, inputs, dout, params)
//   tolerance forward_tolerance, backward_tolerance(spec, reference)
//   compare   compare_forward, compare_backward(spec, params, tiles, gradients, reference, tolerance)
//
// The pass rule for gradients is flash-attn's: at most 3 times the error of
// torch's same-precision math gradients against the float32 (float64 for fp32
// inputs) autograd reference, plus the forward's rounding atol (fwd_atol of the
// reference gradient in the input dtype), plus 4 float32 ulps of its largest value.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/compare.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/reference.h"

namespace flashlab {

// The upstream gradient dL/dout: normal(0, 1) like q (contiguous, input dtype),
// from MT19937 seeded by dout_seed(spec.seed), a stream apart from Q, K, V's.
uint64_t dout_seed(uint64_t seed);
at::Tensor make_dout(const ProblemSpec& spec, const ProblemInputs& inputs);

BackwardOptions backward_options(const ProblemSpec& spec, bool deterministic = false);
// With the inputs' score modifications (any spec).
BackwardOptions backward_options(const ProblemSpec& spec, const ProblemInputs& inputs, bool deterministic);

struct Gradients {
  at::Tensor dq, dk, dv;  // shapes of q, k, v
  at::Tensor dsinks;      // float32 (heads), with sinks
};

// The backward parameter block for these tensors (no launch). outputs, dout
// and gradients may be undefined: then tensors of the right shapes and no
// values stand in (enough to ask a kernel whether it takes the problem).
AttentionBackwardParams backward_params(const ProblemSpec& spec, const ProblemInputs& inputs,
                                        const ForwardOutputs& outputs = {},
                                        const at::Tensor& dout = at::Tensor(),
                                        const Gradients& gradients = {},
                                        bool deterministic = false);

// Empty when `kernel` can run the spec's forward and backward on a device of
// this compute capability (0: any), else the reason: its forward's
// (cannot_run_reason), then the backward's (cannot_run_reason of the backward
// parameter block: "<kernel> has no backward pass (kernels with one: ...)", its
// backward_unsupported_reason, the device). Touches no device.
std::string backward_unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                                        int compute_capability = 0);

// The kernel whose forward and backward run the spec: spec.kernel (a
// registered or developer kernel), or for "auto" select_backward_kernel's
// choice. Throws c10::Error with the reason when there is none.
const KernelVariant& resolve_backward_kernel(const ProblemSpec& spec, const ProblemInputs& inputs);

// NaN-filled gradients (a gradient element never written fails; dsinks too,
// with sinks). bshd: three
// contiguous tensors. packed-qkv: dq, dk, dv are views of one (..., H + 2*HKV, D)
// tensor, like the inputs (flash_attn_qkvpacked_func's dqkv), so their row
// strides are the packed ones.
Gradients poisoned_gradients(const ProblemSpec& spec, const ProblemInputs& inputs);

// Enqueues `kernel`'s backward on the current stream (run_backward_kernel),
// given the forward's outputs; writes `gradients`. Does not synchronize.
void run_backward(const KernelVariant& kernel, const ProblemSpec& spec, const ProblemInputs& inputs,
                  const ForwardOutputs& outputs, const at::Tensor& dout, const Gradients& gradients,
                  bool deterministic = false);

struct BackwardReference {
  ReferenceGradients reference;       // float32, or float64 for fp32 inputs / float64_reference
  ReferenceGradients same_precision;  // the same autograd in the input dtype (torch's math path)
};
// Softmax scale and window as the kernel sees them (from `params`).
BackwardReference reference_backward(const ProblemSpec& spec, const ProblemInputs& inputs,
                                     const at::Tensor& dout, const AttentionParams& params);

struct BackwardTolerance {
  Tolerance dq, dk, dv;  // same_precision_factor 3, rounding atol fwd_atol(gradient, dtype)
  Tolerance dsinks;      // with sinks: the same rule, of dsinks
};
BackwardTolerance backward_tolerance(const ProblemSpec& spec, const BackwardReference& reference);

// The tiles dq/dk/dv reports name: kernel.backward_tile_shape(params) when
// the kernel has one, else its forward tile_shape.
TileShape backward_tile_shape(const KernelVariant& kernel, const AttentionBackwardParams& params);

// tile_context with rows_are_keys: the rows of dk and dv are keys.
TileContext key_tile_context(const ProblemSpec& spec, const AttentionParams& params,
                             const TileShape& tiles);

struct GradientComparison {
  ComparisonReport dq, dk, dv;
  std::optional<ComparisonReport> dsinks;  // with sinks: the (heads) gradient, as (1, 1, heads, 1)
};
GradientComparison compare_backward(const ProblemSpec& spec, const AttentionParams& params,
                                    const TileShape& tiles, const Gradients& gradients,
                                    const BackwardReference& reference,
                                    const BackwardTolerance& tolerance);

struct BackwardCheckOptions {
  bool deterministic = false;  // BackwardOptions::deterministic
  int timed_launches = 0;      // > 0: also time forward and backward (median of this many)
  // batch, head, row, col: report the kernel's and the reference's dk, dv of
  // key row `row` (kv head head / group) and dq of query row `row` there (rows
  // count within sequence `batch`; what cuda-gdb should show at --locate's stops).
  std::vector<int> show_element;
};

// One gradient element as the kernel wrote it and as the reference has it.
struct GradientElement {
  std::string name;  // "dk[b,row,kv_head,col]"
  double kernel = 0, reference = 0;
};
// show_element's elements: dk and dv of key row `row` (kv head head / group),
// dq of query row `row`, each where that row exists in sequence `batch`.
std::vector<GradientElement> gradient_elements(const ProblemSpec& spec, const std::vector<int>& at,
                                               const Gradients& kernel, const Gradients& reference);

struct BackwardCheckResult {
  std::string kernel;  // the kernel that ran both passes (resolves "auto")
  std::string problem;
  uint64_t dout_seed = 0;
  bool deterministic = false;
  TileShape tiles;           // the forward's (tile_shape): named in the out and lse reports
  TileShape backward_tiles;  // backward_tile_shape, or the forward's: named for dq, dk, dv
  bool backward_tiles_known = false;  // the kernel has a backward_tile_shape
  int64_t workspace_bytes = 0;  // the backward's workspace query
  // check_backward ran a registered kernel's passes itself; false for outputs
  // handed to backward_check_result (flashlab.testing: a Python function, or a
  // kernel run through flash_attn_func), whose backward tiles, mode and workspace it does not know.
  bool registered_kernel = false;
  ComparisonReport out, lse, dq, dk, dv;
  std::optional<ComparisonReport> dsinks;  // with sinks
  ForwardTolerance forward_tolerance;
  BackwardTolerance backward_tolerance;
  double forward_ms = -1, backward_ms = -1;  // medians over the timed launches, when timed
  std::vector<GradientElement> shown;        // BackwardCheckOptions::show_element

  bool lse_checked = true;  // false: the code checked returned no LSE (backward_check_result)

  bool passed() const {
    return out.passed() && (!lse_checked || lse.passed()) && dq.passed() && dk.passed() && dv.passed() &&
           (!dsinks || dsinks->passed());
  }
  std::string format() const;
  // {"passed", "kernel", "problem", "deterministic", ..., "tensors": {"out": {...},
  // "lse", "dq", "dk", "dv"}}: each tensor as ComparisonReport::to_json plus its
  // tolerance's terms.
  std::string to_json() const;
};

BackwardCheckResult check_backward(const ProblemSpec& spec, const BackwardCheckOptions& options = {});

// check_backward's compare step for outputs and gradients from any code
// (flashlab.testing checks a user's Python function with it): the report names
// `name`, the forward's `tiles` and the backward's `backward_tiles`; dout is
// make_dout's. outputs.lse undefined: no LSE is compared (lse_checked false).
BackwardCheckResult backward_check_result(const std::string& name, const TileShape& tiles,
                                          const TileShape& backward_tiles, const ProblemSpec& spec,
                                          const ProblemInputs& inputs, const ForwardOutputs& outputs,
                                          const at::Tensor& dout, const Gradients& gradients,
                                          const ForwardReference& forward_reference,
                                          const BackwardReference& backward_reference,
                                          const std::vector<int>& show_element = {});

}  // namespace flashlab
