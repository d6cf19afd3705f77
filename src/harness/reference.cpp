#include "flashlab/harness/reference.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <vector>

#include "common/visible_keys.h"

namespace flashlab {

at::Tensor visibility_mask(int64_t seqlen_q, int64_t seqlen_k, int window_left, int window_right,
                           at::Device device) {
  // Each row's interval from the kernels' own rule (src/kernels/common/visible_keys.h),
  // then the mask from the intervals.
  std::vector<int64_t> first(seqlen_q), last(seqlen_q);
  for (int64_t row = 0; row < seqlen_q; ++row) {
    const KeyRange keys = visible_keys(static_cast<int>(row), static_cast<int>(seqlen_q),
                                       static_cast<int>(seqlen_k), window_left, window_right);
    first[row] = keys.first;
    last[row] = keys.last;
  }
  const auto index_options = at::TensorOptions().dtype(at::kLong);
  const at::Tensor key = at::arange(seqlen_k, index_options.device(device)).unsqueeze(0);
  const at::Tensor first_key = at::tensor(first, index_options).to(device).unsqueeze(1);
  const at::Tensor last_key = at::tensor(last, index_options).to(device).unsqueeze(1);
  return (key >= first_key) & (key <= last_key);
}

namespace {

// Softcap and the ALiBi bias on (B, H, Sq, Sk) scaled scores (ScoreModification).
at::Tensor modified_scores(at::Tensor scores, const ReferenceOptions& options) {
  const ScoreModification& modification = options.modification;
  if (modification.softcap != 0.0)
    scores = at::tanh(scores / modification.softcap) * modification.softcap;
  if (modification.alibi_slopes.defined()) {
    const int64_t batch = scores.size(0), heads = scores.size(1);
    const int64_t seqlen_q = scores.size(2), seqlen_k = scores.size(3);
    const at::Tensor& slopes = modification.alibi_slopes;
    TORCH_CHECK((slopes.dim() == 1 && slopes.size(0) == heads) ||
                    (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == heads),
                "alibi_slopes must be (heads) or (batch, heads) = (", heads, ") or (", batch, ", ", heads,
                "); got ", slopes.sizes());
    const auto index = at::TensorOptions().dtype(scores.scalar_type()).device(scores.device());
    const at::Tensor row = at::arange(seqlen_q, index).view({seqlen_q, 1});
    const at::Tensor key = at::arange(seqlen_k, index).view({1, seqlen_k});
    const at::Tensor distance = at::abs(row + static_cast<double>(seqlen_k - seqlen_q) - key);  // (Sq, Sk)
    const at::Tensor slope = slopes.to(scores.device(), scores.scalar_type())
                                 .view({slopes.dim() == 2 ? batch : 1, heads, 1, 1});
    scores = scores - slope * distance;
  }
  return scores;
}

// (B, H, Sq, Sk) scaled scores with invisible keys at -inf, and V as (B, H, Sk, D)
// (GQA: each kv head serves heads / kv_heads query heads), from inputs already
// in the compute dtype.
struct MaskedScores {
  at::Tensor scores, value;
};
MaskedScores masked_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const ReferenceOptions& options) {
  const int64_t heads = q.size(2), kv_heads = k.size(2);
  const int64_t seqlen_q = q.size(1), seqlen_k = k.size(1);
  // (B, S, H, D) -> (B, H, S, D)
  const at::Tensor query = q.transpose(1, 2);
  at::Tensor key = k.transpose(1, 2);
  at::Tensor value = v.transpose(1, 2);
  if (kv_heads != heads) {
    key = key.repeat_interleave(heads / kv_heads, 1);
    value = value.repeat_interleave(heads / kv_heads, 1);
  }
  at::Tensor scores = at::matmul(query, key.transpose(-2, -1)) * options.softmax_scale;
  scores = modified_scores(scores, options);
  const at::Tensor visible = visibility_mask(seqlen_q, seqlen_k, options.window_left,
                                             options.window_right, q.device());
  scores = scores.masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  return {scores, value};
}

// The sink logits as a (1 or B, H, Sq, 1) column of the scores' dtype, from
// sinks (H) (a leaf of the backward's graph when it has one).
at::Tensor sink_column(const at::Tensor& sinks, const at::Tensor& scores) {
  return sinks.to(scores.device(), scores.scalar_type()).view({1, -1, 1, 1}).expand({scores.size(0), scores.size(1), scores.size(2), 1});
}

}  // namespace

ReferenceOutput reference_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const ReferenceOptions& options) {
  const auto [scores, value] =
      masked_scores(q.to(options.compute_dtype), k.to(options.compute_dtype),
                    v.to(options.compute_dtype), options);
  const at::Tensor& sinks = options.modification.sinks;
  // With sinks, the sink's logit joins every row's denominator (and LSE).
  const at::Tensor lse = at::logsumexp(sinks.defined() ? at::cat({scores, sink_column(sinks, scores)}, -1) : scores,
                                       -1, /*keepdim=*/true);
  // exp(-inf - (-inf)) is NaN: rows that see no key get probability 0 instead.
  at::Tensor probabilities = at::exp(scores - lse);
  probabilities = at::where(at::isfinite(lse), probabilities, at::zeros_like(probabilities));
  const at::Tensor out = at::matmul(probabilities, value);
  return {out.transpose(1, 2).contiguous(), lse.squeeze(-1).contiguous()};
}

ReferenceGradients reference_attention_backward(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& dout,
                                                const ReferenceOptions& options) {
  const auto leaf = [&](const at::Tensor& tensor) {
    return tensor.detach().to(options.compute_dtype).requires_grad_(true);
  };
  const at::Tensor query = leaf(q), key = leaf(k), value_input = leaf(v);
  const bool has_sinks = options.modification.sinks.defined();
  const at::Tensor sinks = has_sinks ? leaf(options.modification.sinks) : at::Tensor();
  at::Tensor out, sink_share;  // sink_share: exp(sink - LSE), (B, H, Sq, 1), with sinks
  {
    const c10::AutoGradMode enable_grad(true);
    const auto [scores, value] = masked_scores(query, key, value_input, options);
    // A row that sees no key would make softmax (and its gradient) NaN: give it
    // zero scores, then zero its probabilities. Both masks are constants, so
    // the gradient of such a row is exactly 0. With sinks every row has a
    // finite logit (the sink's): the softmax runs over the keys and the sink,
    // and the sink's column is dropped (it carries no value).
    at::Tensor probabilities;
    if (has_sinks) {
      const int64_t keys = scores.size(-1);
      const at::Tensor with_sink = at::softmax(at::cat({scores, sink_column(sinks, scores)}, -1), -1);
      probabilities = with_sink.narrow(-1, 0, keys);
      sink_share = with_sink.narrow(-1, keys, 1).detach();
    } else {
      const at::Tensor sees_a_key = at::isfinite(scores).any(-1, /*keepdim=*/true);
      const at::Tensor safe_scores = at::where(sees_a_key, scores, at::zeros_like(scores));
      probabilities = at::softmax(safe_scores, -1) * sees_a_key.to(scores.scalar_type());
    }
    out = at::matmul(probabilities, value).transpose(1, 2);
  }
  std::vector<at::Tensor> inputs = {query, key, value_input};
  if (has_sinks) inputs.push_back(sinks);
  const at::Tensor upstream = dout.detach().to(options.compute_dtype);
  const auto gradients = torch::autograd::grad({out}, inputs, {upstream});
  ReferenceGradients result{gradients[0], gradients[1], gradients[2], has_sinks ? gradients[3] : at::Tensor()};
  if (has_sinks && options.stored_output_dtype) {
    // The change in each row's D = rowsum(dout * out) when out is stored, then
    // dsinks' sum of -exp(sink - LSE) D over the rows (the rounding's
    // difference is exact in the compute dtype).
    const at::Tensor exact = out.detach();
    const at::Tensor stored = exact.to(*options.stored_output_dtype).to(exact.scalar_type());
    const at::Tensor d_shift = (upstream * (stored - exact)).sum(-1).transpose(1, 2).unsqueeze(-1);
    result.dsinks_stored_output_shift = -(sink_share * d_shift).sum(at::IntArrayRef{0, 2, 3});
  }
  return result;
}

namespace {

// Sequence `sequence`'s options: ALiBi slopes of shape (batch, heads) become
// that sequence's row.
ReferenceOptions sequence_options(const ReferenceOptions& options, int64_t sequence) {
  ReferenceOptions one = options;
  const at::Tensor& slopes = options.modification.alibi_slopes;
  if (slopes.defined() && slopes.dim() == 2) one.modification.alibi_slopes = slopes[sequence];
  return one;
}

// Calls visit(sequence, q_start, seqlen_q, k_start, seqlen_k) for every
// sequence of a variable-length batch that has both queries and keys.
template <class Visit>
void for_each_sequence(const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                       const Visit& visit) {
  TORCH_CHECK(cu_seqlens_q.dim() == 1 && cu_seqlens_q.sizes() == cu_seqlens_k.sizes(),
              "cu_seqlens_q and cu_seqlens_k must be 1-D of one length; got ", cu_seqlens_q.sizes(),
              " and ", cu_seqlens_k.sizes());
  const at::Tensor offsets_q = cu_seqlens_q.to(at::kCPU, at::kLong);
  const at::Tensor offsets_k = cu_seqlens_k.to(at::kCPU, at::kLong);
  const auto* starts_q = offsets_q.data_ptr<int64_t>();
  const auto* starts_k = offsets_k.data_ptr<int64_t>();
  for (int64_t sequence = 0; sequence + 1 < offsets_q.size(0); ++sequence) {
    const int64_t q_start = starts_q[sequence], seqlen_q = starts_q[sequence + 1] - q_start;
    const int64_t k_start = starts_k[sequence], seqlen_k = starts_k[sequence + 1] - k_start;
    if (seqlen_q == 0 || seqlen_k == 0) continue;
    visit(sequence, q_start, seqlen_q, k_start, seqlen_k);
  }
}

}  // namespace

ReferenceOutput packed_attention(const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                 at::IntArrayRef out_shape, const at::TensorOptions& out_options,
                                 const at::TensorOptions& lse_options, const at::Tensor& initial_lse,
                                 const SequenceAttention& attend) {
  const int64_t heads = out_shape[1], total_q = out_shape[0];
  at::Tensor out = at::zeros(out_shape, out_options);
  at::Tensor lse = initial_lse.defined()
                       ? initial_lse.to(lse_options).contiguous()
                       : at::full({heads, total_q}, -std::numeric_limits<double>::infinity(), lse_options);
  for_each_sequence(cu_seqlens_q, cu_seqlens_k,
                    [&](int64_t sequence, int64_t q_start, int64_t seqlen_q, int64_t k_start, int64_t seqlen_k) {
                      const ReferenceOutput one = attend(sequence, q_start, seqlen_q, k_start, seqlen_k);
                      out.narrow(0, q_start, seqlen_q).copy_(one.out.squeeze(0));
                      lse.narrow(1, q_start, seqlen_q).copy_(one.lse.squeeze(0));
                    });
  return {out, lse};
}

ReferenceOutput reference_attention_varlen(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                           const at::Tensor& cu_seqlens_k,
                                           const ReferenceOptions& options) {
  const int64_t heads = q.size(1), total_q = q.size(0);
  const auto options_out = q.options().dtype(options.compute_dtype);
  // Rows of empty query sequences do not exist; rows whose key sequence is
  // empty see no key, so the initial 0 / -inf (with sinks: the sink, the
  // denominator's only term) are their final values.
  const at::Tensor& sinks = options.modification.sinks;
  const at::Tensor initial_lse =
      sinks.defined() ? sinks.to(q.device(), options.compute_dtype).view({heads, 1}).expand({heads, total_q})
                      : at::Tensor();
  return packed_attention(cu_seqlens_q, cu_seqlens_k, q.sizes(), options_out, options_out, initial_lse,
                          [&](int64_t sequence, int64_t q_start, int64_t seqlen_q, int64_t k_start, int64_t seqlen_k) {
                            return reference_attention(q.narrow(0, q_start, seqlen_q).unsqueeze(0),
                                                       k.narrow(0, k_start, seqlen_k).unsqueeze(0),
                                                       v.narrow(0, k_start, seqlen_k).unsqueeze(0),
                                                       sequence_options(options, sequence));
                          });
}

ReferenceGradients reference_attention_varlen_backward(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& v, const at::Tensor& dout,
                                                       const at::Tensor& cu_seqlens_q,
                                                       const at::Tensor& cu_seqlens_k,
                                                       const ReferenceOptions& options) {
  // Rows and keys of sequences that lack queries or keys keep gradient 0.
  const auto zeros_like_in = [&](const at::Tensor& tensor) {
    return at::zeros(tensor.sizes(), tensor.options().dtype(options.compute_dtype));
  };
  ReferenceGradients gradients{zeros_like_in(q), zeros_like_in(k), zeros_like_in(v)};
  const bool has_sinks = options.modification.sinks.defined();
  if (has_sinks) gradients.dsinks = zeros_like_in(options.modification.sinks);
  if (has_sinks && options.stored_output_dtype)
    gradients.dsinks_stored_output_shift = zeros_like_in(options.modification.sinks);
  for_each_sequence(
      cu_seqlens_q, cu_seqlens_k,
      [&](int64_t sequence, int64_t q_start, int64_t seqlen_q, int64_t k_start, int64_t seqlen_k) {
        const auto rows = [](const at::Tensor& tensor, int64_t start, int64_t length) {
          return tensor.narrow(0, start, length).unsqueeze(0);
        };
        const ReferenceGradients one = reference_attention_backward(
            rows(q, q_start, seqlen_q), rows(k, k_start, seqlen_k), rows(v, k_start, seqlen_k),
            rows(dout, q_start, seqlen_q), sequence_options(options, sequence));
        if (one.dsinks.defined()) gradients.dsinks += one.dsinks;
        if (one.dsinks_stored_output_shift.defined())
          gradients.dsinks_stored_output_shift += one.dsinks_stored_output_shift.to(
              gradients.dsinks_stored_output_shift.device(), options.compute_dtype);
        gradients.dq.narrow(0, q_start, seqlen_q).copy_(one.dq.squeeze(0));
        gradients.dk.narrow(0, k_start, seqlen_k).copy_(one.dk.squeeze(0));
        gradients.dv.narrow(0, k_start, seqlen_k).copy_(one.dv.squeeze(0));
      });
  return gradients;
}

}  // namespace flashlab
