// Every registered kernel on the rest of the forward feature set: sliding
// windows, variable-length batches (empty and length-1 sequences, very unequal
// lengths, GQA, causal) and fp16/bf16 scores of magnitude ~1e4. A case is
// generated only when the kernel declares support for it.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab {
namespace {

struct FeatureCase {
  std::string name;
  ProblemSpec spec;
};

// gtest prints parameters in failure messages and --gtest_list_tests.
void PrintTo(const FeatureCase& feature_case, std::ostream* stream) {
  *stream << feature_case.spec.describe();
}

const char* dtype_label(at::ScalarType dtype) {
  return dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16";
}

std::string window_label(int left, int right) {
  const auto side = [](int value) { return value < 0 ? std::string("inf") : std::to_string(value); };
  return "_w" + side(left) + "_" + side(right);
}

// Adds the case under `name` when `kernel` supports it.
void add_if_supported(std::vector<FeatureCase>& cases, const KernelVariant& kernel,
                      const std::string& name, ProblemSpec spec) {
  spec.kernel = kernel.name;
  if (unsupported_reason(kernel, spec).empty()) cases.push_back({kernel.name + "_" + name, spec});
}

std::vector<FeatureCase> window_matrix() {
  const std::vector<std::pair<int, int>> windows = {{64, 0}, {0, 0}, {17, 33}, {-1, 5}, {128, -1}};
  const std::vector<std::pair<int, int>> seqlens = {{113, 1023}, {1023, 113}, {256, 256}};
  std::vector<FeatureCase> cases;
  for (const auto& kernel : registered_kernels())
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const auto& [seqlen_q, seqlen_k] : seqlens)
        for (const auto& [left, right] : windows) {
          ProblemSpec spec;
          spec.batch = 2, spec.heads = 8, spec.kv_heads = 2;
          spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
          spec.head_dim = 64;
          spec.dtype = dtype;
          spec.window_left = left, spec.window_right = right;
          add_if_supported(cases, kernel,
                           std::string(dtype_label(dtype)) + "_q" + std::to_string(seqlen_q) + "_k" +
                               std::to_string(seqlen_k) + window_label(left, right),
                           spec);
        }
  return cases;
}

struct Lengths {
  std::string label;
  std::vector<int> seqlens_q, seqlens_k;
};

// Empty sequences (first, middle, last), length 1, very unequal lengths, query
// sequences without keys and keys without queries.
const std::vector<Lengths>& varlen_lengths() {
  static const std::vector<Lengths> lengths = {
      {"mixed", {1, 0, 513, 7, 1000}, {1, 0, 513, 7, 1000}},
      {"unequal", {1, 0, 513, 7, 1000}, {300, 5, 0, 1000, 17}},
      {"single1", {1}, {1}},
      {"empty_ends", {0, 64, 129, 0}, {0, 200, 31, 0}},
      {"no_keys", {5, 64, 3}, {0, 0, 0}},
      {"many_short", {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4}},
  };
  return lengths;
}

ProblemSpec varlen_spec(const Lengths& lengths, at::ScalarType dtype, int kv_heads, bool causal) {
  ProblemSpec spec;
  spec.heads = 8, spec.kv_heads = kv_heads;
  spec.head_dim = 64;
  spec.seqlens_q = lengths.seqlens_q;
  spec.seqlens_k = lengths.seqlens_k;
  spec.dtype = dtype;
  spec.causal = causal;
  return spec;
}

std::vector<FeatureCase> varlen_matrix() {
  std::vector<FeatureCase> cases;
  for (const auto& kernel : registered_kernels()) {
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
      for (const auto& lengths : varlen_lengths())
        for (const bool causal : {false, true})
          for (const int kv_heads : {8, 2}) {
            add_if_supported(cases, kernel,
                             std::string(dtype_label(dtype)) + "_" + lengths.label + "_kv" +
                                 std::to_string(kv_heads) + (causal ? "_causal" : ""),
                             varlen_spec(lengths, dtype, kv_heads, causal));
          }
    // Windows and MQA on the unequal lengths; the packed-qkv layout; other head dims.
    const Lengths& unequal = varlen_lengths()[1];
    for (const auto& [left, right] : std::vector<std::pair<int, int>>{{17, 33}, {64, 0}, {-1, 5}}) {
      ProblemSpec spec = varlen_spec(unequal, at::kHalf, 1, false);
      spec.window_left = left, spec.window_right = right;
      add_if_supported(cases, kernel, "fp16_unequal_kv1" + window_label(left, right), spec);
    }
    ProblemSpec packed = varlen_spec(varlen_lengths()[0], at::kBFloat16, 2, true);
    packed.layout = Layout::packed_qkv;
    add_if_supported(cases, kernel, "bf16_mixed_kv2_causal_packed", packed);
    for (const int head_dim : {32, 128, 256}) {
      ProblemSpec spec = varlen_spec(unequal, at::kHalf, 2, true);
      spec.head_dim = head_dim;
      add_if_supported(cases, kernel, "fp16_unequal_kv2_causal_d" + std::to_string(head_dim), spec);
    }
  }
  return cases;
}

// Scores of magnitude ~1e4 (standard deviation 8000-10000, extremes ~5e4): a
// kernel that held scores, or scores times log2(e), in fp16 would overflow.
// Either a large softmax_scale on unit-variance inputs, or Q and K scaled by 10
// with softmax_scale 12.5 (raw dot products ~800, still finite in fp16 for the
// same-precision torch reference).
std::vector<FeatureCase> large_score_matrix() {
  struct Scaling {
    std::string label;
    double qk_input_scale, softmax_scale;
  };
  const std::vector<Scaling> scalings = {{"scale1000", 1.0, 1000.0}, {"inputs10_scale12p5", 10.0, 12.5}};
  std::vector<FeatureCase> cases;
  for (const auto& kernel : registered_kernels())
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const auto& scaling : scalings)
        for (const bool causal : {false, true}) {
          const std::string suffix = std::string(dtype_label(dtype)) + "_" + scaling.label +
                                     (causal ? "_causal" : "");
          for (const auto& [seqlen_q, seqlen_k] : std::vector<std::pair<int, int>>{{113, 1023}, {1023, 113}}) {
            ProblemSpec spec;
            spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
            spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
            spec.head_dim = 64;
            spec.dtype = dtype;
            spec.causal = causal;
            spec.qk_input_scale = scaling.qk_input_scale;
            spec.softmax_scale = scaling.softmax_scale;
            add_if_supported(cases, kernel,
                             suffix + "_q" + std::to_string(seqlen_q) + "_k" + std::to_string(seqlen_k),
                             spec);
          }
          ProblemSpec varlen = varlen_spec(varlen_lengths()[1], dtype, 2, causal);
          varlen.qk_input_scale = scaling.qk_input_scale;
          varlen.softmax_scale = scaling.softmax_scale;
          add_if_supported(cases, kernel, suffix + "_varlen_unequal", varlen);
        }
  return cases;
}

uint64_t case_seed(const std::string& name) {
  return testing::test_seed() + std::hash<std::string>{}(name) % 1000;
}

class WindowMatrix : public ::testing::TestWithParam<FeatureCase> {};
class VarlenMatrix : public ::testing::TestWithParam<FeatureCase> {};
class LargeScores : public ::testing::TestWithParam<FeatureCase> {};

TEST_P(WindowMatrix, MatchesReference) {
  FLASHLAB_REQUIRE_GPU();
  ProblemSpec spec = GetParam().spec;
  spec.seed = case_seed(GetParam().name);
  const CheckResult result = check_kernel(spec);
  EXPECT_TRUE(result.passed()) << result.format();
}

TEST_P(VarlenMatrix, MatchesReference) {
  FLASHLAB_REQUIRE_GPU();
  ProblemSpec spec = GetParam().spec;
  spec.seed = case_seed(GetParam().name);
  const CheckResult result = check_kernel(spec);
  EXPECT_TRUE(result.passed()) << result.format();
}

TEST_P(LargeScores, NoOverflow) {
  FLASHLAB_REQUIRE_GPU();
  ProblemSpec spec = GetParam().spec;
  spec.seed = case_seed(GetParam().name);
  const CheckResult result = check_kernel(spec);
  EXPECT_EQ(result.out.nan_count + result.out.inf_count, 0) << result.format();
  EXPECT_EQ(result.lse.nan_count + result.lse.inf_count, 0) << result.format();
  EXPECT_TRUE(result.passed()) << result.format();
  // At these magnitudes torch's own fp16/bf16 math rounds the scores by tens of
  // units, so the rule's tolerance is loose. Float32 scores keep the kernel
  // far closer: hold it to a bound that would catch a half-precision score path
  // (measured in emulation: ~0.003 fp16, ~0.008 bf16).
  EXPECT_LT(result.out.max_abs_error, 0.05) << result.format();
}

INSTANTIATE_TEST_SUITE_P(SlidingWindow, WindowMatrix, ::testing::ValuesIn(window_matrix()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Varlen, VarlenMatrix, ::testing::ValuesIn(varlen_matrix()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(Fp16Bf16, LargeScores, ::testing::ValuesIn(large_score_matrix()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashlab
