// The test matrices, generated from the registry: every registered kernel gets
// each case it declares support for (unsupported_reason). The GPU fixtures, the
// coverage-floor test and the sanitizer's case list all read these generators,
// so a case is written once. Torch-only; no GoogleTest, no device.
#pragma once

#include <ATen/core/ATen_fwd.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "flashlab/harness/problem.h"
#include "flashlab/kernel_registry.h"

namespace flashlab::testing {

struct KernelCase {
  std::string name;  // the GoogleTest parameter name: kernel first, then the problem
  std::string kernel;
  ProblemSpec spec;  // spec.kernel == kernel; spec.seed is set by the test
  // A bound on the output's max abs error tighter than the pass rule, and why.
  std::optional<double> max_abs_error;
  std::string max_abs_error_reason;
  // A backward case: the kernel runs its forward and backward on it
  // (backward_unsupported_reason accepted it), checked with check_backward.
  bool backward = false;
  // Repeated-run properties (determinism): how many runs to compare.
  int runs = 0;
  // A backward case that runs the deterministic backward (flashlab-run --deterministic).
  bool deterministic = false;
};
void PrintTo(const KernelCase& kernel_case, std::ostream* stream);  // GoogleTest prints specs

// Generators, over `kernels` (default: the registry). compute_capability 0:
// every case a kernel takes on some device; 90: only those a compute
// capability 9.0 device runs (what the coverage floors count).
using Kernels = std::vector<KernelVariant>;
using CaseGenerator = std::vector<KernelCase> (*)(int compute_capability, const Kernels& kernels);

// Checked against the reference (check_kernel):
// seqlens x causal x GQA x layout x dtype, head_dim 64
std::vector<KernelCase> correctness_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// every probed head dim, bf16
std::vector<KernelCase> head_dim_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// sliding windows
std::vector<KernelCase> window_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// variable-length batches
std::vector<KernelCase> varlen_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// scores ~1e4, with a tight error bound
std::vector<KernelCase> large_score_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// The score modifications the matrices cross with shapes (the forward's,
// the backward's and the KV-cache path's): each alone (ALiBi per head and per
// batch entry) and all three. A cap of 1.5 bends the scaled scores of normal
// inputs (about +-3), so softcap is not a no-op.
struct ScoreModificationCase {
  const char* label;
  double softcap;
  ProblemSpec::Alibi alibi;
  bool sinks;
  template <class Spec>
  void apply(Spec& spec) const {  // ProblemSpec or KvCacheSpec
    spec.softcap = softcap, spec.alibi = alibi, spec.sinks = sinks;
  }
};
const std::vector<ScoreModificationCase>& score_modifications();

// score modifications (softcap, ALiBi per head / per batch entry, sinks, all
// three) x {none, causal with rows that see no key, a window, varlen}, GQA,
// odd lengths, fp16/bf16 cycling, and fp32 where taken
std::vector<KernelCase> score_modification_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// Causality and determinism: one case per dtype the kernel takes.
std::vector<KernelCase> property_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// compute-sanitizer: every 16-bit dtype x head dim the kernel takes on small odd
// shapes, each kernel meeting every shape; one fp32 and one varlen case where taken.
std::vector<KernelCase> sanitizer_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());

// The backward pass (check_backward; kernels with a backward that takes the
// case, forward included). Each covers its properties without a full product:
// seqlens 1, 7, 113, 1023 (equal and unequal) x causal, cycling dtype (fp16,
// bf16), kv heads (8, 2, 1) and packed-qkv over them, head_dim 64; fp32 on two
// shapes where taken
std::vector<KernelCase> backward_correctness_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// every probed head dim, fp16 and bf16
std::vector<KernelCase> backward_head_dim_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// sliding windows
std::vector<KernelCase> backward_window_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// variable-length batches
std::vector<KernelCase> backward_varlen_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// head_dim 128 without a mask, query lengths around fa3's 80-row blocks
std::vector<KernelCase> backward_query_block_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
std::vector<KernelCase> backward_persistent_grid_cases(int compute_capability = 0,
                                                       const Kernels& kernels = registered_kernels());
// rows that see no key (gradient 0, never NaN) and keys that no row sees
std::vector<KernelCase> backward_masked_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// bitwise determinism: one case per 16-bit dtype (50 runs) and a batch-60
// stress case (10 runs); KernelCase::runs says how many
std::vector<KernelCase> backward_determinism_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());
// score_modification_cases' matrix through the backward (dsinks checked too)
std::vector<KernelCase> backward_score_modification_cases(int compute_capability = 0,
                                                          const Kernels& kernels = registered_kernels());
// compute-sanitizer over the backward (flashlab-run --backward): head dims 64
// and 128 on small odd shapes (GQA, causal, a window, a varlen batch with
// empty sequences), one 16-bit dtype each; one case runs the deterministic
// backward (KernelCase::deterministic)
std::vector<KernelCase> backward_sanitizer_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());

// The FP8 (e4m3) forward: head dims 128 and 256, odd and unequal lengths,
// causal, a window, GQA/MQA, a one-row query, outlier channels, each descale
// scaling, bf16 and fp16 outputs
std::vector<KernelCase> fp8_cases(int compute_capability = 0, const Kernels& kernels = registered_kernels());

struct CaseMatrix {
  std::string name;  // also the GoogleTest instantiation name
  CaseGenerator generate;
};
// Every matrix above, forward then backward, in that order (the coverage
// floors have one count each).
const std::vector<CaseMatrix>& case_matrices();

// Head dims the generators try; a kernel "takes" those its unsupported_reason accepts.
const std::vector<int>& probe_head_dims();
std::vector<int> supported_head_dims(const KernelVariant& kernel, at::ScalarType dtype,
                                     int compute_capability = 0);
std::vector<at::ScalarType> supported_dtypes(const KernelVariant& kernel, int compute_capability = 0);

const char* dtype_label(at::ScalarType dtype);  // fp32, fp16, bf16

// flashlab-run options for a spec (kernel, shape, dtype, masks, layout; no seed).
std::string flashlab_run_arguments(const ProblemSpec& spec);
// The same for a case: plus --backward (and --deterministic) for a backward case.
std::string flashlab_run_arguments(const KernelCase& kernel_case);

}  // namespace flashlab::testing
