// One seeded attention problem and the shared check that every executable and
// test uses: make inputs, poison the outputs, run the kernel, compare with the
// reference under flash-attn's rule.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/compare.h"

namespace flashlab {

enum class Layout { bshd, packed_qkv };

struct ProblemSpec {
  std::string kernel = "auto";
  int batch = 2, heads = 8, kv_heads = 8;
  int seqlen_q = 113, seqlen_k = 113, head_dim = 64;
  at::ScalarType dtype = at::kHalf;
  bool causal = false;
  std::optional<double> softmax_scale;
  int window_left = -1, window_right = -1;
  uint64_t seed = 0;
  Layout layout = Layout::bshd;
  bool float64_reference = false;  // always on for float32 inputs
  // Variable-length batch: per-sequence lengths (0 allowed). Empty seqlens_q:
  // fixed length. Set, batch/seqlen_q/seqlen_k are ignored and the inputs are
  // packed (total_tokens, heads, head_dim); empty seqlens_k means "as seqlens_q".
  std::vector<int> seqlens_q, seqlens_k;
  // Q and K are multiplied by this after drawing, so scores grow by its square
  // (overflow tests).
  double qk_input_scale = 1.0;

  bool is_varlen() const { return !seqlens_q.empty(); }
  const std::vector<int>& key_seqlens() const { return seqlens_k.empty() ? seqlens_q : seqlens_k; }
  std::string describe() const;
  AttentionOptions attention_options() const;
};

struct ProblemInputs {
  at::Tensor q, k, v;  // (B, S, H, D) views; with packed_qkv they share one buffer
  // Variable-length specs: q, k, v are (total, H, D) and these describe the
  // sequences (cu_seqlens int32 on the inputs' device).
  at::Tensor cu_seqlens_q, cu_seqlens_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
};

// Q, K, V from MT19937 normal(0, 1) values seeded by spec.seed. With
// random = false the tensors have the right shapes and strides but no values
// (enough to ask a kernel whether it supports the problem).
ProblemInputs make_inputs(const ProblemSpec& spec, at::Device device, bool random = true);

// Empty when `kernel` can run the spec on a device of this compute capability
// (0: any), else the reason. Touches no device.
std::string unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                               int compute_capability = 0);

struct CheckResult {
  std::string kernel;  // the kernel that ran (resolves "auto")
  std::string problem;
  TileShape tiles;
  ComparisonReport out, lse;
  double ref_err = 0;      // max |torch same-precision math - reference| on the output
  double storage_err = 0;  // flash-attn's fwd_atol: 2 max |((ref + 0.3) - 0.3) - ref| in the input dtype
  double kernel_ms = -1;   // median over the timed launches, when timed
  bool passed() const { return out.passed() && lse.passed(); }
  std::string format() const;
  std::string to_json() const;
};

struct CheckOptions {
  int timed_launches = 0;  // > 0: also time the kernel (median of this many launches)
};

CheckResult check_kernel(const ProblemSpec& spec, const CheckOptions& check_options = {});

// Skip reason for GPU tests and executables: empty when a CUDA device is usable.
std::string cuda_unavailable_reason();

}  // namespace flashlab
