// Every input check of attention_forward, provoked on CPU tensors: structure is
// checked before the device, so each message can be seen without a GPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "flashlab/attention.h"
#include "flashlab/kernel_registry.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

struct Inputs {
  at::Tensor q = cpu_tensor({2, 16, 8, 64});
  at::Tensor k = cpu_tensor({2, 32, 2, 64});
  at::Tensor v = cpu_tensor({2, 32, 2, 64});
  AttentionOptions options;
  void run() const { attention_forward(q, k, v, options); }
};

// Score modifications (issue 33): checked with the inputs, on CPU tensors.
TEST(Validation, ScoreModificationsSayWhatTheyExpect) {
  Inputs inputs;  // batch 2, 8 query heads
  inputs.options.softcap = -1.0;
  expect_rejected([&] { inputs.run(); }, {"softcap must be finite and >= 0", "got -1"});
  inputs.options.softcap = 0.0;
  inputs.options.alibi_slopes = cpu_tensor({4}, at::kFloat);
  expect_rejected([&] { inputs.run(); },
                  {"alibi_slopes must be float32 of shape (heads) = (8) or (batch, heads) = (2, 8)", "got [4]"});
  inputs.options.alibi_slopes = cpu_tensor({2, 8}, at::kDouble);
  expect_rejected([&] { inputs.run(); }, {"alibi_slopes must be float32", "got Double"});
  inputs.options.alibi_slopes = cpu_tensor({8, 2}, at::kFloat).t();
  expect_rejected([&] { inputs.run(); }, {"alibi_slopes must be contiguous"});
  inputs.options.alibi_slopes = at::Tensor();
  inputs.options.sinks = cpu_tensor({2, 8}, at::kFloat);
  expect_rejected([&] { inputs.run(); }, {"sinks must be float32 of shape (heads) = (8)", "got [2, 8]"});
}

// A kernel refuses a modification it does not apply in a mode, naming it and
// the registered kernels that apply it there, before any other reason. (Every
// registered kernel applies all three in its forward and backward, and
// fa2_mma_sm80 in its KV-cache path: a copy with the mode's flags off stands in.)
TEST(Validation, KernelsRefuseScoreModificationsTheyDoNotApply) {
  const float slopes[8] = {}, sinks[8] = {};
  using Support = KernelVariant::ScoreModifications;
  const auto having = [](Support KernelVariant::*mode) {
    std::string names;
    for (const auto& kernel : registered_kernels())
      if ((kernel.*mode).softcap) names += (names.empty() ? "" : ", ") + kernel.name;
    return names.empty() ? std::string("none") : names;
  };
  EXPECT_NE(having(&KernelVariant::forward_score_modifications), "none");
  EXPECT_NE(having(&KernelVariant::backward_score_modifications), "none");
  EXPECT_NE(having(&KernelVariant::kvcache_score_modifications), "none");
  for (const auto& registered : registered_kernels()) {
    KernelVariant kernel = registered;
    kernel.name = registered.name + "_without";
    kernel.forward_score_modifications = kernel.backward_score_modifications = kernel.kvcache_score_modifications = {};
    AttentionParams params;
    EXPECT_EQ(score_modification_reason(kernel, params.modification), "") << kernel.name;
    params.modification.softcap = 30.f;
    params.modification.alibi_slopes = slopes;
    EXPECT_EQ(score_modification_reason(kernel, params.modification),
              kernel.name + " does not apply softcap, alibi_slopes (kernels that do: " +
                  having(&KernelVariant::forward_score_modifications) + ")");
    EXPECT_EQ(score_modification_reason(kernel, params.modification, &KernelVariant::backward_score_modifications,
                                        "'s backward"),
              kernel.name + "'s backward does not apply softcap, alibi_slopes (kernels whose backward does: " +
                  having(&KernelVariant::backward_score_modifications) + ")");
    EXPECT_EQ(score_modification_reason(kernel, params.modification, &KernelVariant::kvcache_score_modifications,
                                        "'s KV-cache path"),
              kernel.name + "'s KV-cache path does not apply softcap, alibi_slopes (kernels whose KV-cache path does: " +
                  having(&KernelVariant::kvcache_score_modifications) + ")");
    // The registered kernel itself applies them in its forward.
    EXPECT_EQ(score_modification_reason(registered, params.modification), "") << registered.name;
    params.modification.softcap = 0.f;
    params.modification.alibi_slopes = nullptr;
    params.modification.sinks = sinks;
    params.head_dim = 100000;  // a problem reason too: the modification's comes first
    EXPECT_EQ(cannot_run_reason(kernel, params),
              kernel.name + " does not apply sinks (kernels that do: " +
                  having(&KernelVariant::forward_score_modifications) + ")");
  }
}

TEST(Validation, RankMustBeFour) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 16, 512});
  expect_rejected([&] { inputs.run(); }, {"q must be 4-D", "got a 3-D tensor", "[2, 16, 512]"});
}

TEST(Validation, UnsupportedDtype) {
  Inputs inputs;
  inputs.k = cpu_tensor({2, 32, 2, 64}, at::kDouble);
  expect_rejected([&] { inputs.run(); }, {"k has dtype Double", "Float, Half, BFloat16 and Float8_e4m3fn"});
}

TEST(Validation, MixedDtypes) {
  Inputs inputs;
  inputs.v = cpu_tensor({2, 32, 2, 64}, at::kBFloat16);
  expect_rejected([&] { inputs.run(); }, {"share one dtype", "q Half", "v BFloat16"});
}

TEST(Validation, KeyValueShapesDiffer) {
  Inputs inputs;
  inputs.v = cpu_tensor({2, 31, 2, 64});
  expect_rejected([&] { inputs.run(); }, {"k and v must have the same shape", "[2, 32, 2, 64]", "[2, 31, 2, 64]"});
}

TEST(Validation, BatchDiffers) {
  Inputs inputs;
  inputs.q = cpu_tensor({3, 16, 8, 64});
  expect_rejected([&] { inputs.run(); }, {"same batch size", "[3, 16, 8, 64]"});
}

TEST(Validation, HeadDimDiffers) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 16, 8, 32});
  expect_rejected([&] { inputs.run(); }, {"same head_dim", "[2, 16, 8, 32]", "[2, 32, 2, 64]"});
}

TEST(Validation, EmptyDimension) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 0, 8, 64});
  expect_rejected([&] { inputs.run(); }, {"must all be >= 1", "[2, 0, 8, 64]"});
}

TEST(Validation, HeadsNotMultipleOfKvHeads) {
  Inputs inputs;
  inputs.k = cpu_tensor({2, 32, 3, 64});
  inputs.v = cpu_tensor({2, 32, 3, 64});
  expect_rejected([&] { inputs.run(); }, {"q has 8 heads", "multiple of the 3 heads", "GQA/MQA"});
}

TEST(Validation, LastDimensionMustBeContiguous) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 16, 64, 8}).transpose(2, 3);
  expect_rejected([&] { inputs.run(); }, {"q must have a contiguous last dimension", "strides"});
}

TEST(Validation, WindowBelowMinusOne) {
  Inputs inputs;
  inputs.options.window_left = -2;
  expect_rejected([&] { inputs.run(); }, {"window_left and window_right must be >= -1", "(-2, -1)"});
}

TEST(Validation, SoftmaxScaleMustBeFinite) {
  Inputs inputs;
  inputs.options.softmax_scale = std::numeric_limits<double>::infinity();
  expect_rejected([&] { inputs.run(); }, {"softmax_scale must be finite", "inf"});
}

TEST(Validation, InputsOnDifferentDevices) {
  Inputs inputs;
  inputs.k = at::empty({2, 32, 2, 64}, at::TensorOptions().dtype(at::kHalf).device(at::kMeta));
  expect_rejected([&] { inputs.run(); }, {"must be on one device", "q on cpu", "k on meta"});
}

TEST(Validation, UnknownKernelListsRegisteredOnes) {
  Inputs inputs;
  inputs.options.kernel = "fa9_imaginary";
  expect_rejected([&] { inputs.run(); },
                  {"unknown kernel 'fa9_imaginary'", registered_kernel_names(), "(or auto)"});
}

TEST(Validation, KernelRejectsHeadDim) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 16, 8, 160});
  inputs.k = cpu_tensor({2, 32, 2, 160});
  inputs.v = cpu_tensor({2, 32, 2, 160});
  inputs.options.kernel = "fa1_scalar";
  expect_rejected([&] { inputs.run(); },
                  {"kernel fa1_scalar cannot run", "head_dim 160", "supports head_dim 1 to 128"});
}

TEST(Validation, AutoFindsNoKernel) {
  Inputs inputs;
  inputs.q = cpu_tensor({2, 16, 8, 1000});
  inputs.k = cpu_tensor({2, 32, 2, 1000});
  inputs.v = cpu_tensor({2, 32, 2, 1000});
  expect_rejected([&] { inputs.run(); }, {"no registered kernel can run", "head_dim 1000", "fa1_scalar"});
}

TEST(Validation, OutputBufferMustMatch) {
  Inputs inputs;
  const at::Tensor out = cpu_tensor({2, 16, 8, 32});
  const at::Tensor lse = at::zeros({2, 8, 16}, at::kFloat);
  expect_rejected([&] { attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse); },
                  {"out must match q in shape and dtype", "[2, 16, 8, 32]"});
}

TEST(Validation, LseBufferMustMatch) {
  Inputs inputs;
  const at::Tensor out = cpu_tensor({2, 16, 8, 64});
  const at::Tensor lse = at::zeros({2, 16, 8}, at::kFloat);
  expect_rejected([&] { attention_forward_into(inputs.q, inputs.k, inputs.v, out, lse); },
                  {"lse must be a contiguous float32 tensor", "(batch, heads, seqlen_q) = [2, 8, 16]"});
}

TEST(Validation, TensorsMustBeOnCuda) {
  Inputs inputs;  // a valid problem, but on the CPU
  expect_rejected([&] { inputs.run(); }, {"must be on a CUDA device", "got cpu"});
}

TEST(Validation, ValidProblemSelectsAKernel) {
  Inputs inputs;
  const KernelVariant& kernel = select_kernel(inputs.q, inputs.k, inputs.v, inputs.options);
  EXPECT_FALSE(kernel.name.empty());
  EXPECT_EQ(kernel.unsupported_reason(make_params(inputs.q, inputs.k, inputs.v, {}, {}, inputs.options)), "");
}

}  // namespace
}  // namespace flashlab
