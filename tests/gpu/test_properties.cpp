// Properties every kernel must have beyond matching the reference once:
// causality, bitwise determinism, and host/device generator agreement.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "flashlab/attention.h"
#include "flashlab/kernel_registry.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/random_inputs.h"
#include "test_support.h"

namespace flashlab {
namespace {

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const auto& kernel : registered_kernels()) names.push_back(kernel.name);
  return names;
}

class KernelProperties : public ::testing::TestWithParam<std::string> {
 protected:
  ProblemSpec spec() const {
    ProblemSpec spec;
    spec.kernel = GetParam();
    spec.batch = 2, spec.heads = 8, spec.kv_heads = 2;
    spec.seqlen_q = spec.seqlen_k = 257;
    spec.head_dim = 64;
    spec.dtype = at::kBFloat16;
    spec.seed = testing::test_seed();
    return spec;
  }
};

TEST_P(KernelProperties, LaterKeysDoNotChangeEarlierRowsUnderCausalMask) {
  FLASHLAB_REQUIRE_GPU();
  ProblemSpec problem = spec();
  problem.causal = true;
  const ProblemInputs inputs = make_inputs(problem, at::Device(at::kCUDA, 0));
  const AttentionOptions options = problem.attention_options();
  const AttentionOutput before = attention_forward(inputs.q, inputs.k, inputs.v, options);
  // Rows 0..129 see keys 0..129 only; rewrite keys and values from 130 on.
  const int first_changed = 130;
  at::Tensor k = inputs.k.clone(), v = inputs.v.clone();
  k.narrow(1, first_changed, problem.seqlen_k - first_changed).mul_(-3.0).add_(1.0);
  v.narrow(1, first_changed, problem.seqlen_k - first_changed).mul_(5.0);
  const AttentionOutput after = attention_forward(inputs.q, k, v, options);
  EXPECT_TRUE(at::equal(before.out.narrow(1, 0, first_changed), after.out.narrow(1, 0, first_changed)));
  EXPECT_TRUE(at::equal(before.lse.narrow(2, 0, first_changed), after.lse.narrow(2, 0, first_changed)));
  // And the change is visible where it should be.
  EXPECT_FALSE(at::equal(before.out.narrow(1, first_changed, 10), after.out.narrow(1, first_changed, 10)));
}

TEST_P(KernelProperties, TwoRunsAreBitwiseEqual) {
  FLASHLAB_REQUIRE_GPU();
  const ProblemSpec problem = spec();
  const ProblemInputs inputs = make_inputs(problem, at::Device(at::kCUDA, 0));
  const AttentionOutput first = attention_forward(inputs.q, inputs.k, inputs.v, problem.attention_options());
  const AttentionOutput second = attention_forward(inputs.q, inputs.k, inputs.v, problem.attention_options());
  EXPECT_TRUE(at::equal(first.out, second.out));
  EXPECT_TRUE(at::equal(first.lse, second.lse));
}

INSTANTIATE_TEST_SUITE_P(AllKernels, KernelProperties, ::testing::ValuesIn(kernel_names()),
                         [](const auto& info) { return info.param; });

TEST(RandomInputsOnDevice, HostAndDeviceGeneratorsAgreeBitwise) {
  FLASHLAB_REQUIRE_GPU();
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const int64_t count : {1, 7, 4097, 1 << 20}) {
    const at::Tensor host = mt19937_normal({count}, seed, at::kCPU);
    const at::Tensor device = mt19937_normal({count}, seed, at::Device(at::kCUDA, 0)).cpu();
    EXPECT_TRUE(at::equal(host, device)) << count << " values: max difference "
                                         << (host - device).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace flashlab
