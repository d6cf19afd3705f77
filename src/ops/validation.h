// Internal to the op library (not installed): the input checks and launch
// helpers the forward (attention.cpp) and the backward (attention_backward.cpp)
// share, so both say the same thing about the same mistake. Every check throws
// c10::Error with a message naming what was given and what is expected, and
// none touches the device: structure is checked before the device, so each
// message can be provoked on CPU tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
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

// out like q (dtype, shape, contiguous last dimension); lse a contiguous
// float32 tensor of lse_shape, which lse_layout names for the message; both on
// q's device.
void check_output_buffers(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<int64_t>& lse_shape, const char* lse_layout);

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
// the cu_seqlens tensors (int32, 1-D, one length, on q's device) and their
// values (read on the host: prefix sums from 0 to the token counts, every
// length within max_seqlen_q/k).
void check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                         int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options);

// 90 for an sm_90 tensor's device; 0 for a tensor that is not on a CUDA device.
int device_compute_capability(const at::Tensor& q);

// A kernel's device workspace of `bytes` bytes (undefined tensor for 0) from
// torch's caching allocator on the current device. The tensor is freed when
// the caller drops it: the caching allocator keeps the memory for the stream's
// later work, and a stream other than the device's current one is recorded so
// the memory is not handed out again before that stream's work is done.
at::Tensor allocate_workspace(size_t bytes, void* stream);

}  // namespace flashlab::detail
