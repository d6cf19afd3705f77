// The harness's score-modification problems (ProblemSpec::softcap / alibi /
// sinks; issue 33): the inputs they draw, the options and reference they give,
// and the kernel choice refusing them, all without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/reference.h"
#include "flashlab/kernel_registry.h"
#include "test_support.h"

namespace flashlab {
namespace {

ProblemSpec modified_spec() {
  ProblemSpec spec;
  spec.kernel = "fa1_scalar";
  spec.batch = 3, spec.heads = 4, spec.kv_heads = 2;
  spec.seqlen_q = 7, spec.seqlen_k = 13, spec.head_dim = 16;
  spec.dtype = at::kFloat;
  spec.causal = true;
  spec.seed = testing::test_seed();
  spec.softcap = 1.5;
  spec.alibi = ProblemSpec::Alibi::per_batch;
  spec.sinks = true;
  return spec;
}

// One seeded draw for the suite: the host MT19937 takes seconds to seed.
class ProblemScoreModification : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { inputs_ = new ProblemInputs(make_inputs(modified_spec(), at::kCPU)); }
  static void TearDownTestSuite() {
    delete inputs_;
    inputs_ = nullptr;
  }
  static ProblemInputs* inputs_;
};
ProblemInputs* ProblemScoreModification::inputs_ = nullptr;

TEST_F(ProblemScoreModification, InputsCarryTheSlopesAndSeededSinks) {
  const ProblemSpec spec = modified_spec();
  const ProblemInputs& inputs = *inputs_;
  ASSERT_TRUE(inputs.alibi_slopes.defined());
  EXPECT_EQ(inputs.alibi_slopes.sizes(), at::IntArrayRef({3, 4}));
  EXPECT_EQ(inputs.alibi_slopes.scalar_type(), at::kFloat);
  // Batch entry b, head h: 2^(-8 (h + 1) / heads) * (b + 1) / batches.
  EXPECT_FLOAT_EQ(inputs.alibi_slopes[2][0].item<float>(), std::pow(2.f, -2.f));
  EXPECT_FLOAT_EQ(inputs.alibi_slopes[0][3].item<float>(), std::pow(2.f, -8.f) / 3);
  // Shapes alone (no draw): per head, and varlen's one row a sequence.
  ProblemSpec per_head = spec;
  per_head.alibi = ProblemSpec::Alibi::per_head;
  EXPECT_EQ(make_inputs(per_head, at::kCPU, /*random=*/false).alibi_slopes.sizes(), at::IntArrayRef({4}));
  ProblemSpec varlen = spec;
  varlen.seqlens_q = {5, 0, 7, 2, 1};
  EXPECT_EQ(make_inputs(varlen, at::kCPU, /*random=*/false).alibi_slopes.size(0), 5);
  // Sinks: float32 (heads), normal draws from their own stream (not Q's first values).
  ASSERT_TRUE(inputs.sinks.defined());
  EXPECT_EQ(inputs.sinks.sizes(), at::IntArrayRef({4}));
  EXPECT_EQ(inputs.sinks.scalar_type(), at::kFloat);
  EXPECT_GT(inputs.sinks.abs().min().item<float>(), 0.f);
  EXPECT_FALSE(at::equal(inputs.sinks, inputs.q.flatten().narrow(0, 0, 4)));
  // Off: nothing made.
  ProblemSpec plain = spec;
  plain.alibi = ProblemSpec::Alibi::none;
  plain.sinks = false;
  const ProblemInputs plain_inputs = make_inputs(plain, at::kCPU, /*random=*/false);
  EXPECT_FALSE(plain_inputs.alibi_slopes.defined());
  EXPECT_FALSE(plain_inputs.sinks.defined());
}

TEST_F(ProblemScoreModification, OptionsReferenceAndDescriptionCarryThem) {
  const ProblemSpec spec = modified_spec();
  const ProblemInputs& inputs = *inputs_;
  const std::string text = spec.describe();
  for (const char* part : {"softcap 1.5", "alibi per batch entry and head", "sinks"})
    EXPECT_NE(text.find(part), std::string::npos) << text;
  // The spec alone cannot give a modified problem's options.
  EXPECT_THROW(spec.attention_options(), c10::Error);
  const AttentionOptions options = attention_options(spec, inputs);
  EXPECT_EQ(options.softcap, 1.5);
  EXPECT_TRUE(options.alibi_slopes.is_same(inputs.alibi_slopes));
  EXPECT_TRUE(options.sinks.is_same(inputs.sinks));
  EXPECT_TRUE(options.causal);
  // The reference applies them: the same as reference_attention with them,
  // and not the plain attention.
  const AttentionParams params = forward_params(spec, inputs);
  EXPECT_EQ(params.modification.softcap, 1.5f);
  EXPECT_EQ(params.modification.alibi_batch_stride, 4);
  const ForwardReference reference = reference_forward(spec, inputs, params);
  ReferenceOptions direct;
  direct.softmax_scale = params.softmax_scale;
  direct.window_right = 0;
  direct.compute_dtype = at::kDouble;
  direct.modification = reference_modification(spec, inputs);
  const ReferenceOutput expected = reference_attention(inputs.q, inputs.k, inputs.v, direct);
  EXPECT_TRUE(at::allclose(reference.reference.lse, expected.lse));
  direct.modification = {};
  const ReferenceOutput plain = reference_attention(inputs.q, inputs.k, inputs.v, direct);
  EXPECT_GT((reference.reference.lse - plain.lse).abs().max().item<double>(), 1e-3);
}

// Every registered kernel takes the three modifications in its forward and
// backward (fp16, head_dim 64: a problem each takes on a 9.0 device); a kernel
// without them (a tuning configuration) is refused, naming the kernels that do.
TEST(ProblemScoreModificationChoice, RegisteredKernelsTakeThemOthersAreRefusedByName) {
  ProblemSpec spec = modified_spec();
  spec.dtype = at::kHalf;
  spec.head_dim = 64;
  std::string names;
  for (const auto& kernel : registered_kernels()) {
    spec.kernel = kernel.name;
    EXPECT_EQ(unsupported_reason(kernel, spec, 90), "") << kernel.name;
    EXPECT_EQ(backward_unsupported_reason(kernel, spec, 90), "") << kernel.name;
    names += (names.empty() ? "" : ", ") + kernel.name;
  }
  ASSERT_FALSE(tuning_kernels().empty());
  const KernelVariant& tuning = tuning_kernels().front();
  spec.kernel = tuning.name;
  EXPECT_EQ(unsupported_reason(tuning, spec, 90),
            tuning.name + " does not apply softcap, alibi_slopes, sinks (kernels that do: " + names + ")");
}

}  // namespace
}  // namespace flashlab
