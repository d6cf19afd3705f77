// flashlab.testing's operators: the C++ harness (flashlab/harness/) for code
// written anywhere, Python included. A problem is named by flashlab-run's own
// problem options (problem_options.h), so the same words give the same seeded
// inputs here and in flashlab-run, and the checks are the harness's compare
// steps (forward_check_result, backward_check_result): the same reference,
// pass rule and report.
//
//   testing_problem        the problem's tensors (q, k, v, ...) and a JSON
//                          description of it (the options resolved)
//   testing_dout           its upstream gradient (a stream of its own: drawn
//                          only for backward checks)
//   testing_check          a forward's out (and lse) against the reference:
//                          (report text, report JSON)
//   testing_check_backward the same with dq, dk, dv (and dsinks)
//   testing_run_kernel     a registered or developer kernel (planted bugs
//                          included) on the problem, through the harness's run
//                          steps: out, lse (and dq, dk, dv, dsinks)
//   testing_trace_buffers  tile-state buffers (running max m, running sum l per
//                          (row, key tile)) for a kernel to record into
//   testing_trace_report   the recorded states against float64 online softmax:
//                          the first (key tile, row, statistic) that departs
//   testing_flops          the FLOPs flashlab-bench counts for the problem
//
// The checks take the problem's tensors back (testing_problem's list) rather
// than drawing them again: cuRAND's host MT19937 takes seconds to seed, so on
// the CPU every draw counts. flashlab.testing hands users' functions copies.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <iomanip>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/arguments.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/flops.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/problem_options.h"
#include "flashlab/harness/tile_trace.h"

namespace flashlab::python {
namespace {

using Report = std::tuple<std::string, std::string>;  // (text, JSON)

ProblemSpec problem_of(const std::vector<std::string>& arguments) {
  ProblemSpec spec;
  try {
    spec = parse_problem(arguments, "flashlab.testing", /*require_seed=*/true);
  } catch (const ArgumentError& error) {
    C10_THROW_ERROR(ValueError, std::string("flashlab.testing: ") + error.what());
  }
  // Its problems hand q, k, v alone to the function checked; an e4m3 problem needs its descales too.
  TORCH_CHECK_VALUE(!spec.is_fp8(), "flashlab.testing: --dtype e4m3 is not supported here (the function checked "
                                    "would get e4m3 values without their descales); check the FP8 forward with "
                                    "flashlab-run --dtype e4m3 or tests/python/test_fp8_gpu.py");
  return spec;
}

// Absent tensors travel as empty ones (a Tensor[] holds no None).
at::Tensor or_empty(const at::Tensor& tensor) { return tensor.defined() ? tensor : at::empty({0}); }

std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string list_json(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

// The problem as resolved: what the options left to defaults, the softmax
// scale and window as the kernels see them, the sequences' lengths.
std::string describe_json(const ProblemSpec& spec, const ProblemInputs& inputs) {
  const AttentionParams params = forward_params(spec, inputs);
  std::ostringstream text;
  text << std::setprecision(17) << "{\"describe\": " << quoted(spec.describe()) << ", \"seed\": " << spec.seed
       << ", \"dout_seed\": " << dout_seed(spec.seed) << ", \"batch\": " << spec.batch
       << ", \"heads\": " << spec.heads << ", \"kv_heads\": " << spec.kv_heads
       << ", \"seqlen_q\": " << spec.seqlen_q << ", \"seqlen_k\": " << spec.seqlen_k
       << ", \"head_dim\": " << spec.head_dim << ", \"dtype\": \"" << dtype_argument(spec.dtype) << "\""
       << ", \"causal\": " << (spec.causal ? "true" : "false") << ", \"window_left\": " << spec.window_left
       << ", \"window_right\": " << spec.window_right << ", \"softmax_scale\": " << params.softmax_scale
       << ", \"layout\": \"" << (spec.layout == Layout::bshd ? "bshd" : "packed-qkv") << "\""
       << ", \"varlen\": " << (spec.is_varlen() ? "true" : "false")
       << ", \"seqlens_q\": " << list_json(spec.seqlens_q) << ", \"seqlens_k\": " << list_json(spec.key_seqlens())
       << ", \"max_seqlen_q\": " << inputs.max_seqlen_q << ", \"max_seqlen_k\": " << inputs.max_seqlen_k
       << ", \"softcap\": " << spec.softcap << ", \"alibi\": \""
       << (spec.alibi == ProblemSpec::Alibi::none       ? "none"
           : spec.alibi == ProblemSpec::Alibi::per_head ? "per-head"
                                                         : "per-batch")
       << "\", \"sinks\": " << (spec.sinks ? "true" : "false") << "}";
  return text.str();
}

// [q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks], absent ones empty.
std::vector<at::Tensor> tensor_list(const ProblemInputs& inputs) {
  return {inputs.q, inputs.k, inputs.v, or_empty(inputs.cu_seqlens_q), or_empty(inputs.cu_seqlens_k),
          or_empty(inputs.alibi_slopes), or_empty(inputs.sinks)};
}

// For an OptionalCUDAGuard: the device when it is a GPU.
std::optional<c10::Device> cuda_device(const c10::Device& device) {
  return device.is_cuda() ? std::optional<c10::Device>(device) : std::nullopt;
}

std::tuple<std::vector<at::Tensor>, std::string> testing_problem(std::vector<std::string> arguments,
                                                                 c10::Device device) {
  const ProblemSpec spec = problem_of(arguments);
  const c10::cuda::OptionalCUDAGuard guard(cuda_device(device));
  const ProblemInputs inputs = make_inputs(spec, device);
  return {tensor_list(inputs), describe_json(spec, inputs)};
}

// The problem's tensors back from testing_problem's list, checked against the spec.
ProblemInputs inputs_of(const ProblemSpec& spec, const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK_VALUE(tensors.size() == 7, "flashlab.testing: expected the problem's 7 tensors, got ", tensors.size());
  const ProblemInputs shapes = make_inputs(spec, at::kCPU, /*random=*/false);
  ProblemInputs inputs;
  inputs.q = tensors[0], inputs.k = tensors[1], inputs.v = tensors[2];
  for (const auto& [name, actual, expected] : {std::tuple{"q", inputs.q, shapes.q}, std::tuple{"k", inputs.k, shapes.k},
                                               std::tuple{"v", inputs.v, shapes.v}})
    TORCH_CHECK_VALUE(actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type(),
                      "flashlab.testing: the problem's ", name, " is ", actual.sizes(), " ", actual.scalar_type(),
                      "; its options (", spec.describe(), ") make ", expected.sizes(), " ", expected.scalar_type());
  // What the spec has must be there, shaped as make_inputs makes it (a missing one
  // would give an unmodified reference, or a wrong one).
  const auto take = [&](const char* name, const at::Tensor& given, const at::Tensor& expected) {
    TORCH_CHECK_VALUE(given.sizes() == expected.sizes() && given.scalar_type() == expected.scalar_type() &&
                          given.device() == inputs.q.device(),
                      "flashlab.testing: the problem's ", name, " is ", given.sizes(), " ", given.scalar_type(), " on ",
                      given.device(), "; its options make ", expected.sizes(), " ", expected.scalar_type(), " on ",
                      inputs.q.device());
    return given;
  };
  if (spec.is_varlen()) {
    inputs.cu_seqlens_q = take("cu_seqlens_q", tensors[3], shapes.cu_seqlens_q);
    inputs.cu_seqlens_k = take("cu_seqlens_k", tensors[4], shapes.cu_seqlens_k);
    inputs.max_seqlen_q = shapes.max_seqlen_q, inputs.max_seqlen_k = shapes.max_seqlen_k;
  }
  if (spec.alibi != ProblemSpec::Alibi::none)
    inputs.alibi_slopes = take("alibi_slopes", tensors[5], shapes.alibi_slopes);
  if (spec.sinks) inputs.sinks = take("sinks", tensors[6], shapes.sinks);
  return inputs;
}

at::Tensor testing_dout(std::vector<std::string> arguments, const at::Tensor& q) {
  const ProblemSpec spec = problem_of(arguments);
  const c10::cuda::OptionalCUDAGuard guard(cuda_device(q.device()));
  ProblemInputs inputs;
  inputs.q = q;
  return make_dout(spec, inputs);
}

TileShape tiles_of(int64_t block_q, int64_t block_k) {
  return {static_cast<int>(block_q), static_cast<int>(block_k)};
}

void check_shape(const char* name, const at::Tensor& actual, const at::Tensor& expected) {
  TORCH_CHECK_VALUE(actual.sizes() == expected.sizes(), "flashlab.testing: ", name, " has shape ", actual.sizes(),
                    "; expected ", expected.sizes());
}

ForwardOutputs outputs_of(const ProblemSpec& spec, const ProblemInputs& inputs, const at::Tensor& out,
                          const std::optional<at::Tensor>& lse) {
  check_shape("out", out, inputs.q);
  TORCH_CHECK_VALUE(out.scalar_type() == spec.dtype, "flashlab.testing: out is ", out.scalar_type(),
                    "; the problem's dtype is ", spec.dtype, " (the output has the inputs' dtype)");
  TORCH_CHECK_VALUE(out.device() == inputs.q.device(), "flashlab.testing: out is on ", out.device(),
                    "; the problem's inputs are on ", inputs.q.device());
  ForwardOutputs outputs{out, lse ? lse->to(at::kFloat) : at::Tensor()};
  if (outputs.lse.defined()) {
    const std::vector<int64_t> expected =
        spec.is_varlen() ? std::vector<int64_t>{spec.heads, inputs.q.size(0)}
                         : std::vector<int64_t>{spec.batch, spec.heads, spec.seqlen_q};
    TORCH_CHECK_VALUE(outputs.lse.sizes() == at::IntArrayRef(expected), "flashlab.testing: lse has shape ",
                      outputs.lse.sizes(), "; expected ", at::IntArrayRef(expected),
                      " ((batch, heads, seqlen_q), or (heads, total_q) for varlen; natural log)");
  }
  return outputs;
}

Report testing_check(std::vector<std::string> arguments, std::vector<at::Tensor> problem, const at::Tensor& out,
                     const std::optional<at::Tensor>& lse, std::string name, int64_t block_q, int64_t block_k) {
  const ProblemSpec spec = problem_of(arguments);
  const ProblemInputs inputs = inputs_of(spec, problem);
  const c10::cuda::OptionalCUDAGuard guard(cuda_device(inputs.q.device()));
  const ForwardOutputs outputs = outputs_of(spec, inputs, out, lse);
  const ForwardReference reference = reference_forward(spec, inputs, forward_params(spec, inputs));
  const CheckResult result =
      forward_check_result(name, tiles_of(block_q, block_k), spec, inputs, outputs, reference);
  return {result.format(), result.to_json()};
}

Report testing_check_backward(std::vector<std::string> arguments, std::vector<at::Tensor> problem,
                              const at::Tensor& dout, const at::Tensor& out, const std::optional<at::Tensor>& lse,
                              const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                              const std::optional<at::Tensor>& dsinks, std::string name, int64_t block_q,
                              int64_t block_k) {
  const ProblemSpec spec = problem_of(arguments);
  const ProblemInputs inputs = inputs_of(spec, problem);
  const c10::cuda::OptionalCUDAGuard guard(cuda_device(inputs.q.device()));
  const ForwardOutputs outputs = outputs_of(spec, inputs, out, lse);
  check_shape("dq", dq, inputs.q);
  check_shape("dk", dk, inputs.k);
  check_shape("dv", dv, inputs.v);
  TORCH_CHECK_VALUE(!spec.sinks || dsinks.has_value(),
                    "flashlab.testing: the problem has sinks; the check needs dsinks (heads,)");
  const Gradients gradients{dq, dk, dv, spec.sinks ? dsinks->to(at::kFloat) : at::Tensor()};
  check_shape("dout", dout, inputs.q);
  const AttentionParams params = forward_params(spec, inputs);
  const TileShape tiles = tiles_of(block_q, block_k);
  const BackwardCheckResult result =
      backward_check_result(name, tiles, tiles, spec, inputs, outputs, dout, gradients,
                            reference_forward(spec, inputs, params), reference_backward(spec, inputs, dout, params));
  return {result.format(), result.to_json()};
}

// [out, lse] or, with backward, [out, lse, dq, dk, dv, dsinks (empty without sinks)],
// on the current CUDA device, outputs poisoned with NaN as every check makes them.
std::vector<at::Tensor> testing_run_kernel(std::vector<std::string> arguments, std::string kernel_name,
                                           bool backward, c10::Device device) {
  ProblemSpec spec = problem_of(arguments);
  spec.kernel = kernel_name;
  const std::string unavailable = cuda_unavailable_reason();
  TORCH_CHECK(unavailable.empty(), "flashlab.testing.run_kernel needs a GPU: ", unavailable);
  TORCH_CHECK_VALUE(device.is_cuda(), "flashlab.testing.run_kernel: kernels run on a CUDA device; got ", device);
  const c10::cuda::CUDAGuard guard(device);
  const ProblemInputs inputs = make_inputs(spec, device);
  const KernelVariant& kernel = backward ? resolve_backward_kernel(spec, inputs) : resolve_kernel(spec, inputs);
  const ForwardOutputs outputs = poisoned_forward_outputs(spec, inputs);
  run_forward(kernel, spec, inputs, outputs);
  if (!backward) return {outputs.out, outputs.lse};
  const Gradients gradients = poisoned_gradients(spec, inputs);
  run_backward(kernel, spec, inputs, outputs, make_dout(spec, inputs), gradients);
  return {outputs.out, outputs.lse, gradients.dq, gradients.dk, gradients.dv, or_empty(gradients.dsinks)};
}

std::tuple<at::Tensor, at::Tensor> testing_trace_buffers(std::vector<std::string> arguments, const at::Tensor& q,
                                                          int64_t block_k) {
  const ProblemSpec spec = problem_of(arguments);
  TORCH_CHECK_VALUE(!spec.is_varlen(), "flashlab.testing: tile traces take fixed-length problems, not --seqlens");
  TORCH_CHECK_VALUE(!spec.modified(), "flashlab.testing: tile traces are compared with online softmax of unmodified "
                    "scores; leave out --softcap, --alibi and --sinks");
  TORCH_CHECK_VALUE(block_k > 0, "flashlab.testing: a tile trace needs the kernel's block_n (> 0); got ", block_k);
  const int64_t key_tiles = (spec.seqlen_k + block_k - 1) / block_k;
  const at::Tensor row_max =
      unwritten_trace_states({spec.batch, spec.heads, spec.seqlen_q, key_tiles}, q.options().dtype(at::kFloat));
  return {row_max, unwritten_trace_states(row_max.sizes(), row_max.options())};
}

Report testing_trace_report(std::vector<std::string> arguments, std::vector<at::Tensor> problem,
                            const at::Tensor& row_max, const at::Tensor& row_sum, std::string name, int64_t block_q,
                            int64_t block_k, bool descending) {
  const ProblemSpec spec = problem_of(arguments);
  const ProblemInputs inputs = inputs_of(spec, problem);
  const c10::cuda::OptionalCUDAGuard guard(cuda_device(inputs.q.device()));
  const TileTraceReport report =
      tile_trace_report(name, spec, inputs, tiles_of(block_q, block_k), descending, row_max, row_sum);
  return {report.format(), report.to_json()};
}

double testing_flops(std::vector<std::string> arguments, std::string direction) {
  const ProblemSpec spec = problem_of(arguments);
  try {
    return attention_flops(spec, parse_choice("direction", direction, direction_choices()));
  } catch (const ArgumentError& error) {
    C10_THROW_ERROR(ValueError, std::string("flashlab.testing: ") + error.what());
  }
}

std::vector<std::string> testing_kernels() {
  std::vector<std::string> names;
  for (const auto* list : {&registered_kernels(), &test_only_kernels()})
    for (const KernelVariant& kernel : *list) names.push_back(kernel.name);
  return names;
}

}  // namespace
}  // namespace flashlab::python

TORCH_LIBRARY_FRAGMENT(flashlab, m) {
  using namespace flashlab::python;
  m.def("testing_problem(str[] arguments, Device device) -> (Tensor[], str)", &testing_problem);
  m.def("testing_dout(str[] arguments, Tensor q) -> Tensor", &testing_dout);
  m.def(
      "testing_check(str[] arguments, Tensor[] problem, Tensor out, Tensor? lse, str name, int block_q, "
      "int block_k) -> (str, str)",
      &testing_check);
  m.def(
      "testing_check_backward(str[] arguments, Tensor[] problem, Tensor dout, Tensor out, Tensor? lse, Tensor dq, "
      "Tensor dk, Tensor dv, Tensor? dsinks, str name, int block_q, int block_k) -> (str, str)",
      &testing_check_backward);
  m.def("testing_run_kernel(str[] arguments, str kernel, bool backward, Device device) -> Tensor[]",
        &testing_run_kernel);
  m.def("testing_trace_buffers(str[] arguments, Tensor q, int block_k) -> (Tensor, Tensor)", &testing_trace_buffers);
  m.def(
      "testing_trace_report(str[] arguments, Tensor[] problem, Tensor row_max, Tensor row_sum, str name, "
      "int block_q, int block_k, bool descending) -> (str, str)",
      &testing_trace_report);
  m.def("testing_flops(str[] arguments, str direction) -> float", &testing_flops);
  m.def("testing_kernels() -> str[]", &testing_kernels);
}
