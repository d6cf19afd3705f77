// Input validation, kernel selection and the launch. Checks run in this order
// so that every message can be provoked without a GPU: structure (rank, dtype,
// shapes, strides, options), then the kernel, then the device.
#include "flashlab/attention.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cmath>
#include <sstream>

#include "flashlab/cuda_check.h"

namespace flashlab {
namespace {

std::string shape_text(const at::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

DataType to_data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::float32;
    case at::kHalf: return DataType::float16;
    case at::kBFloat16: return DataType::bfloat16;
    default: TORCH_CHECK(false, "unsupported dtype ", type);
  }
}

void check_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "q, k and v must all be defined tensors");
  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(tensor->dim() == 4, name,
                " must be 4-D (batch, seqlen, heads, head_dim); got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
    const auto type = tensor->scalar_type();
    TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, name,
                " has dtype ", type, "; supported dtypes are Float, Half and BFloat16");
  }
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must share one dtype; got q ", q.scalar_type(), ", k ", k.scalar_type(),
              ", v ", v.scalar_type());
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape; got k ", shape_text(k),
              " and v ", shape_text(v));
  TORCH_CHECK(q.size(0) == k.size(0), "q and k must have the same batch size; got q ",
              shape_text(q), " and k ", shape_text(k));
  TORCH_CHECK(q.size(3) == k.size(3), "q and k must have the same head_dim; got q ",
              shape_text(q), " and k ", shape_text(k));
  TORCH_CHECK(q.size(0) >= 1 && q.size(1) >= 1 && k.size(1) >= 1 && q.size(2) >= 1 &&
                  k.size(2) >= 1 && q.size(3) >= 1,
              "batch, seqlens, heads and head_dim must all be >= 1; got q ", shape_text(q),
              " and k ", shape_text(k));
  TORCH_CHECK(q.size(2) % k.size(2) == 0, "q has ", q.size(2),
              " heads, which is not a multiple of the ", k.size(2),
              " heads of k and v (GQA/MQA need heads % kv_heads == 0)");
  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(tensor->stride(3) == 1, name,
                " must have a contiguous last dimension (stride 1); got strides ",
                tensor->strides());
  }
  TORCH_CHECK(options.window_left >= -1 && options.window_right >= -1,
              "window_left and window_right must be >= -1 (-1 = unbounded); got (",
              options.window_left, ", ", options.window_right, ")");
  if (options.softmax_scale)
    TORCH_CHECK(std::isfinite(*options.softmax_scale), "softmax_scale must be finite; got ",
                *options.softmax_scale);
}

void check_same_device(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "q, k and v must be on one device; got q on ", q.device(), ", k on ", k.device(),
              ", v on ", v.device());
}

void check_output_buffers(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse) {
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must match q in shape and dtype; got out ", shape_text(out), " ",
              out.scalar_type(), ", q ", shape_text(q), " ", q.scalar_type());
  TORCH_CHECK(out.stride(3) == 1, "out must have a contiguous last dimension; got strides ",
              out.strides());
  const std::vector<int64_t> lse_shape = {q.size(0), q.size(2), q.size(1)};
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(lse_shape) && lse.scalar_type() == at::kFloat &&
                  lse.is_contiguous(),
              "lse must be a contiguous float32 tensor of shape (batch, heads, seqlen_q) = ",
              at::IntArrayRef(lse_shape), "; got ", shape_text(lse), " ", lse.scalar_type());
  TORCH_CHECK(out.device() == q.device() && lse.device() == q.device(),
              "out and lse must be on q's device ", q.device(), "; got ", out.device(), " and ",
              lse.device());
}

int device_compute_capability(const at::Tensor& q) {
  if (!q.is_cuda()) return 0;
  int major = 0, minor = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.get_device()));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, q.get_device()));
  return major * 10 + minor;
}

}  // namespace

AttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options) {
  AttentionParams params;
  params.q = q.data_ptr();
  params.k = k.data_ptr();
  params.v = v.data_ptr();
  params.out = out.defined() ? out.data_ptr() : nullptr;
  params.lse = lse.defined() ? lse.data_ptr<float>() : nullptr;
  params.q_batch_stride = q.stride(0), params.q_row_stride = q.stride(1), params.q_head_stride = q.stride(2);
  params.k_batch_stride = k.stride(0), params.k_row_stride = k.stride(1), params.k_head_stride = k.stride(2);
  params.v_batch_stride = v.stride(0), params.v_row_stride = v.stride(1), params.v_head_stride = v.stride(2);
  if (out.defined()) {
    params.out_batch_stride = out.stride(0);
    params.out_row_stride = out.stride(1);
    params.out_head_stride = out.stride(2);
  }
  params.batch = static_cast<int>(q.size(0));
  params.seqlen_q = static_cast<int>(q.size(1));
  params.heads = static_cast<int>(q.size(2));
  params.head_dim = static_cast<int>(q.size(3));
  params.seqlen_k = static_cast<int>(k.size(1));
  params.kv_heads = static_cast<int>(k.size(2));
  params.lse_batch_stride = static_cast<int64_t>(params.heads) * params.seqlen_q;
  params.lse_head_stride = params.seqlen_q;
  params.dtype = to_data_type(q.scalar_type());
  params.softmax_scale = static_cast<float>(
      options.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(params.head_dim))));
  params.window_left = options.window_left;
  params.window_right = options.causal ? 0 : options.window_right;
  params.trace = options.trace;
  params.device_compute_capability = device_compute_capability(q);
  return params;
}

const KernelVariant& select_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& options) {
  check_structure(q, k, v, options);
  check_same_device(q, k, v);
  const AttentionParams params = make_params(q, k, v, at::Tensor(), at::Tensor(), options);
  const bool want_trace = options.trace.enabled();
  auto capability_reason = [&](const KernelVariant& kernel) -> std::string {
    if (params.device_compute_capability == 0 ||
        params.device_compute_capability >= kernel.min_compute_capability)
      return {};
    return "kernel " + kernel.name + " needs compute capability " +
           std::to_string(kernel.min_compute_capability) + " or newer; this device has " +
           std::to_string(params.device_compute_capability);
  };
  if (options.kernel == "auto") {
    std::string reasons;
    for (const auto& kernel : registered_kernels()) {
      std::string reason = kernel.unsupported_reason(params);
      if (reason.empty()) reason = capability_reason(kernel);
      if (reason.empty() && want_trace && !kernel.supports_tile_trace)
        reason = kernel.name + " does not record tile traces";
      if (reason.empty()) return kernel;
      reasons += "\n  " + reason;
    }
    TORCH_CHECK(false, "no registered kernel can run ", describe_problem(params), ":", reasons);
  }
  const KernelVariant* kernel = find_kernel(options.kernel);
  TORCH_CHECK(kernel != nullptr, "unknown kernel '", options.kernel,
              "'; registered kernels: ", registered_kernel_names(), " (or auto)");
  const std::string reason = kernel->unsupported_reason(params);
  TORCH_CHECK(reason.empty(), "kernel ", kernel->name, " cannot run ", describe_problem(params),
              ": ", reason);
  TORCH_CHECK(!want_trace || kernel->supports_tile_trace, "kernel ", kernel->name,
              " does not record tile traces; kernels that do: ", [] {
                std::string names;
                for (const auto& other : registered_kernels())
                  if (other.supports_tile_trace) names += (names.empty() ? "" : ", ") + other.name;
                return names;
              }());
  const std::string capability = capability_reason(*kernel);
  TORCH_CHECK(capability.empty(), capability);
  return *kernel;
}

void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options) {
  const KernelVariant& kernel = select_kernel(q, k, v, options);
  check_output_buffers(q, out, lse);
  TORCH_CHECK(q.is_cuda(), "q, k and v must be on a CUDA device; got ", q.device());
  const c10::cuda::CUDAGuard device_guard(q.device());
  AttentionParams params = make_params(q, k, v, out, lse, options);
  params.stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  kernel.launch(params);
}

AttentionOutput attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionOptions& options) {
  check_structure(q, k, v, options);
  AttentionOutput result;
  result.out = at::empty(q.sizes(), q.options());
  result.lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  attention_forward_into(q, k, v, result.out, result.lse, options);
  return result;
}

}  // namespace flashlab
