#include "flashlab/harness/fp8.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <iomanip>
#include <limits>
#include <random>
#include <sstream>

#include "flashlab/cuda_check.h"
#include "json_text.h"

namespace flashlab {
namespace {

constexpr double kE4m3Max = 448.0;  // e4m3's largest finite value
constexpr double kPScale = 256.0;   // the kernel's P x 2^kFp8PExponent before rounding to e4m3

// The sequences' lengths of packed rows (cu_seqlens on the host, int64).
at::Tensor sequence_lengths(const at::Tensor& cu_seqlens) {
  const at::Tensor offsets = cu_seqlens.to(at::kCPU, at::kLong);
  return offsets.narrow(0, 1, offsets.size(0) - 1) - offsets.narrow(0, 0, offsets.size(0) - 1);
}

// x's (batch, kv_heads) float32 factors, each query head its kv head's, in `dtype`,
// shaped to multiply x's values: (batch, 1, heads, 1), or (total, heads, 1) packed.
at::Tensor per_head_factors(const at::Tensor& descale, const at::Tensor& cu_seqlens, int64_t heads,
                            int64_t rows, at::ScalarType dtype) {
  const at::Tensor per_head = descale.to(dtype).repeat_interleave(heads / descale.size(1), 1);
  if (!cu_seqlens.defined()) return per_head.unsqueeze(1).unsqueeze(-1);
  const at::Tensor lengths = sequence_lengths(cu_seqlens);
  const int64_t covered = lengths.sum().item<int64_t>();
  TORCH_CHECK(covered == rows, "packed e4m3 values have ", rows, " rows; cu_seqlens covers ", covered);
  return per_head.repeat_interleave(lengths.to(per_head.device()), 0, rows).unsqueeze(-1);
}

// A (rows, D) e4m3 matrix with its rows padded by zeros to a multiple of 16 (_scaled_mm's rule).
at::Tensor rows_padded_to_16(const at::Tensor& x) {
  const int64_t rows = x.size(0), padded = (rows + 15) / 16 * 16;
  at::Tensor out = at::zeros({padded, x.size(1)}, x.options().dtype(at::kFloat)).to(at::kFloat8_e4m3fn);
  out.narrow(0, 0, rows).copy_(x);
  return out;
}

bool has_fp8_tensor_cores(const at::Tensor& x) {
  if (!x.is_cuda()) return false;
  int major = 0, minor = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, x.device().index()));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, x.device().index()));
  return major * 10 + minor >= 89;
}

// q8 k8^T x the descales, float64 (batch, heads, seqlen_q, seqlen_k).
at::Tensor fp8_products(const Fp8Tensor& q, const Fp8Tensor& k) {
  const int64_t batch = q.values.size(0), seqlen_q = q.values.size(1), heads = q.values.size(2);
  const int64_t head_dim = q.values.size(3), seqlen_k = k.values.size(1), kv_heads = k.values.size(2);
  const int64_t group = heads / kv_heads;
  if (!has_fp8_tensor_cores(q.values) || head_dim % 16 != 0) {
    const at::Tensor qd = dequantize_e4m3(q, at::kDouble);
    const at::Tensor kd = dequantize_e4m3(k, at::kDouble).repeat_interleave(group, 2);
    return at::einsum("bqhd,bkhd->bhqk", {qd, kd});
  }
  const at::Tensor one = at::ones({}, q.descale.options());
  const at::Tensor factors = (q.descale.to(at::kDouble) * k.descale.to(at::kDouble)).cpu();
  at::Tensor products = at::empty({batch, heads, seqlen_q, seqlen_k}, q.values.options().dtype(at::kDouble));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t kv_head = 0; kv_head < kv_heads; ++kv_head) {
      const at::Tensor keys = rows_padded_to_16(k.values[b].select(1, kv_head));
      for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h) {
        const at::Tensor scores = at::_scaled_mm(rows_padded_to_16(q.values[b].select(1, h)), keys.t(), one, one,
                                                 std::nullopt, std::nullopt, at::kFloat, /*use_fast_accum=*/true);
        products[b][h].copy_(scores.narrow(0, 0, seqlen_q).narrow(1, 0, seqlen_k).to(at::kDouble) *
                             factors[b][kv_head].item<double>());
      }
    }
  return products;
}

}  // namespace

const char* fp8_scaling_name(Fp8Scaling scaling) {
  switch (scaling) {
    case Fp8Scaling::per_head: return "per-head";
    case Fp8Scaling::per_tensor: return "per-tensor";
    case Fp8Scaling::none: return "none";
  }
  return "?";
}

Fp8Tensor Fp8Tensor::sequence(int64_t index, int64_t start, int64_t length) const {
  return {values.narrow(0, start, length).unsqueeze(0), descale.narrow(0, index, 1), at::Tensor()};
}

Fp8Tensor quantize_e4m3(const at::Tensor& x, int64_t kv_heads, Fp8Scaling scaling, const at::Tensor& cu_seqlens) {
  const bool packed = cu_seqlens.defined();
  const int64_t head_axis = packed ? 1 : 2;
  TORCH_CHECK(x.dim() == (packed ? 3 : 4) && kv_heads > 0 && x.size(head_axis) % kv_heads == 0,
              "quantize_e4m3: x must be ", packed ? "(total, heads, head_dim) with cu_seqlens" : "(batch, seqlen, heads, head_dim)",
              " with heads a multiple of kv_heads ", kv_heads, "; got shape ", x.sizes());
  const int64_t heads = x.size(head_axis), head_dim = x.size(-1);
  const int64_t batch = packed ? cu_seqlens.size(0) - 1 : x.size(0);
  const auto float32 = x.options().dtype(at::kFloat);
  const at::Tensor values = x.to(at::kFloat);
  // The largest |value| of each kv head's query heads over rows (batch, rows, heads, head_dim).
  const auto head_amax = [&](const at::Tensor& rows) {
    return rows.abs().reshape({rows.size(0), rows.size(1), kv_heads, heads / kv_heads, head_dim}).amax({1, 3, 4});
  };
  at::Tensor descale;
  switch (scaling) {
    case Fp8Scaling::per_head:
      if (packed) {  // a row a sequence; an empty one keeps 448 (factor 1 below: nothing to scale)
        descale = at::full({batch, kv_heads}, kE4m3Max, float32);
        const at::Tensor lengths = sequence_lengths(cu_seqlens);
        int64_t start = 0;
        for (int64_t b = 0; b < batch; ++b) {
          const int64_t length = lengths[b].item<int64_t>();
          if (length > 0) descale[b].copy_(head_amax(values.narrow(0, start, length).unsqueeze(0))[0]);
          start += length;
        }
      } else {
        descale = head_amax(values);
      }
      descale = descale.clamp_min(std::numeric_limits<float>::min()) / kE4m3Max;
      break;
    case Fp8Scaling::per_tensor:
      descale = (values.abs().amax().clamp_min(std::numeric_limits<float>::min()) / kE4m3Max).expand({batch, kv_heads});
      break;
    case Fp8Scaling::none: descale = at::ones({batch, kv_heads}, float32); break;
  }
  descale = descale.to(at::kFloat).contiguous();
  const at::Tensor scaled = values / per_head_factors(descale, cu_seqlens, heads, x.size(0), at::kFloat);
  return {scaled.clamp(-kE4m3Max, kE4m3Max).to(at::kFloat8_e4m3fn).contiguous(), descale, cu_seqlens};
}

at::Tensor random_hadamard(int64_t head_dim, uint64_t seed, at::Device device) {
  TORCH_CHECK(head_dim > 0 && (head_dim & (head_dim - 1)) == 0,
              "random_hadamard: head_dim must be a power of two; got ", head_dim);
  std::mt19937_64 signs(seed ^ 0x48414441u);
  std::vector<float> entries(static_cast<size_t>(head_dim * head_dim));
  std::vector<float> column_sign(static_cast<size_t>(head_dim));
  for (float& sign : column_sign) sign = (signs() & 1) ? -1.0f : 1.0f;
  const float norm = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t row = 0; row < head_dim; ++row)
    for (int64_t col = 0; col < head_dim; ++col)  // Sylvester: (-1)^popcount(row & col)
      entries[row * head_dim + col] =
          ((std::popcount(static_cast<uint64_t>(row & col)) & 1) ? -norm : norm) * column_sign[col];
  return at::tensor(entries, at::kFloat).view({head_dim, head_dim}).to(device);
}

at::Tensor dequantize_e4m3(const Fp8Tensor& x, at::ScalarType dtype) {
  return x.values.to(dtype) *
         per_head_factors(x.descale, x.cu_seqlens, x.values.size(x.packed() ? 1 : 2), x.values.size(0), dtype);
}

ReferenceOutput fp8_path_attention(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v,
                                   const ReferenceOptions& options, at::ScalarType output_dtype) {
  if (q.packed()) {
    TORCH_CHECK(k.packed() && v.packed(), "fp8_path_attention: q is packed (cu_seqlens), so k and v must be too");
    return packed_attention(
        q.cu_seqlens, k.cu_seqlens, q.values.sizes(), q.values.options().dtype(output_dtype),
        q.values.options().dtype(at::kDouble), at::Tensor(),
        [&](int64_t sequence, int64_t q_start, int64_t seqlen_q, int64_t k_start, int64_t seqlen_k) {
          return fp8_path_attention(q.sequence(sequence, q_start, seqlen_q), k.sequence(sequence, k_start, seqlen_k),
                                    v.sequence(sequence, k_start, seqlen_k), options, output_dtype);
        });
  }
  const int64_t seqlen_q = q.values.size(1), heads = q.values.size(2), seqlen_k = k.values.size(1);
  const at::Tensor values = dequantize_e4m3(v, at::kDouble).repeat_interleave(heads / v.values.size(2), 2);
  const at::Tensor visible = visibility_mask(seqlen_q, seqlen_k, options.window_left, options.window_right,
                                             q.values.device());
  const at::Tensor scores = (fp8_products(q, k) * options.softmax_scale)
                                .masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor row_max = std::get<0>(scores.max(-1, /*keepdim=*/true));
  row_max = at::where(at::isfinite(row_max), row_max, at::zeros_like(row_max));
  const at::Tensor p = at::exp(scores - row_max);
  const at::Tensor p_rounded = (p * kPScale).to(at::kFloat8_e4m3fn).to(at::kDouble);
  const at::Tensor out = at::einsum("bhqk,bkhd->bqhd", {p_rounded, values});
  const at::Tensor row_sum = p.sum(-1, /*keepdim=*/true);                  // (B, H, Sq, 1)
  const at::Tensor denominator = (row_sum * kPScale).transpose(1, 2);      // (B, Sq, H, 1)
  return {at::where(denominator > 0, out / denominator.clamp_min(1e-300), at::zeros_like(out)).to(output_dtype),
          (row_max + at::log(row_sum)).squeeze(-1)};  // log 0 = -inf for rows that see no key
}

ErrorSummary error_summary(const at::Tensor& actual, const at::Tensor& expected) {
  const at::Tensor want = expected.to(at::kDouble), got = actual.to(want.device(), at::kDouble);
  const at::Tensor finite = at::isfinite(want);
  const at::Tensor difference = (got - want).abs().masked_select(finite);
  ErrorSummary summary;
  if (difference.numel() == 0) return summary;
  if (!at::isfinite(difference).all().item<bool>()) {
    summary.rmse = summary.max_abs = std::numeric_limits<double>::infinity();
    return summary;
  }
  summary.rmse = difference.square().mean().sqrt().item<double>();
  summary.max_abs = difference.max().item<double>();
  return summary;
}

std::string Fp8Accuracy::format() const {
  std::ostringstream text;
  text << std::setprecision(4) << "FP8 accuracy: out against float32 attention of the values before quantization"
       << (outliers ? " (with outlier channels)" : "") << ", the kernel run once per scaling\n"
       << "  descale                 RMSE          max |error|\n";
  for (size_t index = 0; index < rows.size(); ++index) {
    const Fp8AccuracyRow& row = rows[index];
    const std::string name = std::string(fp8_scaling_name(row.scaling)) + (row.hadamard ? " + Hadamard" : "");
    text << "  " << std::left << std::setw(22) << name << "  " << std::setw(12)
         << row.error.rmse << "  " << std::setw(12) << row.error.max_abs << std::right;
    if (index == 0) text << "  (this problem's)";
    else if (rows[0].error.rmse > 0) text << "  RMSE " << row.error.rmse / rows[0].error.rmse << "x the first row's";
    text << "\n";
  }
  return text.str();
}

std::string Fp8Accuracy::to_json() const {
  std::ostringstream text;
  text << "{\"outliers\": " << (outliers ? "true" : "false") << ", \"rows\": [";
  for (size_t index = 0; index < rows.size(); ++index)
    text << (index ? ", " : "") << "{\"descale\": " << json::string(fp8_scaling_name(rows[index].scaling))
         << ", \"hadamard\": " << (rows[index].hadamard ? "true" : "false")
         << ", \"rmse\": " << json::number(rows[index].error.rmse)
         << ", \"max_abs_err\": " << json::number(rows[index].error.max_abs) << "}";
  text << "]}";
  return text.str();
}

}  // namespace flashlab
