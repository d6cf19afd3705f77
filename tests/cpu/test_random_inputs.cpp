// cuRAND's host MT19937 generator: reproducible, seed-sensitive, normal(0, 1).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "flashlab/harness/normal_from_bits.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/random_inputs.h"
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

TEST(RandomInputs, KeptHostValuesAreTheGeneratorsOwn) {
  // mt19937_normal keeps recent seeds' host values; a draw served from them must
  // equal the generator's fresh draw, and writing into it must not reach them.
  const uint64_t seed = testing::test_seed() + 77;
  SCOPED_TRACE("seed " + std::to_string(seed));
  const at::Tensor large = mt19937_normal({4001}, seed, at::kCPU);
  at::Tensor kept = mt19937_normal({7, 9}, seed, at::kCPU);
  const at::Tensor fresh = mt19937_normal_in_calls({7, 9}, seed, at::kCPU, kMostMt19937BitsPerCall);
  EXPECT_TRUE(at::equal(kept, fresh));
  EXPECT_TRUE(at::equal(kept.flatten(), large.narrow(0, 0, 63)));
  kept.fill_(0);
  EXPECT_TRUE(at::equal(mt19937_normal({7, 9}, seed, at::kCPU), fresh));
}

TEST(RandomInputs, DifferentSeedsGiveDifferentValues) {
  const uint64_t seed = testing::test_seed();
  const at::Tensor first = mt19937_normal({1001}, seed, at::kCPU);
  const at::Tensor second = mt19937_normal({1001}, seed + 1, at::kCPU);
  EXPECT_FALSE(at::equal(first, second));
}

TEST(RandomInputs, TransformMatchesExactBoxMuller) {
  // The float transform against Box-Muller in double with the C library's log/cos/sin.
  uint32_t state = 12345u + static_cast<uint32_t>(testing::test_seed());
  double worst = 0;
  for (int pair = 0; pair < 100000; ++pair) {
    state = state * 1664525u + 1013904223u;
    const uint32_t first = state;
    state = state * 1664525u + 1013904223u;
    const uint32_t second = state;
    float z0, z1;
    normal_pair_from_bits(first, second, z0, z1);
    const double u1 = ((first >> 8) + 1.0) / 16777216.0, u2 = (second >> 8) / 16777216.0;
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2 * M_PI * u2;
    worst = std::max({worst, std::abs(z0 - radius * std::cos(angle)), std::abs(z1 - radius * std::sin(angle))});
  }
  EXPECT_LT(worst, 5e-6);
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
