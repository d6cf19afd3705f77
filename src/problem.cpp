#include "flashlab/problem.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

#include "flashlab/cuda_check.h"
#include "flashlab/random_inputs.h"
#include "flashlab/reference.h"

namespace flashlab {
namespace {

double max_finite_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor difference = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  const at::Tensor finite = difference.masked_select(at::isfinite(difference));
  return finite.numel() == 0 ? 0.0 : finite.max().item<double>();
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream text;
  text << std::setprecision(9) << value;
  return text.str();
}

std::string json_string(const std::string& value) {
  std::string quoted = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

}  // namespace

std::string ProblemSpec::describe() const {
  std::ostringstream text;
  text << "batch " << batch << ", heads " << heads << "/" << kv_heads << ", seqlen " << seqlen_q
       << "x" << seqlen_k << ", head_dim " << head_dim << ", " << c10::toString(dtype)
       << (causal ? ", causal" : "");
  if (window_left >= 0 || window_right >= 0)
    text << ", window (" << window_left << ", " << window_right << ")";
  text << ", " << (layout == Layout::bshd ? "bshd" : "packed-qkv") << ", seed " << seed;
  return text.str();
}

AttentionOptions ProblemSpec::attention_options() const {
  AttentionOptions options;
  options.causal = causal;
  options.softmax_scale = softmax_scale;
  options.kernel = kernel;
  options.window_left = window_left;
  options.window_right = window_right;
  return options;
}

ProblemInputs make_inputs(const ProblemSpec& spec, at::Device device, bool random) {
  // One generator draws Q, K and V back to back: creating and seeding an
  // MT19937 generator is the expensive part (seconds for the host generator).
  const int64_t q_count = int64_t(spec.batch) * spec.seqlen_q * spec.heads * spec.head_dim;
  const int64_t kv_count = int64_t(spec.batch) * spec.seqlen_k * spec.kv_heads * spec.head_dim;
  const auto options = at::TensorOptions().dtype(spec.dtype).device(device);
  const at::Tensor pool = random ? mt19937_normal({q_count + 2 * kv_count}, spec.seed, device).to(spec.dtype)
                                 : at::empty({q_count + 2 * kv_count}, options);
  ProblemInputs inputs;
  if (spec.layout == Layout::packed_qkv) {
    TORCH_CHECK(spec.seqlen_q == spec.seqlen_k, "packed-qkv layout needs seqlen_q == seqlen_k; got ",
                spec.seqlen_q, " and ", spec.seqlen_k);
    const at::Tensor packed =
        pool.view({spec.batch, spec.seqlen_q, spec.heads + 2 * spec.kv_heads, spec.head_dim});
    inputs.q = packed.narrow(2, 0, spec.heads);
    inputs.k = packed.narrow(2, spec.heads, spec.kv_heads);
    inputs.v = packed.narrow(2, spec.heads + spec.kv_heads, spec.kv_heads);
    return inputs;
  }
  inputs.q = pool.narrow(0, 0, q_count).view({spec.batch, spec.seqlen_q, spec.heads, spec.head_dim});
  inputs.k = pool.narrow(0, q_count, kv_count).view({spec.batch, spec.seqlen_k, spec.kv_heads, spec.head_dim});
  inputs.v = pool.narrow(0, q_count + kv_count, kv_count)
                 .view({spec.batch, spec.seqlen_k, spec.kv_heads, spec.head_dim});
  return inputs;
}

std::string unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                               int compute_capability) {
  ProblemSpec shape_only = spec;
  shape_only.batch = 1;  // strides and support do not depend on the batch count
  const ProblemInputs inputs = make_inputs(shape_only, at::kCPU, /*random=*/false);
  AttentionParams params =
      make_params(inputs.q, inputs.k, inputs.v, at::Tensor(), at::Tensor(), spec.attention_options());
  params.batch = spec.batch;
  if (compute_capability > 0 && compute_capability < kernel.min_compute_capability)
    return kernel.name + " needs compute capability " + std::to_string(kernel.min_compute_capability);
  return kernel.unsupported_reason(params);
}

std::string cuda_unavailable_reason() {
  if (!at::hasCUDA()) return "this torch build has no CUDA support";
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls start clean
    return std::string("no CUDA device (") + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return "no CUDA device found";
  return {};
}

CheckResult check_kernel(const ProblemSpec& spec, const CheckOptions& check_options) {
  const std::string unavailable = cuda_unavailable_reason();
  TORCH_CHECK(unavailable.empty(), "check_kernel needs a GPU: ", unavailable);
  const at::Device device(at::kCUDA, 0);
  const ProblemInputs inputs = make_inputs(spec, device);
  const AttentionOptions options = spec.attention_options();
  const KernelVariant& kernel = select_kernel(inputs.q, inputs.k, inputs.v, options);
  const AttentionParams params =
      make_params(inputs.q, inputs.k, inputs.v, at::Tensor(), at::Tensor(), options);

  CheckResult result;
  result.kernel = kernel.name;
  result.problem = spec.describe();
  result.tiles = kernel.tile_shape(params);

  // Poison: any element the kernel fails to write stays NaN and fails the check.
  at::Tensor out = at::full(inputs.q.sizes(), std::numeric_limits<double>::quiet_NaN(),
                            inputs.q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor lse = at::full({spec.batch, spec.heads, spec.seqlen_q},
                            std::numeric_limits<double>::quiet_NaN(),
                            inputs.q.options().dtype(at::kFloat));
  AttentionOptions run_options = options;
  run_options.kernel = kernel.name;
  attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse, run_options);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());

  ReferenceOptions reference_options;
  reference_options.softmax_scale = params.softmax_scale;
  reference_options.window_left = params.window_left;
  reference_options.window_right = params.window_right;
  reference_options.compute_dtype =
      (spec.float64_reference || spec.dtype == at::kFloat) ? at::kDouble : at::kFloat;
  const ReferenceOutput reference = reference_attention(inputs.q, inputs.k, inputs.v, reference_options);
  reference_options.compute_dtype = spec.dtype;
  const ReferenceOutput same_precision =
      reference_attention(inputs.q, inputs.k, inputs.v, reference_options);

  result.ref_err = max_finite_abs_difference(same_precision.out, reference.out);
  result.storage_err = max_finite_abs_difference(reference.out.to(spec.dtype), reference.out);
  const double lse_ref_err = max_finite_abs_difference(same_precision.lse, reference.lse);
  const double lse_storage_err =
      max_finite_abs_difference(reference.lse.to(at::kFloat), reference.lse);

  TileContext context;
  context.tiles = result.tiles;
  context.seqlen_q = spec.seqlen_q;
  context.seqlen_k = spec.seqlen_k;
  context.window_left = params.window_left;
  context.window_right = params.window_right;
  // flash-attn's rule: at most twice torch's own same-precision error, plus the
  // rounding that storing the reference in the output dtype costs, plus a few
  // float32 ulps of the largest value: kernels accumulate in float32, and with
  // float32 inputs torch's own error can be a single ulp (seqlen_k 1, say).
  auto float32_floor = [](const at::Tensor& values) {
    const at::Tensor finite = values.masked_select(at::isfinite(values));
    return finite.numel() == 0 ? 0.0 : 4 * FLT_EPSILON * finite.abs().max().item<double>();
  };
  result.out = compare_elementwise(
      "out", out, reference.out,
      2 * result.ref_err + result.storage_err + float32_floor(reference.out), context);
  // LSE is (batch, heads, seqlen_q); compare it as (batch, row, head, 1).
  result.lse = compare_elementwise("lse", lse.permute({0, 2, 1}).unsqueeze(-1),
                                   reference.lse.permute({0, 2, 1}).unsqueeze(-1),
                                   2 * lse_ref_err + lse_storage_err + float32_floor(reference.lse),
                                   context);

  if (check_options.timed_launches > 0) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(0).stream();
    cudaEvent_t start, stop;
    FLASHLAB_CUDA_CHECK(cudaEventCreate(&start));
    FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop));
    for (int warmup = 0; warmup < 3; ++warmup)
      attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse, run_options);
    std::vector<float> times;
    for (int launch = 0; launch < check_options.timed_launches; ++launch) {
      FLASHLAB_CUDA_CHECK(cudaEventRecord(start, stream));
      attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse, run_options);
      FLASHLAB_CUDA_CHECK(cudaEventRecord(stop, stream));
      FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      times.push_back(ms);
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    result.kernel_ms = times[times.size() / 2];
    FLASHLAB_CUDA_CHECK(cudaEventDestroy(start));
    FLASHLAB_CUDA_CHECK(cudaEventDestroy(stop));
  }
  return result;
}

std::string CheckResult::format() const {
  std::ostringstream text;
  text << std::setprecision(4);
  text << "kernel  " << kernel << " (tiles " << tiles.block_q << "x" << tiles.block_k << ")\n"
       << "problem " << problem << "\n"
       << "torch same-precision math error " << ref_err << ", storage rounding " << storage_err
       << " -> output tolerance " << out.tolerance << " (2 x math error + rounding + 4 float32 ulps)\n"
       << out.format() << lse.format();
  if (kernel_ms >= 0) text << "kernel time " << kernel_ms << " ms (median)\n";
  text << (passed() ? "PASSED" : "FAILED") << "\n";
  return text.str();
}

std::string CheckResult::to_json() const {
  std::ostringstream text;
  text << "{\"passed\": " << (passed() ? "true" : "false") << ", \"kernel\": " << json_string(kernel)
       << ", \"problem\": " << json_string(problem) << ", \"max_abs_err\": "
       << json_number(out.max_abs_error) << ", \"ref_err\": " << json_number(ref_err)
       << ", \"storage_err\": " << json_number(storage_err) << ", \"tolerance\": "
       << json_number(out.tolerance) << ", \"over_tolerance\": " << out.over_tolerance
       << ", \"nan_count\": " << out.nan_count << ", \"inf_count\": " << out.inf_count
       << ", \"first_bad\": " << out.first_bad_json() << ", \"lse_passed\": "
       << (lse.passed() ? "true" : "false") << ", \"lse_max_abs_err\": "
       << json_number(lse.max_abs_error) << ", \"lse_first_bad\": " << lse.first_bad_json()
       << ", \"block_q\": " << tiles.block_q << ", \"block_k\": " << tiles.block_k
       << ", \"kernel_ms\": " << (kernel_ms >= 0 ? json_number(kernel_ms) : "null") << "}";
  return text.str();
}

}  // namespace flashlab
