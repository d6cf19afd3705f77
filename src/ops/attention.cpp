// Input validation, kernel selection and the launch. Checks run in this order
// so that every message can be provoked without a GPU: structure (rank, dtype,
// shapes, strides, options), then the kernel, then the device.
#include "flashlab/attention.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>

#include "validation.h"

namespace flashlab {
namespace {

using detail::check_output_buffers;
using detail::check_same_device;
using detail::check_structure;
using detail::check_varlen_inputs;
using detail::check_varlen_structure;
using detail::device_compute_capability;
using detail::to_data_type;

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
  if (params.stream == nullptr)
    params.stream = c10::cuda::getCurrentCUDAStream(c10::cuda::current_device()).stream();
  at::Tensor workspace;  // freed when this returns (see allocate_workspace)
  if (kernel.workspace_bytes != nullptr) {
    params.workspace_bytes = kernel.workspace_bytes(params);
    workspace = detail::allocate_workspace(params.workspace_bytes, params.stream);
    params.workspace = workspace.defined() ? workspace.data_ptr() : nullptr;
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
