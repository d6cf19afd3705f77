// Properties every kernel must have beyond matching the reference once:
// causality and bitwise determinism (one fixture each, over property_cases():
// every registered kernel and dtype it takes), and host/device generator
// agreement.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include "flashlab/attention.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/random_inputs.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

class Causality : public KernelCaseTest {};
class Determinism : public KernelCaseTest {};

TEST_P(Causality, LaterKeysDoNotChangeEarlierRows) {
  SCOPED_TRACE(spec_.describe());
  spec_.causal = true;
  const ProblemInputs inputs = make_inputs(spec_, at::Device(at::kCUDA, 0));
  const AttentionOptions options = spec_.attention_options();
  const AttentionOutput before = attention_forward(inputs.q, inputs.k, inputs.v, options);
  // seqlen_q == seqlen_k: rows 0..first_changed-1 see keys up to their own index
  // only; rewrite keys and values from first_changed on.
  ASSERT_EQ(spec_.seqlen_q, spec_.seqlen_k);
  const int first_changed = spec_.seqlen_k / 2 + 2;
  ASSERT_LT(first_changed + 10, spec_.seqlen_k);
  at::Tensor k = inputs.k.clone(), v = inputs.v.clone();
  k.narrow(1, first_changed, spec_.seqlen_k - first_changed).mul_(-3.0).add_(1.0);
  v.narrow(1, first_changed, spec_.seqlen_k - first_changed).mul_(5.0);
  const AttentionOutput after = attention_forward(inputs.q, k, v, options);
  EXPECT_TRUE(at::equal(before.out.narrow(1, 0, first_changed), after.out.narrow(1, 0, first_changed)));
  EXPECT_TRUE(at::equal(before.lse.narrow(2, 0, first_changed), after.lse.narrow(2, 0, first_changed)));
  // And the change is visible where it should be.
  EXPECT_FALSE(at::equal(before.out.narrow(1, first_changed, 10), after.out.narrow(1, first_changed, 10)));
}

TEST_P(Determinism, TwoRunsAreBitwiseEqual) {
  SCOPED_TRACE(spec_.describe());
  const ProblemInputs inputs = make_inputs(spec_, at::Device(at::kCUDA, 0));
  const AttentionOutput first = attention_forward(inputs.q, inputs.k, inputs.v, spec_.attention_options());
  const AttentionOutput second = attention_forward(inputs.q, inputs.k, inputs.v, spec_.attention_options());
  EXPECT_TRUE(at::equal(first.out, second.out));
  EXPECT_TRUE(at::equal(first.lse, second.lse));
}

const auto case_name = [](const auto& info) { return info.param.name; };

INSTANTIATE_TEST_SUITE_P(AllKernels, Causality, ::testing::ValuesIn(property_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(AllKernels, Determinism, ::testing::ValuesIn(property_cases()), case_name);

// More outputs than one cuRAND call takes come from several calls that
// continue one sequence: in small calls, the values of one host call.
TEST(RandomInputsOnDevice, ManyCallsContinueOneSequence) {
  FLASHLAB_REQUIRE_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int64_t count = 10001;
  const at::Tensor one_call = mt19937_normal({count}, seed, at::kCPU);
  for (const int64_t call_size : {int64_t{2}, int64_t{4096}, int64_t{10000}}) {
    SCOPED_TRACE("calls of " + std::to_string(call_size));
    EXPECT_TRUE(at::equal(mt19937_normal_in_calls({count}, seed, at::kCPU, call_size), one_call));
    EXPECT_TRUE(at::equal(mt19937_normal_in_calls({count}, seed, at::Device(at::kCUDA, 0), call_size).cpu(), one_call));
  }
}

// 2^31 + 6 values on the device (a single cuRAND call faults there): no error,
// and they start as a short draw does.
TEST(RandomInputsOnDevice, MoreValuesThanOneCuRandCallTakes) {
  FLASHLAB_REQUIRE_GPU();
  const uint64_t seed = test_seed();
  const at::Device gpu(at::kCUDA, 0);
  const int64_t count = (int64_t{1} << 31) + 6;
  at::Tensor values = mt19937_normal({count}, seed, gpu);
  EXPECT_TRUE(at::equal(values.narrow(0, 0, 4097).cpu(), mt19937_normal({4097}, seed, gpu).cpu()));
  EXPECT_TRUE(at::isfinite(values.narrow(0, count - 4097, 4097)).all().item<bool>());
  values = at::Tensor();
  c10::cuda::CUDACachingAllocator::emptyCache();
}

TEST(RandomInputsOnDevice, HostAndDeviceGeneratorsAgreeBitwise) {
  FLASHLAB_REQUIRE_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const int64_t count : {1, 7, 4097, 1 << 20}) {
    const at::Tensor host = mt19937_normal({count}, seed, at::kCPU);
    const at::Tensor device = mt19937_normal({count}, seed, at::Device(at::kCUDA, 0)).cpu();
    EXPECT_TRUE(at::equal(host, device)) << count << " values: max difference "
                                         << (host - device).abs().max().item<float>();
  }
}

}  // namespace
}  // namespace flashlab::testing
