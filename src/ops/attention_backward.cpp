// The backward pass's validation, kernel selection and launch. Same order as
// the forward (attention.cpp), so every message can be provoked without a GPU:
// structure (q, k, v, options; then out, lse, dout and the gradients), then
// the kernel, then the device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "validation.h"

namespace flashlab {
namespace {

// "fa2_mma_sm80, fa1_scalar": the registered kernels that have a backward.
std::string kernels_with_backward() {
  std::string names;
  for (const auto& kernel : registered_kernels())
    if (kernel.backward_launch != nullptr) names += (names.empty() ? "" : ", ") + kernel.name;
  return names.empty() ? "none" : names;
}

// cannot_run_reason for the backward: the kernel has one, it takes the
// problem (backward_unsupported_reason), the device, no tile trace. Empty: it can.
std::string backward_cannot_run_reason(const KernelVariant& kernel,
                                       const AttentionBackwardParams& params) {
  if (kernel.backward_launch == nullptr)
    return kernel.name + " has no backward pass (kernels with one: " + kernels_with_backward() + ")";
  std::string reason =
      kernel.backward_unsupported_reason != nullptr ? kernel.backward_unsupported_reason(params) : "";
  if (reason.empty()) reason = architecture_reason(kernel, params.device_compute_capability);
  if (reason.empty() && params.trace.enabled())
    reason = kernel.name + "'s backward does not record tile states (tile traces are forward only)";
  return reason;
}

// dout like q and out (out is checked against q by check_output_buffers).
void check_dout(const at::Tensor& q, const at::Tensor& dout) { detail::check_like("dout", dout, "q", q); }

// dq, dk, dv like q, k, v: shape, dtype, contiguous last dimension, device.
void check_gradients(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv) {
  TORCH_CHECK(dq.defined() && dk.defined() && dv.defined(),
              "dq, dk and dv must all be defined tensors");
  detail::check_like("dq", dq, "q", q);
  detail::check_like("dk", dk, "k", k);
  detail::check_like("dv", dv, "v", v);
}

// Zeroes `rows` rows (each `heads` x `head_dim` elements at row_stride and
// head_stride) of each of `batches` entries at batch_stride, on `stream`.
void zero_rows(void* data, size_t element_bytes, int batches, int64_t batch_stride, int64_t rows,
               int64_t row_stride, int heads, int64_t head_stride, int head_dim,
               cudaStream_t stream) {
  if (data == nullptr || rows <= 0 || head_dim <= 0) return;
  for (int b = 0; b < batches; ++b)
    for (int h = 0; h < heads; ++h) {
      char* first = static_cast<char*>(data) + (b * batch_stride + h * head_stride) * element_bytes;
      // One head of `rows` rows: rows of head_dim elements, row_stride apart
      // (a single row's stride can be anything torch likes: unused).
      const size_t width = head_dim * element_bytes;
      const size_t pitch = rows == 1 ? width : row_stride * element_bytes;
      FLASHLAB_CUDA_CHECK(cudaMemset2DAsync(first, pitch, 0, width, rows, stream));
    }
}

size_t element_bytes(DataType dtype) { return dtype == DataType::float32 ? 4 : 2; }

// run_backward_kernel once the kernel is known to take params.
void launch_backward_checked(const KernelVariant& kernel, AttentionBackwardParams params) {
  if (params.stream == nullptr)
    params.stream = c10::cuda::getCurrentCUDAStream(c10::cuda::current_device()).stream();
  const auto stream = static_cast<cudaStream_t>(params.stream);
  if (params.batch == 0 || params.seqlen_q == 0 || params.seqlen_k == 0) {
    // Nothing to launch, but every gradient that has rows must read 0: with no
    // query rows dk and dv (no row sees a key), with no keys dq (no row sees one).
    // Variable-length rows are packed (batch strides ignored): one entry of all rows.
    const int entries = params.is_varlen() ? 1 : params.batch;
    const size_t bytes = element_bytes(params.dtype);
    if (params.seqlen_k == 0) {
      const int64_t rows = params.is_varlen() ? params.total_rows_q : params.seqlen_q;
      zero_rows(params.dq, bytes, entries, params.dq_batch_stride, rows, params.dq_row_stride,
                params.heads, params.dq_head_stride, params.head_dim, stream);
    }
    if (params.seqlen_q == 0) {
      const int64_t rows = params.is_varlen() ? params.total_rows_k : params.seqlen_k;
      zero_rows(params.dk, bytes, entries, params.dk_batch_stride, rows, params.dk_row_stride,
                params.kv_heads, params.dk_head_stride, params.head_dim, stream);
      zero_rows(params.dv, bytes, entries, params.dv_batch_stride, rows, params.dv_row_stride,
                params.kv_heads, params.dv_head_stride, params.head_dim, stream);
    }
    return;
  }
  // softmax_d and dq_accum are the kernel's to carve from the workspace.
  params.softmax_d = nullptr;
  params.dq_accum = nullptr;
  params.workspace = nullptr;
  params.workspace_bytes = 0;
  at::Tensor workspace;  // freed when this returns (see allocate_workspace)
  if (kernel.backward_workspace_bytes != nullptr) {
    params.workspace_bytes = kernel.backward_workspace_bytes(params);
    workspace = detail::allocate_workspace(params.workspace_bytes, params.stream);
    params.workspace = workspace.defined() ? workspace.data_ptr() : nullptr;
  }
  kernel.backward_launch(params);
}

// The tensors' checks shared by both entry points, after the inputs' own:
// out and lse as the forward returned them (lse_shape, named lse_layout),
// dout, and dq, dk, dv when given.
void check_backward_buffers(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                            const std::vector<int64_t>& lse_shape, const char* lse_layout) {
  detail::check_output_buffers(q, out, lse, lse_shape, lse_layout);
  check_dout(q, dout);
  check_gradients(q, k, v, dq, dk, dv);
}

}  // namespace

AttentionBackwardParams make_backward_params(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv, const BackwardOptions& options) {
  AttentionBackwardParams params;
  static_cast<AttentionParams&>(params) = make_params(q, k, v, out, lse, options);
  if (dout.defined()) {
    params.dout = dout.data_ptr();
    params.dout_batch_stride = dout.stride(0);
    params.dout_row_stride = dout.stride(1);
    params.dout_head_stride = dout.stride(2);
  }
  if (dq.defined()) {
    params.dq = dq.data_ptr();
    params.dq_batch_stride = dq.stride(0), params.dq_row_stride = dq.stride(1), params.dq_head_stride = dq.stride(2);
  }
  if (dk.defined()) {
    params.dk = dk.data_ptr();
    params.dk_batch_stride = dk.stride(0), params.dk_row_stride = dk.stride(1), params.dk_head_stride = dk.stride(2);
  }
  if (dv.defined()) {
    params.dv = dv.data_ptr();
    params.dv_batch_stride = dv.stride(0), params.dv_row_stride = dv.stride(1), params.dv_head_stride = dv.stride(2);
  }
  params.deterministic = options.deterministic;
  return params;
}

AttentionBackwardParams make_varlen_backward_params(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, const at::Tensor& dq,
    const at::Tensor& dk, const at::Tensor& dv, const BackwardOptions& options) {
  AttentionBackwardParams params;
  static_cast<AttentionParams&>(params) = make_varlen_params(
      q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse, options);
  // Packed (total, heads, head_dim) tensors: batch strides 0, rows dimension 0.
  if (dout.defined()) {
    params.dout = dout.data_ptr();
    params.dout_row_stride = dout.stride(0), params.dout_head_stride = dout.stride(1);
  }
  if (dq.defined()) {
    params.dq = dq.data_ptr();
    params.dq_row_stride = dq.stride(0), params.dq_head_stride = dq.stride(1);
  }
  if (dk.defined()) {
    params.dk = dk.data_ptr();
    params.dk_row_stride = dk.stride(0), params.dk_head_stride = dk.stride(1);
  }
  if (dv.defined()) {
    params.dv = dv.data_ptr();
    params.dv_row_stride = dv.stride(0), params.dv_head_stride = dv.stride(1);
  }
  params.deterministic = options.deterministic;
  return params;
}

const KernelVariant& select_backward_kernel(const AttentionBackwardParams& params,
                                            const std::string& kernel_name) {
  if (kernel_name == "auto") {
    std::string reasons;
    for (const auto& kernel : registered_kernels()) {
      const std::string reason = backward_cannot_run_reason(kernel, params);
      if (reason.empty()) return kernel;
      reasons += "\n  " + reason;
    }
    TORCH_CHECK(false, "no registered kernel has a backward that can run ", describe_problem(params),
                ":", reasons);
  }
  const KernelVariant* kernel = find_kernel(kernel_name);
  TORCH_CHECK(kernel != nullptr, "unknown kernel '", kernel_name,
              "'; registered kernels: ", registered_kernel_names(), " (or auto)");
  TORCH_CHECK(kernel->backward_launch != nullptr, "kernel ", kernel->name,
              " has no backward pass; kernels with one: ", kernels_with_backward());
  const std::string reason = backward_cannot_run_reason(*kernel, params);
  TORCH_CHECK(reason.empty(), "kernel ", kernel->name, " cannot run the backward of ",
              describe_problem(params), ": ", reason);
  return *kernel;
}

void run_backward_kernel(const KernelVariant& kernel, const AttentionBackwardParams& params) {
  const std::string reason = backward_cannot_run_reason(kernel, params);
  TORCH_CHECK(reason.empty(), "kernel ", kernel.name, " cannot run the backward of ",
              describe_problem(params), ": ", reason);
  // A tensor with no rows (a variable-length batch whose key sequences are all
  // empty) may have a null data pointer.
  const bool has_query_rows = params.is_varlen() ? params.total_rows_q > 0 : params.seqlen_q > 0;
  const bool has_key_rows = params.is_varlen() ? params.total_rows_k > 0 : params.seqlen_k > 0;
  std::string missing;
  for (const auto& [name, pointer, has_rows] :
       {std::tuple<const char*, const void*, bool>{"q", params.q, has_query_rows},
        {"k", params.k, has_key_rows}, {"v", params.v, has_key_rows},
        {"out", params.out, has_query_rows}, {"lse", params.lse, has_query_rows},
        {"dout", params.dout, has_query_rows}, {"dq", params.dq, has_query_rows},
        {"dk", params.dk, has_key_rows}, {"dv", params.dv, has_key_rows}})
    if (pointer == nullptr && has_rows) missing += std::string(missing.empty() ? "" : ", ") + name;
  TORCH_CHECK(missing.empty(), "run_backward_kernel needs every tensor of the backward; got no ",
              missing, " (make_backward_params leaves a pointer null for an undefined tensor)");
  launch_backward_checked(kernel, params);
}

void attention_backward_into(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                             const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                             const BackwardOptions& options) {
  detail::check_structure(q, k, v, options);
  detail::check_same_device(q, k, v);
  check_backward_buffers(dout, q, k, v, out, lse, dq, dk, dv, {q.size(0), q.size(2), q.size(1)},
                         "(batch, heads, seqlen_q)");
  const AttentionBackwardParams params = make_backward_params(dout, q, k, v, out, lse, dq, dk, dv, options);
  const KernelVariant& kernel = select_backward_kernel(params, options.kernel);
  TORCH_CHECK(q.is_cuda(), "q, k and v must be on a CUDA device; got ", q.device());
  const c10::cuda::CUDAGuard device_guard(q.device());
  launch_backward_checked(kernel, params);
}

AttentionGradients attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                      const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& out, const at::Tensor& lse,
                                      const BackwardOptions& options) {
  detail::check_structure(q, k, v, options);
  AttentionGradients gradients;
  gradients.dq = at::empty(q.sizes(), q.options());
  gradients.dk = at::empty(k.sizes(), k.options());
  gradients.dv = at::empty(v.sizes(), v.options());
  attention_backward_into(dout, q, k, v, out, lse, gradients.dq, gradients.dk, gradients.dv, options);
  return gradients;
}

void attention_varlen_backward_into(const at::Tensor& dout, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& out, const at::Tensor& lse,
                                    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const at::Tensor& dq,
                                    const at::Tensor& dk, const at::Tensor& dv,
                                    const BackwardOptions& options) {
  detail::check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              options);
  check_backward_buffers(dout, q, k, v, out, lse, dq, dk, dv, {q.size(1), q.size(0)},
                         "(heads, total_q)");
  const AttentionBackwardParams params =
      make_varlen_backward_params(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, dq, dk, dv, options);
  const KernelVariant& kernel = select_backward_kernel(params, options.kernel);
  TORCH_CHECK(q.is_cuda(), "q, k and v must be on a CUDA device; got ", q.device());
  const c10::cuda::CUDAGuard device_guard(q.device());
  launch_backward_checked(kernel, params);
}

AttentionGradients attention_varlen_backward(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& cu_seqlens_q,
                                             const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                             int max_seqlen_k, const BackwardOptions& options) {
  detail::check_varlen_structure(q, k, v, options);
  AttentionGradients gradients;
  gradients.dq = at::empty(q.sizes(), q.options());
  gradients.dk = at::empty(k.sizes(), k.options());
  gradients.dv = at::empty(v.sizes(), v.options());
  attention_varlen_backward_into(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                 max_seqlen_k, gradients.dq, gradients.dk, gradients.dv, options);
  return gradients;
}

}  // namespace flashlab
