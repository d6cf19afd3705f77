// Input validation, kernel selection and the launch. Checks run in this order
// so that every message can be provoked without a GPU: structure (rank, dtype,
// shapes, strides, options), then the kernel, then the device.
#include "flashlab/attention.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>
#include <vector>

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

// packed_tokens: q, k, v are (1, total_tokens, heads, head_dim) views of a
// variable-length batch, where a total of 0 tokens is legal.
void check_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options, bool packed_tokens = false) {
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
  TORCH_CHECK(q.size(0) >= 1 && (packed_tokens || (q.size(1) >= 1 && k.size(1) >= 1)) &&
                  q.size(2) >= 1 && k.size(2) >= 1 && q.size(3) >= 1,
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

// out like q (dtype, shape, contiguous last dimension); lse a contiguous
// float32 tensor of lse_shape, which lse_layout names for the message; both on
// q's device.
void check_output_buffers(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<int64_t>& lse_shape, const char* lse_layout) {
  TORCH_CHECK(out.defined() && lse.defined(), "out and lse must be defined tensors");
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == q.scalar_type(),
              "out must match q in shape and dtype; got out ", shape_text(out), " ",
              out.scalar_type(), ", q ", shape_text(q), " ", q.scalar_type());
  TORCH_CHECK(out.stride(-1) == 1, "out must have a contiguous last dimension; got strides ",
              out.strides());
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(lse_shape) && lse.scalar_type() == at::kFloat &&
                  lse.is_contiguous(),
              "lse must be a contiguous float32 tensor of shape ", lse_layout, " = ",
              at::IntArrayRef(lse_shape), "; got ", shape_text(lse), " ", lse.scalar_type());
  TORCH_CHECK(out.device() == q.device() && lse.device() == q.device(),
              "out and lse must be on q's device ", q.device(), "; got ", out.device(), " and ",
              lse.device());
}

// Variable-length inputs, structure only: 3-D packed tensors, then every check
// of the fixed-length path on (1, total_tokens, heads, head_dim) views.
void check_varlen_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionOptions& options) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "q, k and v must all be defined tensors");
  for (const auto& [name, tensor, rows] :
       {std::tuple{"q", &q, "total_q"}, {"k", &k, "total_k"}, {"v", &v, "total_k"}}) {
    TORCH_CHECK(tensor->dim() == 3, name, " must be 3-D (", rows,
                ", heads, head_dim) for a variable-length batch; got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape; got k ", shape_text(k),
              " and v ", shape_text(v));
  TORCH_CHECK(q.size(2) == k.size(2), "q and k must have the same head_dim; got q ",
              shape_text(q), " and k ", shape_text(k));
  check_structure(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), options, /*packed_tokens=*/true);
}

// cu_seqlens_q/k: int32, 1-D, one length, on q's device (checked before any
// value is read, so a tensor on another device is never copied).
void check_cu_seqlens_tensors(const at::Tensor& q, const at::Tensor& cu_seqlens_q,
                              const at::Tensor& cu_seqlens_k) {
  for (const auto& [name, tensor] :
       {std::pair{"cu_seqlens_q", &cu_seqlens_q}, {"cu_seqlens_k", &cu_seqlens_k}}) {
    TORCH_CHECK(tensor->defined(), name, " must be a defined tensor");
    TORCH_CHECK(tensor->scalar_type() == at::kInt, name, " must have dtype Int (int32); got ",
                tensor->scalar_type());
    TORCH_CHECK(tensor->dim() == 1, name, " must be 1-D (batch + 1); got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
  }
  TORCH_CHECK(cu_seqlens_q.size(0) == cu_seqlens_k.size(0),
              "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); got ",
              cu_seqlens_q.size(0), " and ", cu_seqlens_k.size(0));
  TORCH_CHECK(cu_seqlens_q.size(0) >= 2,
              "cu_seqlens_q and cu_seqlens_k need at least 2 elements (batch + 1 with batch >= 1); got ",
              cu_seqlens_q.size(0));
  TORCH_CHECK(cu_seqlens_q.device() == q.device() && cu_seqlens_k.device() == q.device(),
              "cu_seqlens_q and cu_seqlens_k must be on q's device ", q.device(), "; got ",
              cu_seqlens_q.device(), " and ", cu_seqlens_k.device());
}

// The values of one cu_seqlens array, read on the host: a prefix sum from 0 to
// the total token count whose lengths all fit under max_seqlen.
void check_cu_seqlens_values(const char* name, const at::Tensor& cu_seqlens, int64_t total_tokens,
                             const char* tensor_name, const char* max_name, int max_seqlen) {
  const at::Tensor host = cu_seqlens.to(at::kCPU).contiguous();
  const int* offsets = host.data_ptr<int>();
  const int64_t count = host.size(0);
  TORCH_CHECK(offsets[0] == 0, name, " must start at 0; got ", offsets[0]);
  int longest = 0;
  for (int64_t index = 1; index < count; ++index) {
    TORCH_CHECK(offsets[index] >= offsets[index - 1], name,
                " must be non-decreasing (sequence lengths >= 0); got ", name, "[", index - 1,
                "] = ", offsets[index - 1], " followed by ", offsets[index]);
    longest = std::max(longest, offsets[index] - offsets[index - 1]);
  }
  TORCH_CHECK(offsets[count - 1] == total_tokens, "the last element of ", name,
              " must equal the number of tokens in ", tensor_name, " (", total_tokens, "); got ",
              offsets[count - 1]);
  TORCH_CHECK(max_seqlen >= longest, max_name, " must be at least the longest sequence (",
              longest, " tokens in ", name, "); got ", max_seqlen);
}

void check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                         int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options) {
  check_varlen_structure(q, k, v, options);
  check_same_device(q, k, v);
  check_cu_seqlens_tensors(q, cu_seqlens_q, cu_seqlens_k);
  check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, q.size(0), "q", "max_seqlen_q",
                          max_seqlen_q);
  check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, k.size(0), "k", "max_seqlen_k",
                          max_seqlen_k);
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
  params.device_compute_capability = device_compute_capability(q);
  return params;
}

namespace {

// The kernel for an already validated parameter block (see select_kernel).
const KernelVariant& select_kernel_for(const AttentionParams& params,
                                       const AttentionOptions& options) {
  if (options.kernel == "auto") {
    std::string reasons;
    for (const auto& kernel : registered_kernels()) {
      const std::string reason = cannot_run_reason(kernel, params);
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
  const std::string device_reason = cannot_run_reason(*kernel, params);
  TORCH_CHECK(device_reason.empty(), device_reason);
  return *kernel;
}

// run_kernel once the kernel is known to take params.
void launch_checked(const KernelVariant& kernel, AttentionParams params) {
  if (params.seqlen_q == 0 || params.batch == 0) return;  // no row to write, no grid to launch
  const c10::DeviceIndex device = c10::cuda::current_device();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  if (params.stream == nullptr) params.stream = current.stream();
  at::Tensor workspace;
  if (kernel.workspace_bytes != nullptr) {
    params.workspace_bytes = kernel.workspace_bytes(params);
    if (params.workspace_bytes > 0) {
      workspace = at::empty({static_cast<int64_t>(params.workspace_bytes)},
                            at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
      params.workspace = workspace.data_ptr();
      // Freed when this returns: the caching allocator keeps it for the stream's later work.
      const auto stream = static_cast<cudaStream_t>(params.stream);
      if (stream != current.stream())
        c10::cuda::CUDACachingAllocator::recordStream(
            workspace.storage().data_ptr(), c10::cuda::getStreamFromExternal(stream, device));
    }
  }
  kernel.launch(params);
}

}  // namespace

void run_kernel(const KernelVariant& kernel, const AttentionParams& params) {
  const std::string reason = cannot_run_reason(kernel, params);
  TORCH_CHECK(reason.empty(), "kernel ", kernel.name, " cannot run ", describe_problem(params), ": ",
              reason);
  launch_checked(kernel, params);
}

const KernelVariant& select_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& options) {
  check_structure(q, k, v, options);
  check_same_device(q, k, v);
  return select_kernel_for(make_params(q, k, v, at::Tensor(), at::Tensor(), options), options);
}

void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options) {
  const KernelVariant& kernel = select_kernel(q, k, v, options);
  check_output_buffers(q, out, lse, {q.size(0), q.size(2), q.size(1)}, "(batch, heads, seqlen_q)");
  TORCH_CHECK(q.is_cuda(), "q, k and v must be on a CUDA device; got ", q.device());
  const c10::cuda::CUDAGuard device_guard(q.device());
  launch_checked(kernel, make_params(q, k, v, out, lse, options));
}

AttentionParams make_varlen_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                                   const at::Tensor& lse, const AttentionOptions& options) {
  AttentionParams params =
      make_params(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), at::Tensor(), at::Tensor(), options);
  params.q_batch_stride = params.k_batch_stride = params.v_batch_stride = 0;
  params.cu_seqlens_q = cu_seqlens_q.data_ptr<int>();
  params.cu_seqlens_k = cu_seqlens_k.data_ptr<int>();
  params.batch = static_cast<int>(cu_seqlens_q.size(0) - 1);
  params.seqlen_q = max_seqlen_q;
  params.seqlen_k = max_seqlen_k;
  params.total_rows_q = q.size(0);
  params.total_rows_k = k.size(0);
  if (out.defined()) {
    params.out = out.data_ptr();
    params.out_batch_stride = 0;
    params.out_row_stride = out.stride(0);
    params.out_head_stride = out.stride(1);
  }
  params.lse = lse.defined() ? lse.data_ptr<float>() : nullptr;
  // lse is (heads, total_q): the row offset cu_seqlens_q[b] already selects the sequence.
  params.lse_batch_stride = 0;
  params.lse_head_stride = q.size(0);
  return params;
}

const KernelVariant& select_varlen_kernel(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                          const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                          int max_seqlen_k, const AttentionOptions& options) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  return select_kernel_for(make_varlen_params(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                              max_seqlen_k, at::Tensor(), at::Tensor(), options),
                           options);
}

void attention_varlen_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                                   const at::Tensor& lse, const AttentionOptions& options) {
  const KernelVariant& kernel = select_varlen_kernel(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k, options);
  check_output_buffers(q, out, lse, {q.size(1), q.size(0)}, "(heads, total_q)");
  TORCH_CHECK(q.is_cuda(), "q, k and v must be on a CUDA device; got ", q.device());
  const c10::cuda::CUDAGuard device_guard(q.device());
  // max_seqlen_q 0 (every sequence empty) launches nothing.
  launch_checked(kernel, make_varlen_params(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, out, lse, options));
}

AttentionOutput attention_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                         const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                         int max_seqlen_k, const AttentionOptions& options) {
  check_varlen_structure(q, k, v, options);
  AttentionOutput result;
  result.out = at::empty(q.sizes(), q.options());
  result.lse = at::empty({q.size(1), q.size(0)}, q.options().dtype(at::kFloat));
  attention_varlen_forward_into(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                result.out, result.lse, options);
  return result;
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
