#include "flashlab/reference.h"

#include <ATen/ATen.h>

namespace flashlab {

at::Tensor visibility_mask(int64_t seqlen_q, int64_t seqlen_k, int window_left, int window_right,
                           at::Device device) {
  const auto index_options = at::TensorOptions().dtype(at::kLong).device(device);
  // Bottom-right alignment: query i lines up with key i + seqlen_k - seqlen_q.
  const at::Tensor diagonal =
      at::arange(seqlen_q, index_options).unsqueeze(1) + (seqlen_k - seqlen_q);
  const at::Tensor key = at::arange(seqlen_k, index_options).unsqueeze(0);
  at::Tensor visible = at::ones({seqlen_q, seqlen_k}, index_options.dtype(at::kBool));
  if (window_left >= 0) visible = visible & (key >= diagonal - window_left);
  if (window_right >= 0) visible = visible & (key <= diagonal + window_right);
  return visible;
}

ReferenceOutput reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const ReferenceOptions& options) {
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  const int64_t seqlen_q = q.size(1), seqlen_k = k.size(1);
  // (B, S, H, D) -> (B, H, S, D); GQA: each kv head serves heads / kv_heads query heads.
  const at::Tensor query = q.to(options.compute_dtype).transpose(1, 2);
  at::Tensor key = k.to(options.compute_dtype).transpose(1, 2);
  at::Tensor value = v.to(options.compute_dtype).transpose(1, 2);
  if (kv_heads != heads) {
    key = key.repeat_interleave(heads / kv_heads, 1);
    value = value.repeat_interleave(heads / kv_heads, 1);
  }
  at::Tensor scores = at::matmul(query, key.transpose(-2, -1)) * options.softmax_scale;
  const at::Tensor visible = visibility_mask(seqlen_q, seqlen_k, options.window_left,
                                             options.window_right, q.device());
  scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  const at::Tensor lse = at::logsumexp(scores, -1, /*keepdim=*/true);
  // exp(-inf - (-inf)) is NaN: rows that see no key get probability 0 instead.
  at::Tensor probabilities = at::exp(scores - lse);
  probabilities = at::where(at::isfinite(lse), probabilities, at::zeros_like(probabilities));
  const at::Tensor out = at::matmul(probabilities, value);
  return {out.transpose(1, 2).contiguous(), lse.squeeze(-1).contiguous()};
}

}  // namespace flashlab
