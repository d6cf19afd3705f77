// FP8 (e4m3) problems in the harness (issue 36): how a ProblemSpec of dtype
// Float8_e4m3fn turns its float32 draws into e4m3 values with descale factors,
// the FP8 path's own arithmetic that the pass rule holds the kernel to (the
// "same precision" path of the 16-bit rule), and the accuracy report against
// attention of the values before quantization.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "flashlab/harness/reference.h"

namespace flashlab {

// How the float32 values become e4m3 (flashlab-run --descale):
//   per_head    one factor per (batch, kv head), amax / 448 (FA3's q/k/v_descale
//               shape; a query head shares its kv head's factor; flashlab.fp8.quantize)
//   per_tensor  one factor for the whole tensor, amax / 448
//   none        a plain cast: factor 1, values past +-448 saturate, small ones
//               lose their bits (the "naive cast" the descales are measured against)
enum class Fp8Scaling { per_head, per_tensor, none };
const char* fp8_scaling_name(Fp8Scaling scaling);

struct Fp8Tensor {
  at::Tensor values;      // e4m3, contiguous, the shape of the input
  at::Tensor descale;     // float32 (batch, kv_heads), contiguous: a row a batch entry or sequence
  at::Tensor cu_seqlens;  // packed tokens: the int32 prefix sums (batch + 1); undefined: fixed length
  bool packed() const { return cu_seqlens.defined(); }
  // Sequence `index` of a packed tensor (its rows [start, start + length)) as a fixed-length batch of one.
  Fp8Tensor sequence(int64_t index, int64_t start, int64_t length) const;
};

// x (batch, seqlen, heads, head_dim), or packed tokens (total, heads, head_dim) with
// cu_seqlens (batch + 1 int32 prefix sums, any device; a descale row a sequence, 1
// for an empty one); any float dtype, heads a multiple of kv_heads.
Fp8Tensor quantize_e4m3(const at::Tensor& x, int64_t kv_heads, Fp8Scaling scaling,
                        const at::Tensor& cu_seqlens = at::Tensor());

// A random-sign Hadamard matrix (head_dim x head_dim, float32, orthogonal): Sylvester's
// matrix with column signs from `seed`, over sqrt(head_dim); head_dim a power of two.
// Q and K multiplied by it before quantizing leave q k^T unchanged and spread an outlier
// channel over all of them (FA3's incoherent processing; flashlab.fp8.random_hadamard).
at::Tensor random_hadamard(int64_t head_dim, uint64_t seed, at::Device device);
// values * descale (each query head its kv head's factor), in `dtype`.
at::Tensor dequantize_e4m3(const Fp8Tensor& x, at::ScalarType dtype);

// The FP8 forward's arithmetic on q, k, v, in float64, rounded to output_dtype:
//   s = q8 k8^T x q_descale x k_descale: on the FP8 tensor cores when the device has
//       them (torch's _scaled_mm with fast accumulation, as the kernel's wgmma chain
//       accumulates: Hopper keeps about 14 bits of the partial sums there), else exact;
//   p = exp(s x scale - row max); P V with p x 2^8 rounded to e4m3 (the kernel's
//   kFp8PExponent), the row sum from the unrounded p; V dequantized.
// Its error against reference_attention of the dequantized values is what the
// format costs; the kernel is held to twice it. Masks as ReferenceOptions says;
// rows that see no key give 0 and LSE -inf. Returns out (batch, seqlen_q, heads,
// head_dim) in output_dtype and the LSE of those scores (batch, heads, seqlen_q), float64;
// packed q, k, v: one sequence at a time, out (total_q, heads, head_dim), LSE (heads, total_q).
ReferenceOutput fp8_path_attention(const Fp8Tensor& q, const Fp8Tensor& k, const Fp8Tensor& v,
                                   const ReferenceOptions& options, at::ScalarType output_dtype);

// Root-mean-square and largest |actual - expected| over the finite expected
// elements (NaN/inf in actual count as infinite error).
struct ErrorSummary {
  double rmse = 0, max_abs = 0;
};
ErrorSummary error_summary(const at::Tensor& actual, const at::Tensor& expected);

// The kernel's output against float32 attention of the values before
// quantization, for each scaling (the asked one first): what the descales buy.
struct Fp8AccuracyRow {
  Fp8Scaling scaling = Fp8Scaling::per_head;
  bool hadamard = false;  // Q and K rotated by random_hadamard before quantizing
  ErrorSummary error;
};
struct Fp8Accuracy {
  bool outliers = false;
  std::vector<Fp8AccuracyRow> rows;
  std::string format() const;
  std::string to_json() const;
};

}  // namespace flashlab
