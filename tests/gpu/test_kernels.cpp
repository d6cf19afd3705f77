// Every registered kernel over the correctness matrix: odd and unequal seqlens,
// causal on and off, MHA/GQA/MQA, bshd and packed-qkv layouts, each dtype.
// A case is generated only when the kernel declares support for it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab {
namespace {

struct KernelCase {
  std::string name;
  ProblemSpec spec;
};

const char* dtype_label(at::ScalarType dtype) {
  return dtype == at::kFloat ? "fp32" : dtype == at::kHalf ? "fp16" : "bf16";
}

std::vector<KernelCase> correctness_matrix() {
  const std::vector<std::pair<int, int>> seqlens = {
      {1, 1}, {7, 7}, {64, 64}, {113, 113}, {256, 256}, {1023, 1023},
      {1, 113}, {7, 256}, {113, 1023}, {1023, 113}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : registered_kernels())
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
      for (const auto& [seqlen_q, seqlen_k] : seqlens)
        for (const bool causal : {false, true})
          for (const int kv_heads : {8, 2, 1})
            for (const Layout layout : {Layout::bshd, Layout::packed_qkv}) {
              if (layout == Layout::packed_qkv && seqlen_q != seqlen_k) continue;
              ProblemSpec spec;
              spec.kernel = kernel.name;
              spec.batch = 2;
              spec.heads = 8;
              spec.kv_heads = kv_heads;
              spec.seqlen_q = seqlen_q;
              spec.seqlen_k = seqlen_k;
              spec.head_dim = 64;
              spec.dtype = dtype;
              spec.causal = causal;
              spec.layout = layout;
              if (!unsupported_reason(kernel, spec).empty()) continue;
              const std::string name = kernel.name + "_" + dtype_label(dtype) + "_q" +
                                       std::to_string(seqlen_q) + "_k" + std::to_string(seqlen_k) +
                                       "_kv" + std::to_string(kv_heads) +
                                       (causal ? "_causal" : "") +
                                       (layout == Layout::packed_qkv ? "_packed" : "");
              cases.push_back({name, spec});
            }
  return cases;
}

// Head dims each kernel supports, fp16, one odd seqlen pair.
std::vector<KernelCase> head_dim_matrix() {
  std::vector<KernelCase> cases;
  for (const auto& kernel : registered_kernels())
    for (const int head_dim : {16, 32, 40, 64, 80, 96, 128, 256})
      for (const bool causal : {false, true}) {
        ProblemSpec spec;
        spec.kernel = kernel.name;
        spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
        spec.seqlen_q = 113, spec.seqlen_k = 300;
        spec.head_dim = head_dim;
        spec.dtype = at::kBFloat16;
        spec.causal = causal;
        if (!unsupported_reason(kernel, spec).empty()) continue;
        cases.push_back({kernel.name + "_d" + std::to_string(head_dim) + (causal ? "_causal" : ""), spec});
      }
  return cases;
}

class KernelMatrix : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelMatrix, MatchesReference) {
  FLASHLAB_REQUIRE_GPU();
  ProblemSpec spec = GetParam().spec;
  spec.seed = testing::test_seed() + std::hash<std::string>{}(GetParam().name) % 1000;
  const CheckResult result = check_kernel(spec);
  EXPECT_TRUE(result.passed()) << result.format();
}

INSTANTIATE_TEST_SUITE_P(Correctness, KernelMatrix, ::testing::ValuesIn(correctness_matrix()),
                         [](const auto& info) { return info.param.name; });
INSTANTIATE_TEST_SUITE_P(HeadDims, KernelMatrix, ::testing::ValuesIn(head_dim_matrix()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashlab
