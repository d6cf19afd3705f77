// A program built against the installed flashlab package (find_package(flashlab CONFIG),
// flashlab::flashlab): runs flashlab::attention_forward on small fp16 problems and
// compares out and lse with torch's scaled_dot_product_attention evaluated in float32
// on the CPU.
//
//   flashlab_consumer                 the GPU comparison; exit 0 pass, 1 mismatch or error,
//                                     77 no usable CUDA device (nothing was compared)
//   flashlab_consumer --list-kernels  the registered kernels (no GPU needed), exit 0
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "flashlab/kernel_registry.h"

namespace {

constexpr int kSkipped = 77;

struct Case {
  int64_t batch, seqlen_q, seqlen_k, heads, head_dim;
  bool causal;  // seqlen_q == seqlen_k: flashlab's bottom-right mask and torch's top-left agree
};

// Largest |a - b| over all elements, in float32.
double max_abs_error(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<double>();
}

// Returns true when out and lse are within tolerance of the float32 reference.
bool check(const Case& c) {
  const auto gpu = at::TensorOptions().dtype(at::kHalf).device(at::kCUDA);
  const at::Tensor q = at::randn({c.batch, c.seqlen_q, c.heads, c.head_dim}, gpu);
  const at::Tensor k = at::randn({c.batch, c.seqlen_k, c.heads, c.head_dim}, gpu);
  const at::Tensor v = at::randn({c.batch, c.seqlen_k, c.heads, c.head_dim}, gpu);

  flashlab::AttentionOptions options;
  options.causal = c.causal;
  const std::string kernel = flashlab::select_kernel(q, k, v, options).name;
  const auto [out, lse] = flashlab::attention_forward(q, k, v, options);

  // torch's layout is (batch, heads, seqlen, head_dim).
  const at::Tensor qf = q.cpu().to(at::kFloat).transpose(1, 2);
  const at::Tensor kf = k.cpu().to(at::kFloat).transpose(1, 2);
  const at::Tensor vf = v.cpu().to(at::kFloat).transpose(1, 2);
  const at::Tensor ref_out =
      at::scaled_dot_product_attention(qf, kf, vf, {}, 0.0, c.causal).transpose(1, 2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  at::Tensor scores = at::matmul(qf, kf.transpose(-2, -1)) * scale;
  if (c.causal) {
    const at::Tensor later = at::ones({c.seqlen_q, c.seqlen_k}, at::kBool).triu(1);
    scores = scores.masked_fill(later, -std::numeric_limits<float>::infinity());
  }
  const at::Tensor ref_lse = at::logsumexp(scores, -1);  // (batch, heads, seqlen_q)

  const double out_error = max_abs_error(out.cpu(), ref_out);
  const double lse_error = max_abs_error(lse.cpu(), ref_lse);
  // fp16 output: a few ulps at the output's magnitude (|out| < ~4 here); lse is float32.
  const double out_tolerance = 2e-2, lse_tolerance = 1e-3;
  const bool passed = out_error <= out_tolerance && lse_error <= lse_tolerance;
  std::printf("%s: fp16 batch %lld seqlen_q %lld seqlen_k %lld heads %lld head_dim %lld%s: "
              "max abs error out %.3g (tolerance %.0e), lse %.3g (tolerance %.0e) vs "
              "at::scaled_dot_product_attention (float32, CPU): %s\n",
              kernel.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.seqlen_q),
              static_cast<long long>(c.seqlen_k), static_cast<long long>(c.heads),
              static_cast<long long>(c.head_dim), c.causal ? " causal" : "", out_error,
              out_tolerance, lse_error, lse_tolerance, passed ? "pass" : "MISMATCH");
  return passed;
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("registered kernels: %s\n", flashlab::registered_kernel_names().c_str());
  if (flashlab::registered_kernels().empty()) return 1;
  if (argc == 2 && std::strcmp(argv[1], "--list-kernels") == 0) return 0;
  if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--list-kernels]\n", argv[0]);
    return 2;
  }
  if (!torch::cuda::is_available()) {
    std::printf("skipped: no usable CUDA device, nothing was compared (exit %d)\n", kSkipped);
    return kSkipped;
  }
  try {
    at::manual_seed(0);
    bool passed = true;
    for (const Case& c : {Case{2, 128, 128, 4, 64, true}, Case{1, 100, 257, 2, 128, false}})
      passed = check(c) && passed;
    return passed ? 0 : 1;
  } catch (const c10::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what_without_backtrace());
    return 1;
  }
}
