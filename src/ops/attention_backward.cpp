// The backward pass's validation, kernel selection and launch. Same order as
// the forward (attention.cpp), so every message can be provoked without a GPU:
// structure (q, k, v, options; then out, lse, dout and the gradients), then
// the kernel, then the device.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "host_path.h"
#include "validation.h"

namespace flashlab {
namespace {

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

}  // namespace

namespace detail {

std::string KernelMode<AttentionBackwardParams>::missing(const KernelVariant& kernel) {
  return kernel.name + " has no backward pass (kernels with one: " + kernels_with_mode<AttentionBackwardParams>() + ")";
}

void KernelMode<AttentionBackwardParams>::check_pointers(const AttentionBackwardParams& params) {
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
  TORCH_CHECK(params.modification.sinks == nullptr || params.dsinks != nullptr,
              "run_backward_kernel with sinks needs a dsinks pointer (float32, heads); got none");
}

bool KernelMode<AttentionBackwardParams>::finish_empty(const AttentionBackwardParams& params) {
  if (params.batch > 0 && params.seqlen_q > 0 && params.seqlen_k > 0) return false;
  // Nothing to launch, but every gradient that has rows must read 0: with no
  // query rows dk and dv (no row sees a key), with no keys dq (no row sees one).
  // Variable-length rows are packed (batch strides ignored): one entry of all rows.
  const auto stream = static_cast<cudaStream_t>(params.stream);
  const int entries = params.is_varlen() ? 1 : params.batch;
  const size_t bytes = element_bytes(params.dtype);
  // No row sees a key: out = 0, so D = 0 and every row's sink term vanishes.
  if (params.dsinks != nullptr)
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(params.dsinks, 0, sizeof(float) * params.heads, stream));
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
  return true;
}

}  // namespace detail

namespace {

// The tensors' checks shared by every entry point, after the inputs' own:
// out and lse as the forward returned them (lse_shape, named lse_layout),
// dout, and with `into` the caller's dq, dk, dv.
void check_backward_buffers(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            const AttentionGradients& gradients, bool into,
                            const std::vector<int64_t>& lse_shape, const char* lse_layout) {
  detail::check_output_buffers(q, out, lse, lse_shape, lse_layout);
  check_dout(q, dout);
  if (into) check_gradients(q, k, v, gradients.dq, gradients.dk, gradients.dv);
}

// The backward parameter block for (dout, q, k, v, out, dq, dk, dv, options)
// of one entry (lse and the varlen lengths are the entry's own).
using MakeBackwardParams = std::function<AttentionBackwardParams(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const AttentionGradients& gradients, const BackwardOptions& options)>;

// Every public backward entry once the inputs (q, k, v, the options, the
// lengths) are validated: checks the other tensors, selects the kernel with
// padding allowed, and runs it on the current stream writing the caller's
// gradients (into) or new ones, which it returns. A kernel that runs head_dim
// padded (padded_head_dim) gets zero-padded copies of dout, q, k, v and out,
// the unpadded softmax scale and padded gradients, whose first head_dim
// columns are the result: returned as views or copied into the caller's.
AttentionGradients backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                            AttentionGradients gradients, bool into, const BackwardOptions& options,
                            const std::vector<int64_t>& lse_shape, const char* lse_layout,
                            const MakeBackwardParams& make) {
  check_backward_buffers(dout, q, k, v, out, lse, gradients, into, lse_shape, lse_layout);
  const AttentionBackwardParams params = make(dout, q, k, v, out, gradients, options);
  const KernelVariant& kernel =
      select_backward_kernel(params, options.kernel, HeadDimPadding::allowed);
  const c10::cuda::CUDAGuard device_guard = detail::cuda_device_guard(q, "q, k and v");
  at::Tensor dsinks = into ? options.dsinks : at::Tensor();
  if (options.sinks.defined()) {
    if (dsinks.defined()) {
      TORCH_CHECK(dsinks.scalar_type() == at::kFloat && dsinks.dim() == 1 && dsinks.size(0) == params.heads &&
                      dsinks.is_contiguous() && dsinks.device() == options.sinks.device(),
                  "dsinks must be a contiguous float32 tensor of shape (heads) = (", params.heads, ") on ",
                  options.sinks.device(), "; got ", dsinks.scalar_type(), " ", dsinks.sizes(), " on ", dsinks.device());
    } else {
      dsinks = at::empty({params.heads}, options.sinks.options());
    }
  }
  if (!into) gradients = {};
  detail::LaunchTensors tensors;
  tensors.inputs = {dout, q, k, v, out};
  tensors.outputs = {gradients.dq, gradients.dk, gradients.dv};
  tensors.output_like = {q, k, v};
  const std::vector<at::Tensor> result = detail::run_at_kernel_head_dim(
      kernel, q.size(-1), tensors, options, [&](const detail::LaunchTensors& run, const BackwardOptions& run_options) {
        const auto& in = run.inputs;
        AttentionBackwardParams run_params =
            make(in[0], in[1], in[2], in[3], in[4], {run.outputs[0], run.outputs[1], run.outputs[2]}, run_options);
        if (dsinks.defined()) run_params.dsinks = dsinks.data_ptr<float>();
        detail::launch_mode_kernel(kernel, run_params);
      });
  return {result[0], result[1], result[2], dsinks};
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
                                            const std::string& kernel_name,
                                            HeadDimPadding padding) {
  return detail::select_mode_kernel(params, kernel_name, padding);
}

void run_backward_kernel(const KernelVariant& kernel, const AttentionBackwardParams& params) {
  detail::run_mode_kernel(kernel, params);
}

namespace {

// attention_backward (into false: new gradients) and attention_backward_into.
AttentionGradients fixed_length_backward(const at::Tensor& dout, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& out, const at::Tensor& lse,
                                         const AttentionGradients& gradients, bool into,
                                         const BackwardOptions& options) {
  detail::check_structure(q, k, v, options);
  detail::check_same_device(q, k, v);
  const auto make = [&](const at::Tensor& dout_run, const at::Tensor& q_run, const at::Tensor& k_run,
                        const at::Tensor& v_run, const at::Tensor& out_run,
                        const AttentionGradients& run, const BackwardOptions& options_run) {
    return make_backward_params(dout_run, q_run, k_run, v_run, out_run, lse, run.dq, run.dk, run.dv,
                                options_run);
  };
  return backward(dout, q, k, v, out, lse, gradients, into, options,
                  {q.size(0), q.size(2), q.size(1)}, "(batch, heads, seqlen_q)", make);
}

}  // namespace

void attention_backward_into(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                             const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                             const BackwardOptions& options) {
  fixed_length_backward(dout, q, k, v, out, lse, {dq, dk, dv}, /*into=*/true, options);
}

AttentionGradients attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                      const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& out, const at::Tensor& lse,
                                      const BackwardOptions& options) {
  return fixed_length_backward(dout, q, k, v, out, lse, {}, /*into=*/false, options);
}

namespace {

// attention_varlen_backward (into false: new gradients) and its _into form.
AttentionGradients varlen_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out,
                                   const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
                                   const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                   int max_seqlen_k, const AttentionGradients& gradients,
                                   bool into, const BackwardOptions& options) {
  detail::check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              options);
  const auto make = [&](const at::Tensor& dout_run, const at::Tensor& q_run, const at::Tensor& k_run,
                        const at::Tensor& v_run, const at::Tensor& out_run,
                        const AttentionGradients& run, const BackwardOptions& options_run) {
    return make_varlen_backward_params(dout_run, q_run, k_run, v_run, out_run, lse, cu_seqlens_q,
                                       cu_seqlens_k, max_seqlen_q, max_seqlen_k, run.dq, run.dk,
                                       run.dv, options_run);
  };
  return backward(dout, q, k, v, out, lse, gradients, into, options, {q.size(1), q.size(0)},
                  "(heads, total_q)", make);
}

}  // namespace

void attention_varlen_backward_into(const at::Tensor& dout, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& out, const at::Tensor& lse,
                                    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const at::Tensor& dq,
                                    const at::Tensor& dk, const at::Tensor& dv,
                                    const BackwardOptions& options) {
  varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  {dq, dk, dv}, /*into=*/true, options);
}

AttentionGradients attention_varlen_backward(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& cu_seqlens_q,
                                             const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                             int max_seqlen_k, const BackwardOptions& options) {
  return varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                         max_seqlen_k, {}, /*into=*/false, options);
}

}  // namespace flashlab
