// Input validation, kernel selection and the launch. Checks run in this order
// so that every message can be provoked without a GPU: structure (rank, dtype,
// shapes, strides, options), then the kernel, then the device.
#include "flashlab/attention.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "host_path.h"
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
  params.modification.softcap = static_cast<float>(options.softcap);
  if (options.alibi_slopes.defined()) {
    params.modification.alibi_slopes = options.alibi_slopes.data_ptr<float>();
    params.modification.alibi_batch_stride = options.alibi_slopes.dim() == 2 ? options.alibi_slopes.size(1) : 0;
  }
  if (options.sinks.defined()) params.modification.sinks = options.sinks.data_ptr<float>();
  params.device_compute_capability = device_compute_capability(q);
  params.sm_margin = options.sm_margin;
  if (params.dtype == DataType::e4m3) {
    params.output_dtype = to_data_type(out.defined() ? out.scalar_type() : detail::output_scalar_type(q, options));
    params.q_descale = options.q_descale.defined() ? options.q_descale.data_ptr<float>() : nullptr;
    params.k_descale = options.k_descale.defined() ? options.k_descale.data_ptr<float>() : nullptr;
    params.v_descale = options.v_descale.defined() ? options.v_descale.data_ptr<float>() : nullptr;
    params.descale_batch_stride = params.kv_heads;
  }
  return params;
}

const KernelVariant& select_kernel(const AttentionParams& params, const std::string& kernel_name,
                                   HeadDimPadding padding) {
  return detail::select_mode_kernel(params, kernel_name, padding);
}

void run_kernel(const KernelVariant& kernel, const AttentionParams& params) {
  detail::run_mode_kernel(kernel, params);
}

namespace {

// The parameter block for (q, k, v, out, options) of one entry (lse and the
// varlen lengths are the entry's own).
using MakeForwardParams =
    std::function<AttentionParams(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& out, const AttentionOptions& options)>;

// Runs `kernel` (selected for q, k, v with padding allowed) on the current
// stream, writing lse and `out`, or, when out is undefined, a new output that
// it returns (a view of the padded one when the kernel pads head_dim:
// run_at_kernel_head_dim).
at::Tensor run_forward(const KernelVariant& kernel, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& out, const AttentionOptions& options,
                       const MakeForwardParams& make) {
  detail::LaunchTensors tensors;
  tensors.inputs = {q, k, v};
  tensors.outputs = {out};
  // The FP8 forward writes a 16-bit output: like an expanded one-element
  // tensor of that dtype (q's shape; the output is allocated from its sizes and options).
  const at::ScalarType out_type = detail::output_scalar_type(q, options);
  tensors.output_like = {out_type == q.scalar_type() ? q : q.new_empty({1}, q.options().dtype(out_type)).expand(q.sizes())};
  return detail::run_at_kernel_head_dim(
      kernel, q.size(-1), tensors, options, [&](const detail::LaunchTensors& run, const AttentionOptions& run_options) {
        detail::launch_mode_kernel(kernel, make(run.inputs[0], run.inputs[1], run.inputs[2], run.outputs[0], run_options));
      })[0];
}

}  // namespace

const KernelVariant& select_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& options, HeadDimPadding padding) {
  check_structure(q, k, v, options);
  check_same_device(q, k, v);
  return select_kernel(make_params(q, k, v, at::Tensor(), at::Tensor(), options), options.kernel,
                       padding);
}

namespace {

// attention_forward (into false: out and lse allocated here) and
// attention_forward_into.
AttentionOutput forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& out, at::Tensor lse, const AttentionOptions& options,
                        bool into) {
  const KernelVariant& kernel = select_kernel(q, k, v, options);
  const std::vector<int64_t> lse_shape = {q.size(0), q.size(2), q.size(1)};
  if (into)
    check_output_buffers(q, out, lse, lse_shape, "(batch, heads, seqlen_q)", detail::output_scalar_type(q, options));
  else
    lse = at::empty(lse_shape, q.options().dtype(at::kFloat));
  const c10::cuda::CUDAGuard device_guard = detail::cuda_device_guard(q, "q, k and v");
  const auto make = [&](const at::Tensor& q_run, const at::Tensor& k_run, const at::Tensor& v_run,
                        const at::Tensor& out_run, const AttentionOptions& options_run) {
    return make_params(q_run, k_run, v_run, out_run, lse, options_run);
  };
  return {run_forward(kernel, q, k, v, out, options, make), lse};
}

}  // namespace

void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options) {
  forward(q, k, v, out, lse, options, /*into=*/true);
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
                                          int max_seqlen_k, const AttentionOptions& options,
                                          HeadDimPadding padding) {
  check_varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  return select_kernel(make_varlen_params(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                          max_seqlen_k, at::Tensor(), at::Tensor(), options),
                       options.kernel, padding);
}

namespace {

// attention_varlen_forward (into false) and its _into form.
AttentionOutput varlen_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                               int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                               at::Tensor lse, const AttentionOptions& options, bool into) {
  const KernelVariant& kernel = select_varlen_kernel(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                     max_seqlen_q, max_seqlen_k, options);
  const std::vector<int64_t> lse_shape = {q.size(1), q.size(0)};
  if (into)
    check_output_buffers(q, out, lse, lse_shape, "(heads, total_q)", detail::output_scalar_type(q, options));
  else
    lse = at::empty(lse_shape, q.options().dtype(at::kFloat));
  const c10::cuda::CUDAGuard device_guard = detail::cuda_device_guard(q, "q, k and v");
  // max_seqlen_q 0 (every sequence empty) launches nothing.
  const auto make = [&](const at::Tensor& q_run, const at::Tensor& k_run, const at::Tensor& v_run,
                        const at::Tensor& out_run, const AttentionOptions& options_run) {
    return make_varlen_params(q_run, k_run, v_run, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, out_run, lse, options_run);
  };
  return {run_forward(kernel, q, k, v, out, options, make), lse};
}

}  // namespace

void attention_varlen_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                                   const at::Tensor& lse, const AttentionOptions& options) {
  varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, out, lse,
                 options, /*into=*/true);
}

AttentionOutput attention_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                         const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                         int max_seqlen_k, const AttentionOptions& options) {
  return varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        at::Tensor(), at::Tensor(), options, /*into=*/false);
}

AttentionOutput attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionOptions& options) {
  return forward(q, k, v, at::Tensor(), at::Tensor(), options, /*into=*/false);
}

}  // namespace flashlab
