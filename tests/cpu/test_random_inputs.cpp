// cuRAND's host MT19937 generator: reproducible, seed-sensitive, normal(0, 1).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "flashlab/problem.h"
#include "flashlab/random_inputs.h"
#include "test_support.h"

namespace flashlab {
namespace {

// Seeding cuRAND's host MT19937 generator takes seconds, so these tests make few.
TEST(RandomInputs, SameSeedGivesSameValuesAndOddCountsArePrefixes) {
  const uint64_t seed = testing::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const at::Tensor odd = mt19937_normal({3, 7, 5}, seed, at::kCPU);
  const at::Tensor even = mt19937_normal({106}, seed, at::kCPU);
  EXPECT_EQ(odd.sizes(), at::IntArrayRef({3, 7, 5}));
  EXPECT_EQ(odd.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(odd.flatten(), even.narrow(0, 0, 105)));
}

TEST(RandomInputs, DifferentSeedsGiveDifferentValues) {
  const uint64_t seed = testing::test_seed();
  const at::Tensor first = mt19937_normal({1001}, seed, at::kCPU);
  const at::Tensor second = mt19937_normal({1001}, seed + 1, at::kCPU);
  EXPECT_FALSE(at::equal(first, second));
}

TEST(RandomInputs, StandardNormal) {
  const at::Tensor values = mt19937_normal({200001}, testing::test_seed(), at::kCPU).to(at::kDouble);
  EXPECT_NEAR(values.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(values.std().item<double>(), 1.0, 0.01);
  EXPECT_TRUE(at::isfinite(values).all().item<bool>());
  // Normal, not log-normal: about half the values are negative.
  EXPECT_NEAR((values < 0).to(at::kDouble).mean().item<double>(), 0.5, 0.01);
}

TEST(RandomInputs, ProblemTensorsAreDistinctAndPackedViewsShareStorage) {
  ProblemSpec spec;
  spec.seed = testing::test_seed();
  spec.batch = 1, spec.heads = 4, spec.kv_heads = 2, spec.seqlen_q = spec.seqlen_k = 9, spec.head_dim = 8;
  const ProblemInputs separate = make_inputs(spec, at::kCPU);
  EXPECT_FALSE(at::equal(separate.q.narrow(2, 0, 2), separate.k));
  EXPECT_FALSE(at::equal(separate.k, separate.v));
  spec.layout = Layout::packed_qkv;
  const ProblemInputs packed = make_inputs(spec, at::kCPU, /*random=*/false);
  EXPECT_EQ(packed.q.data_ptr<at::Half>() + 4 * 8, packed.k.data_ptr<at::Half>());
  EXPECT_EQ(packed.q.stride(1), (4 + 2 * 2) * 8);
  EXPECT_FALSE(packed.q.is_contiguous());
}

}  // namespace
}  // namespace flashlab
