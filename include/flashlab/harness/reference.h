// Reference attention in plain torch ops (matmul, masked softmax, matmul) with
// explicit bottom-right masking, computed in a chosen precision.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace flashlab {

// Score modifications (issue 33), flash-attn's definitions, applied in this
// order to the scaled score s = q . k * softmax_scale of row i, key j:
//   softcap > 0:   s -> softcap * tanh(s / softcap)
//   alibi_slopes:  s -> s - slope * |i + seqlen_k - seqlen_q - j|   (slope of the
//                  head, or of the batch entry and head)
//   the mask (invisible keys -inf), then the softmax, where sinks adds one
//   logit per head to every row's denominator (the LSE includes it; no value
//   goes with it, so a row that sees no key has output 0 and LSE = the sink).
struct ScoreModification {
  double softcap = 0.0;     // 0: off
  at::Tensor alibi_slopes;  // (heads) or (batch, heads), float32; undefined: off
  at::Tensor sinks;         // (heads), float32; undefined: off
  bool any() const { return softcap != 0.0 || alibi_slopes.defined() || sinks.defined(); }
};

struct ReferenceOptions {
  double softmax_scale = 1.0;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // 0 for causal
  at::ScalarType compute_dtype = at::kFloat;
  ScoreModification modification;
  // With sinks, reference_attention_backward also reports how much storing the
  // output in this dtype moves dsinks (ReferenceGradients::dsinks_stored_output_shift).
  std::optional<at::ScalarType> stored_output_dtype;
};

struct ReferenceOutput {
  at::Tensor out;  // (batch, seqlen_q, heads, head_dim), compute dtype
  at::Tensor lse;  // (batch, heads, seqlen_q), compute dtype; -inf for rows that see no key
};

// q: (B, Sq, H, D); k, v: (B, Sk, Hkv, D), any dtype and device. Inputs are cast
// to compute_dtype first. Fully masked rows give output 0 and LSE -inf.
ReferenceOutput reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const ReferenceOptions& options);

struct ReferenceGradients {
  at::Tensor dq, dk, dv;  // shapes of q, k, v; compute dtype
  at::Tensor dsinks;      // (heads), compute dtype, when options.modification.sinks is defined
  // With sinks and options.stored_output_dtype: dsinks' formula -sum over rows of
  // exp(sink - LSE) * rowsum(dout * out) with out rounded to that dtype, minus the
  // same with the exact out (heads). The kernels form D from the stored output;
  // torch's autograd never rounds it, so its same-precision error leaves this out.
  at::Tensor dsinks_stored_output_shift;
};

// dL/dq, dL/dk, dL/dv of reference_attention's output for the upstream gradient
// dout (shape of q), by torch autograd in compute_dtype. GQA: dk and dv sum
// over each kv head's query heads. Rows that see no key have gradient 0, never
// NaN. The backward pass's reference (flash-attn's tests hold gradients to 3x
// the error of torch's same-precision path against it).
ReferenceGradients reference_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& dout,
                                                const ReferenceOptions& options);

// Variable-length batch (packed tokens, see attention_varlen_forward): calls
// reference_attention once per sequence. q: (total_q, H, D); k, v: (total_k,
// Hkv, D); cu_seqlens_q/k: int32 prefix sums of length batch + 1 on any device.
// Returns out (total_q, H, D) and lse (H, total_q), compute dtype. A query
// sequence whose key sequence is empty gives output 0 and LSE -inf.
ReferenceOutput reference_attention_varlen(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                           const at::Tensor& cu_seqlens_k,
                                           const ReferenceOptions& options);

// A fixed-length attention function over a variable-length batch: attend(sequence,
// q_start, seqlen_q, k_start, seqlen_k) returns one sequence's result, out (1,
// seqlen_q, H, D) and lse (1, H, seqlen_q), for each sequence with queries and
// keys; they are packed into out (total_q, H, D) of out_options, 0 elsewhere, and
// lse (H, total_q) of lse_options, -inf elsewhere (or initial_lse (H, total_q)
// where defined). reference_attention_varlen and the FP8 path's packed form use it.
using SequenceAttention =
    std::function<ReferenceOutput(int64_t sequence, int64_t q_start, int64_t seqlen_q, int64_t k_start,
                                  int64_t seqlen_k)>;
ReferenceOutput packed_attention(const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                 at::IntArrayRef out_shape, const at::TensorOptions& out_options,
                                 const at::TensorOptions& lse_options, const at::Tensor& initial_lse,
                                 const SequenceAttention& attend);

// reference_attention_backward for a variable-length batch, one sequence at a
// time: q, dout (total_q, H, D); k, v (total_k, Hkv, D). Rows of a query
// sequence whose key sequence is empty, and keys of a sequence without
// queries, have gradient 0.
ReferenceGradients reference_attention_varlen_backward(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, const at::Tensor& dout,
                                                       const at::Tensor& cu_seqlens_q,
                                                       const at::Tensor& cu_seqlens_k,
                                                       const ReferenceOptions& options);

// (Sq, Sk) boolean: true where key j is visible from query i.
at::Tensor visibility_mask(int64_t seqlen_q, int64_t seqlen_k, int window_left, int window_right,
                           at::Device device);

}  // namespace flashlab
