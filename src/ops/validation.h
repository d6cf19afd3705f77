// Internal to the op library (not installed): the input checks and launch
// helpers every mode shares (attention.cpp, attention_backward.cpp,
// attention_kvcache.cpp; the path from a parameter block to the launch is
// host_path.h), so all say the same thing about the same mistake. Every check throws
// c10::Error with a message naming what was given and what is expected, and
// none touches the device: structure is checked before the device, so each
// message can be provoked on CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/attention.h"

namespace flashlab::detail {

// "[2, 16, 8, 64]"
std::string shape_text(const at::Tensor& tensor);

// Float, Half, BFloat16; anything else throws.
DataType to_data_type(at::ScalarType type);

// q, k, v of a fixed-length batch: 4-D (batch, seqlen, heads, head_dim), one
// supported dtype, k and v alike, batch and head_dim shared, GQA head counts,
// contiguous last dimensions, and the options' window and softmax_scale.
// packed_tokens: q, k, v are (1, total_tokens, heads, head_dim) views of a
// variable-length batch, where a total of 0 tokens is legal.
void check_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options, bool packed_tokens = false);

void check_same_device(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// options' FP8 arguments: the descales float32 (batch, kv_heads), contiguous,
// on `device`, and output_dtype BFloat16 or Half, all only where `fp8` (e4m3 inputs).
void check_fp8_options(const AttentionOptions& options, bool fp8, int64_t batch, int64_t kv_heads,
                       const at::Device& device);
// The forward output's dtype: q's, or for e4m3 q options.output_dtype (default BFloat16).
at::ScalarType output_scalar_type(const at::Tensor& q, const AttentionOptions& options);

// options' score modifications for `batch` sequences and `heads` query heads
// on `device`: softcap finite and >= 0; alibi_slopes float32 (heads) or
// (batch, heads) and sinks float32 (heads), contiguous, on `device`.
void check_score_modification(const AttentionOptions& options, int64_t batch, int64_t heads,
                              const at::Device& device);

// out like q (dtype, shape, contiguous last dimension); lse a contiguous
// float32 tensor of lse_shape, which lse_layout names for the message; both on
// q's device.
// out_type: out's dtype when it is not q's (the FP8 forward's 16-bit output).
void check_output_buffers(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<int64_t>& lse_shape, const char* lse_layout,
                          std::optional<at::ScalarType> out_type = std::nullopt);

// `tensor` (called `name`) like `like` (called `like_name`): defined, same
// shape and dtype, contiguous last dimension, on the same device. For dout
// (like q) and the gradients dq, dk, dv (like q, k, v).
void check_like(const char* name, const at::Tensor& tensor, const char* like_name,
                const at::Tensor& like);

// Variable-length inputs, structure only: 3-D packed tensors, then every check
// of the fixed-length path on (1, total_tokens, heads, head_dim) views.
void check_varlen_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionOptions& options);

// Everything about a variable-length batch's inputs: structure, one device,
// the cu_seqlens tensors (int32, 1-D, one length, on q's device) and, in strict
// mode (host_value_checks), their values (read on the host: prefix sums from 0
// to the token counts, every length within max_seqlen_q/k).
void check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                         int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options);

// Head-dim padding (attention.h): `tensor` (..., head_dim) zero-padded on its
// last dimension to (..., padded_head_dim), a new contiguous tensor.
at::Tensor pad_head_dim(const at::Tensor& tensor, int64_t padded_head_dim);

// `options` with softmax_scale fixed at 1/sqrt(head_dim) of the head_dim given
// when it was left out, so a padded run keeps the unpadded scale (the same
// double as make_params computes, so the same float).
template <class Options>
Options keep_softmax_scale(Options options, int64_t head_dim) {
  if (!options.softmax_scale) options.softmax_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return options;
}

// `params` as a kernel would get them with q, k, v, out (and dout, dq, dk, dv)
// zero-padded to `head_dim`: fresh contiguous tensors, so contiguous strides
// and null pointers here (allocations are aligned; null is too); lse, the
// scale, masks and lengths as they were. For asking a kernel whether it takes
// the padded problem, never for a launch.
AttentionParams params_at_head_dim(const AttentionParams& params, int head_dim);
AttentionBackwardParams params_at_head_dim(const AttentionBackwardParams& params, int head_dim);

// The sentence the head-dim errors end with: how a kernel's head dims extend.
inline constexpr const char* kPaddingNote =
    " (the public entries zero-pad a head_dim up to the next one the kernel has)";

// 90 for an sm_90 tensor's device; 0 for a tensor that is not on a CUDA device.
int device_compute_capability(const at::Tensor& q);

// A kernel's device workspace of `bytes` bytes (undefined tensor for 0) from
// torch's caching allocator on the current device. The tensor is freed when
// the caller drops it: the caching allocator keeps the memory for the stream's
// later work, and a stream other than the device's current one is recorded so
// the memory is not handed out again before that stream's work is done.
at::Tensor allocate_workspace(size_t bytes, void* stream);

// `stream`, or the current device's current stream when it is null.
void* stream_or_current(void* stream);

// Whether to read device-side values (cu_seqlens, cache_seqlens, block_table) on
// the host and check them before the launch: strict mode (the option, else
// strict_checks()), and `like`'s stream not being captured into a CUDA graph.
bool host_value_checks(const std::optional<bool>& option, const at::Tensor& like);

// The current device's DeviceErrorLog for a launch (made at the first one), after
// raising what an earlier launch recorded in it.
DeviceErrorLog* device_error_log_for_launch();

// Enqueues the offsets guard (src/kernels/sm80/varlen_offsets_guard/) on
// params.stream: checks params.cu_seqlens_q/k on the device, writes the copy
// the kernel is to read into `guarded` (2 x (batch + 1) ints) and points
// params.cu_seqlens_q/k at it. In flashlab_kernels_sm80.
void launch_varlen_offsets_guard(AttentionParams& params, int* guarded);

// The launch set-up a forward, backward or KV-cache launch shares: params.stream
// set to the current stream when null, params.error_log to the device's log
// (raising what an earlier launch left there), then, when the kernel has a workspace
// hook (`workspace_bytes`, nullptr: none), params.workspace_bytes from it and
// params.workspace allocated (allocate_workspace); for a variable-length batch
// the same allocation also holds the guarded copy of the offsets, which the
// offsets guard writes before the kernel reads it. The returned tensor holds
// the workspace: keep it until the launch returns.
template <class Params, class WorkspaceBytes>
[[nodiscard]] at::Tensor prepare_launch(Params& params, WorkspaceBytes workspace_bytes) {
  params.stream = stream_or_current(params.stream);
  params.error_log = device_error_log_for_launch();
  params.workspace_bytes = workspace_bytes != nullptr ? workspace_bytes(params) : 0;
  const size_t kernel_bytes = (params.workspace_bytes + 255) / 256 * 256;
  const size_t guard_bytes = params.is_varlen() ? 2 * (static_cast<size_t>(params.batch) + 1) * sizeof(int) : 0;
  at::Tensor workspace = allocate_workspace(kernel_bytes + guard_bytes, params.stream);
  char* base = workspace.defined() ? static_cast<char*>(workspace.data_ptr()) : nullptr;
  params.workspace = params.workspace_bytes > 0 ? base : nullptr;
  if (guard_bytes > 0) launch_varlen_offsets_guard(params, reinterpret_cast<int*>(base + kernel_bytes));
  return workspace;
}

}  // namespace flashlab::detail
