// Every input check of attention_varlen_forward, provoked on CPU tensors (the
// varlen checks run before the device check; those of the offsets' values in
// strict mode), plus the varlen reference and the varlen harness inputs, which
// need no GPU either.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

at::Tensor offsets(std::vector<int> values, at::ScalarType dtype = at::kInt) {
  return at::tensor(values, at::TensorOptions().dtype(at::kInt)).to(dtype);
}

// Three sequences: queries 5, 0, 11 (16 tokens); keys 7, 3, 0 (10 tokens).
struct VarlenInputs {
  at::Tensor q = cpu_tensor({16, 8, 64});
  at::Tensor k = cpu_tensor({10, 2, 64});
  at::Tensor v = cpu_tensor({10, 2, 64});
  at::Tensor cu_seqlens_q = offsets({0, 5, 5, 16});
  at::Tensor cu_seqlens_k = offsets({0, 7, 10, 10});
  int max_seqlen_q = 11, max_seqlen_k = 7;
  AttentionOptions options;
  void run() const {
    attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             options);
  }
};

// ALiBi slopes per batch entry count the sequences (cu_seqlens), not q's rows.
TEST(VarlenValidation, AlibiSlopesPerSequence) {
  VarlenInputs inputs;
  inputs.options.alibi_slopes = cpu_tensor({2, 8}, at::kFloat);
  expect_rejected([&] { inputs.run(); }, {"alibi_slopes must be float32 of shape (heads) = (8) or (batch, heads) = (3, 8)",
                                          "got [2, 8]"});
}

// The inputs with strict checks: the offsets' values are read on the host.
VarlenInputs strict() {
  VarlenInputs inputs;
  inputs.options.strict_checks = true;
  return inputs;
}

TEST(VarlenValidation, RankMustBeThree) {
  VarlenInputs inputs;
  inputs.q = cpu_tensor({1, 16, 8, 64});
  expect_rejected([&] { inputs.run(); },
                  {"q must be 3-D (total_q, heads, head_dim)", "got a 4-D tensor", "[1, 16, 8, 64]"});
}

TEST(VarlenValidation, KeyValueShapesDiffer) {
  VarlenInputs inputs;
  inputs.v = cpu_tensor({9, 2, 64});
  expect_rejected([&] { inputs.run(); },
                  {"k and v must have the same shape", "[10, 2, 64]", "[9, 2, 64]"});
}

TEST(VarlenValidation, HeadDimDiffers) {
  VarlenInputs inputs;
  inputs.q = cpu_tensor({16, 8, 32});
  expect_rejected([&] { inputs.run(); }, {"same head_dim", "[16, 8, 32]", "[10, 2, 64]"});
}

TEST(VarlenValidation, FixedLengthChecksStillApply) {
  VarlenInputs inputs;
  inputs.k = cpu_tensor({10, 3, 64});
  inputs.v = cpu_tensor({10, 3, 64});
  expect_rejected([&] { inputs.run(); }, {"q has 8 heads", "multiple of the 3 heads"});
  VarlenInputs mixed;
  mixed.v = cpu_tensor({10, 2, 64}, at::kBFloat16);
  expect_rejected([&] { mixed.run(); }, {"share one dtype", "v BFloat16"});
}

TEST(VarlenValidation, CuSeqlensMustBeDefined) {
  VarlenInputs inputs;
  inputs.cu_seqlens_k = at::Tensor();
  expect_rejected([&] { inputs.run(); }, {"cu_seqlens_k must be a defined tensor"});
}

TEST(VarlenValidation, CuSeqlensMustBeInt32) {
  VarlenInputs inputs;
  inputs.cu_seqlens_q = offsets({0, 5, 5, 16}, at::kLong);
  expect_rejected([&] { inputs.run(); }, {"cu_seqlens_q must have dtype Int (int32)", "got Long"});
}

TEST(VarlenValidation, CuSeqlensMustBeOneDimensional) {
  VarlenInputs inputs;
  inputs.cu_seqlens_k = offsets({0, 7, 10, 10}).view({2, 2});
  expect_rejected([&] { inputs.run(); }, {"cu_seqlens_k must be 1-D", "2-D", "[2, 2]"});
}

TEST(VarlenValidation, CuSeqlensLengthsDiffer) {
  VarlenInputs inputs;
  inputs.cu_seqlens_k = offsets({0, 7, 10});
  expect_rejected([&] { inputs.run(); },
                  {"cu_seqlens_q and cu_seqlens_k must have the same length", "got 4 and 3"});
}

TEST(VarlenValidation, CuSeqlensNeedsOneSequence) {
  VarlenInputs inputs;
  inputs.cu_seqlens_q = offsets({0});
  inputs.cu_seqlens_k = offsets({0});
  expect_rejected([&] { inputs.run(); }, {"need at least 2 elements", "got 1"});
}

TEST(VarlenValidation, CuSeqlensOnAnotherDevice) {
  // A meta tensor stands in for "not q's device": its values are never read.
  VarlenInputs inputs;
  inputs.cu_seqlens_q = at::empty({4}, at::TensorOptions().dtype(at::kInt).device(at::kMeta));
  expect_rejected([&] { inputs.run(); }, {"must be on q's device cpu", "got meta and cpu"});
}

TEST(VarlenValidation, CuSeqlensMustStartAtZero) {
  VarlenInputs inputs = strict();
  inputs.cu_seqlens_q = offsets({1, 5, 5, 16});
  expect_rejected([&] { inputs.run(); }, {"cu_seqlens_q must start at 0", "got 1"});
}

TEST(VarlenValidation, CuSeqlensMustNotDecrease) {
  VarlenInputs inputs = strict();
  inputs.cu_seqlens_k = offsets({0, 7, 3, 10});
  expect_rejected([&] { inputs.run(); },
                  {"cu_seqlens_k must be non-decreasing", "cu_seqlens_k[1] = 7 followed by 3"});
}

TEST(VarlenValidation, LastOffsetMustEqualQueryTokens) {
  VarlenInputs inputs = strict();
  inputs.cu_seqlens_q = offsets({0, 5, 5, 15});
  expect_rejected([&] { inputs.run(); },
                  {"last element of cu_seqlens_q", "number of tokens in q (16)", "got 15"});
}

TEST(VarlenValidation, LastOffsetMustEqualKeyTokens) {
  VarlenInputs inputs = strict();
  inputs.cu_seqlens_k = offsets({0, 7, 10, 12});
  expect_rejected([&] { inputs.run(); },
                  {"last element of cu_seqlens_k", "number of tokens in k (10)", "got 12"});
}

TEST(VarlenValidation, MaxSeqlenQBelowLongestSequence) {
  VarlenInputs inputs = strict();
  inputs.max_seqlen_q = 10;
  expect_rejected([&] { inputs.run(); },
                  {"max_seqlen_q must be at least the longest sequence (11 tokens in cu_seqlens_q)",
                   "got 10"});
}

TEST(VarlenValidation, MaxSeqlenKBelowLongestSequence) {
  VarlenInputs inputs = strict();
  inputs.max_seqlen_k = 6;
  expect_rejected([&] { inputs.run(); },
                  {"max_seqlen_k must be at least the longest sequence (7 tokens", "got 6"});
}

TEST(VarlenValidation, NegativeMaxSeqlenInEveryMode) {
  VarlenInputs inputs;
  inputs.max_seqlen_k = -1;
  expect_rejected([&] { inputs.run(); }, {"max_seqlen_q and max_seqlen_k must be >= 0; got 11 and -1"});
}

// By default the offsets are not read on the host (that would be a sync per
// call): bad ones get as far as the device check here; on a GPU the offsets
// guard reports them (tests/gpu/test_device_values.cpp).
TEST(VarlenValidation, DefaultModeReadsNoOffset) {
  for (const auto& [cu_q, cu_k, max_q] :
       {std::tuple{std::vector<int>{1, 5, 5, 16}, std::vector<int>{0, 7, 10, 10}, 11},
        {std::vector<int>{0, 5, 5, 16}, std::vector<int>{0, 7, 3, 10}, 11},
        {std::vector<int>{0, 5, 5, 15}, std::vector<int>{0, 7, 10, 12}, 2}}) {
    VarlenInputs inputs;
    inputs.options.strict_checks = false;
    inputs.cu_seqlens_q = offsets(cu_q);
    inputs.cu_seqlens_k = offsets(cu_k);
    inputs.max_seqlen_q = max_q;
    expect_rejected([&] { inputs.run(); }, {"q, k and v must be on a CUDA device; got cpu"});
  }
}

TEST(VarlenValidation, OutputBufferMustMatch) {
  VarlenInputs inputs;
  const at::Tensor out = cpu_tensor({16, 8, 32});
  const at::Tensor lse = at::zeros({8, 16}, at::kFloat);
  expect_rejected(
      [&] {
        attention_varlen_forward_into(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q,
                                      inputs.cu_seqlens_k, inputs.max_seqlen_q,
                                      inputs.max_seqlen_k, out, lse);
      },
      {"out must match q in shape and dtype", "[16, 8, 32]"});
}

TEST(VarlenValidation, LseBufferMustMatch) {
  VarlenInputs inputs;
  const at::Tensor out = cpu_tensor({16, 8, 64});
  const at::Tensor lse = at::zeros({1, 8, 16}, at::kFloat);
  expect_rejected(
      [&] {
        attention_varlen_forward_into(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q,
                                      inputs.cu_seqlens_k, inputs.max_seqlen_q,
                                      inputs.max_seqlen_k, out, lse);
      },
      {"lse must be a contiguous float32 tensor of shape (heads, total_q) = [8, 16]", "[1, 8, 16]"});
}

TEST(VarlenValidation, TensorsMustBeOnCuda) {
  VarlenInputs inputs;  // a valid problem, but on the CPU
  expect_rejected([&] { inputs.run(); }, {"must be on a CUDA device", "got cpu"});
}

TEST(VarlenValidation, AllSequencesEmptyIsValid) {
  VarlenInputs inputs;
  inputs.q = cpu_tensor({0, 8, 64});
  inputs.cu_seqlens_q = offsets({0, 0, 0, 0});
  inputs.max_seqlen_q = 0;
  expect_rejected([&] { inputs.run(); }, {"must be on a CUDA device"});  // got past every check
}

TEST(VarlenValidation, ParamsDescribeThePackedBatch) {
  VarlenInputs inputs;
  const KernelVariant& kernel =
      select_varlen_kernel(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                           inputs.max_seqlen_q, inputs.max_seqlen_k, inputs.options);
  const at::Tensor out = cpu_tensor({16, 8, 64});
  const at::Tensor lse = at::zeros({8, 16}, at::kFloat);
  const AttentionParams params =
      make_varlen_params(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q, inputs.cu_seqlens_k,
                         inputs.max_seqlen_q, inputs.max_seqlen_k, out, lse, inputs.options);
  EXPECT_EQ(kernel.unsupported_reason(params), "");
  EXPECT_TRUE(params.is_varlen());
  EXPECT_EQ(params.batch, 3);
  EXPECT_EQ(params.seqlen_q, 11);
  EXPECT_EQ(params.seqlen_k, 7);
  EXPECT_EQ(params.q_batch_stride, 0);
  EXPECT_EQ(params.out_batch_stride, 0);
  EXPECT_EQ(params.q_row_stride, 8 * 64);
  EXPECT_EQ(params.k_row_stride, 2 * 64);
  EXPECT_EQ(params.out_row_stride, 8 * 64);
  EXPECT_EQ(params.out_head_stride, 64);
  EXPECT_EQ(params.lse_batch_stride, 0);
  EXPECT_EQ(params.lse_head_stride, 16);
}

// The varlen reference is the fixed-length reference applied sequence by sequence.
TEST(VarlenReference, MatchesPerSequenceReference) {
  const std::vector<int> seqlens_q = {3, 0, 9, 1}, seqlens_k = {5, 4, 2, 0};
  const at::Tensor cu_seqlens_q = offsets({0, 3, 3, 12, 13});
  const at::Tensor cu_seqlens_k = offsets({0, 5, 9, 11, 11});
  const at::Tensor q = at::randn({13, 4, 16}, at::kDouble);
  const at::Tensor k = at::randn({11, 2, 16}, at::kDouble);
  const at::Tensor v = at::randn({11, 2, 16}, at::kDouble);
  ReferenceOptions options;
  options.softmax_scale = 0.25;
  options.window_left = 1;
  options.window_right = 0;
  options.compute_dtype = at::kDouble;
  const ReferenceOutput packed =
      reference_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options);
  ASSERT_EQ(packed.out.sizes(), at::IntArrayRef({13, 4, 16}));
  ASSERT_EQ(packed.lse.sizes(), at::IntArrayRef({4, 13}));
  int q_start = 0, k_start = 0;
  for (size_t sequence = 0; sequence < seqlens_q.size(); ++sequence) {
    const int seqlen_q = seqlens_q[sequence], seqlen_k = seqlens_k[sequence];
    const at::Tensor out = packed.out.narrow(0, q_start, seqlen_q);
    const at::Tensor lse = packed.lse.narrow(1, q_start, seqlen_q);
    if (seqlen_k == 0) {
      // Queries with no keys: output 0, LSE -inf.
      EXPECT_TRUE(out.eq(0).all().item<bool>()) << "sequence " << sequence;
      EXPECT_TRUE(lse.eq(-std::numeric_limits<double>::infinity()).all().item<bool>());
    } else if (seqlen_q > 0) {
      const ReferenceOutput one = reference_attention(
          q.narrow(0, q_start, seqlen_q).unsqueeze(0), k.narrow(0, k_start, seqlen_k).unsqueeze(0),
          v.narrow(0, k_start, seqlen_k).unsqueeze(0), options);
      EXPECT_TRUE(at::equal(out, one.out.squeeze(0))) << "sequence " << sequence;
      EXPECT_TRUE(at::equal(lse, one.lse.squeeze(0))) << "sequence " << sequence;
    }
    q_start += seqlen_q;
    k_start += seqlen_k;
  }
}

TEST(VarlenHarness, MakeInputsPacksTheSequences) {
  ProblemSpec spec;
  spec.heads = 4, spec.kv_heads = 2, spec.head_dim = 32;
  spec.seqlens_q = {1, 0, 513, 7};
  spec.seqlens_k = {3, 5, 0, 7};
  const ProblemInputs inputs = make_inputs(spec, at::kCPU, /*random=*/false);
  EXPECT_EQ(inputs.q.sizes(), at::IntArrayRef({521, 4, 32}));
  EXPECT_EQ(inputs.k.sizes(), at::IntArrayRef({15, 2, 32}));
  EXPECT_EQ(inputs.v.sizes(), at::IntArrayRef({15, 2, 32}));
  EXPECT_TRUE(at::equal(inputs.cu_seqlens_q, offsets({0, 1, 1, 514, 521})));
  EXPECT_TRUE(at::equal(inputs.cu_seqlens_k, offsets({0, 3, 8, 8, 15})));
  EXPECT_EQ(inputs.max_seqlen_q, 513);
  EXPECT_EQ(inputs.max_seqlen_k, 7);
  const std::string described = spec.describe();
  EXPECT_NE(described.find("seqlens_q [1,0,513,7]"), std::string::npos) << described;
  EXPECT_NE(described.find("seqlens_k [3,5,0,7]"), std::string::npos) << described;
}

TEST(VarlenHarness, KeyLengthsDefaultToQueryLengths) {
  ProblemSpec spec;
  spec.seqlens_q = {4, 9};
  spec.layout = Layout::packed_qkv;
  const ProblemInputs inputs = make_inputs(spec, at::kCPU, /*random=*/false);
  EXPECT_EQ(inputs.q.sizes(), at::IntArrayRef({13, spec.heads, spec.head_dim}));
  EXPECT_EQ(inputs.k.sizes(), at::IntArrayRef({13, spec.kv_heads, spec.head_dim}));
  EXPECT_TRUE(inputs.q.is_alias_of(inputs.k));  // views of one (total, H + 2 Hkv, D) buffer
  EXPECT_TRUE(at::equal(inputs.cu_seqlens_q, inputs.cu_seqlens_k));
}

TEST(VarlenHarness, MismatchedSequenceCountsAreRejected) {
  ProblemSpec spec;
  spec.seqlens_q = {4, 9};
  spec.seqlens_k = {4};
  expect_rejected([&] { make_inputs(spec, at::kCPU, /*random=*/false); },
                  {"same number of sequences", "got 2 and 1"});
}

TEST(VarlenHarness, EveryKernelAnswersForAVarlenSpec) {
  ProblemSpec spec;
  spec.seqlens_q = {1, 0, 513, 7, 1000};
  for (const auto& kernel : registered_kernels())
    EXPECT_NO_THROW(unsupported_reason(kernel, spec)) << kernel.name;
}

}  // namespace
}  // namespace flashlab
