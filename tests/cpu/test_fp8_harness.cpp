// The harness's e4m3 problems without a GPU (issue 36; harness/fp8.h): the
// quantization's factors and rounding, the FP8 path's arithmetic held to the
// bound its P rounding allows, the inputs and options an e4m3 spec gives, and
// flashlab-run's option checks. The kernel against them: flashlab-run --dtype
// e4m3 on an H100.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "flashlab/harness/arguments.h"
#include "flashlab/harness/fp8.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/problem_options.h"
#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab {
namespace {

constexpr double kE4m3Max = 448.0;
constexpr double kE4m3Rounding = 1.0 / 16;  // half an ulp of a 3-bit mantissa, relative

// (2, 24, 4, 32) normal values with channel 5 of every row 20x larger.
at::Tensor outlier_values(uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({2, 24, 4, 32}, at::kFloat);
  x.select(-1, 5).mul_(20.0);
  return x;
}

TEST(Fp8Quantize, PerHeadFactorsMapEachGroupsLargestValueTo448) {
  const at::Tensor x = outlier_values(testing::test_seed());
  const Fp8Tensor q = quantize_e4m3(x, /*kv_heads=*/2, Fp8Scaling::per_head);
  ASSERT_EQ(q.values.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(q.descale.sizes(), at::IntArrayRef({2, 2}));
  for (int b = 0; b < 2; ++b)
    for (int g = 0; g < 2; ++g) {
      const at::Tensor group = x[b].narrow(1, 2 * g, 2);  // query heads 2g, 2g + 1 share kv head g
      EXPECT_FLOAT_EQ(q.descale[b][g].item<float>(), group.abs().max().item<float>() / kE4m3Max);
      EXPECT_EQ(q.values[b].narrow(1, 2 * g, 2).to(at::kFloat).abs().max().item<float>(), kE4m3Max);
    }
  // Every value comes back within e4m3's rounding (or its smallest subnormal step).
  const at::Tensor back = dequantize_e4m3(q, at::kDouble);
  const at::Tensor bound = x.to(at::kDouble).abs() * kE4m3Rounding +
                           std::ldexp(1.0, -10) * q.descale.max().item<double>();
  EXPECT_TRUE(((back - x.to(at::kDouble)).abs() <= bound).all().item<bool>());
}

TEST(Fp8Quantize, PerTensorSharesOneFactorAndNoneCastsPlainly) {
  const at::Tensor x = outlier_values(testing::test_seed() + 1);
  const Fp8Tensor tensor = quantize_e4m3(x, 4, Fp8Scaling::per_tensor);
  EXPECT_EQ(tensor.descale.sizes(), at::IntArrayRef({2, 4}));
  EXPECT_TRUE((tensor.descale == x.abs().max() / kE4m3Max).all().item<bool>());
  const Fp8Tensor plain = quantize_e4m3(x * 1000, 4, Fp8Scaling::none);
  EXPECT_TRUE((plain.descale == 1).all().item<bool>());
  EXPECT_EQ(plain.values.to(at::kFloat).abs().max().item<float>(), kE4m3Max);  // saturated, not NaN
  EXPECT_FALSE(at::isnan(plain.values.to(at::kFloat)).any().item<bool>());
  EXPECT_THROW(quantize_e4m3(x, 3, Fp8Scaling::per_head), c10::Error);  // 4 heads over 3 kv heads
}

// Its only rounding on the CPU (no FP8 tensor cores: exact products) is P's: each
// p rounded to e4m3 moves out by at most 1/16 of p x max |v| over the row sum.
TEST(Fp8PathAttention, DepartsFromTheReferenceOnlyByPsRounding) {
  const uint64_t seed = testing::test_seed() + 2;
  const Fp8Tensor q = quantize_e4m3(outlier_values(seed), 2, Fp8Scaling::per_head);
  const Fp8Tensor k = quantize_e4m3(outlier_values(seed + 1).narrow(2, 0, 2), 2, Fp8Scaling::per_head);
  // V without the outlier channel: the bound below is 1/16 of its largest value.
  at::manual_seed(seed + 2);
  const Fp8Tensor v = quantize_e4m3(at::randn({2, 24, 2, 32}, at::kFloat), 2, Fp8Scaling::per_head);
  ReferenceOptions options;
  options.softmax_scale = 1 / std::sqrt(32.0);
  options.window_left = 5, options.window_right = 0;  // causal with a window: some keys masked
  options.compute_dtype = at::kDouble;
  const at::Tensor exact = reference_attention(dequantize_e4m3(q, at::kDouble), dequantize_e4m3(k, at::kDouble),
                                               dequantize_e4m3(v, at::kDouble), options).out;
  const at::Tensor path = fp8_path_attention(q, k, v, options, at::kDouble).out;
  ASSERT_EQ(path.sizes(), exact.sizes());
  const double error = (path - exact).abs().max().item<double>();
  const double bound = kE4m3Rounding * dequantize_e4m3(v, at::kDouble).abs().max().item<double>();
  EXPECT_GT(error, 0.0);  // P was rounded
  EXPECT_LE(error, bound);
  // Its LSE is the reference's up to float64 rounding: only P V rounds P.
  const ReferenceOutput full = fp8_path_attention(q, k, v, options, at::kDouble);
  const at::Tensor exact_lse = reference_attention(dequantize_e4m3(q, at::kDouble), dequantize_e4m3(k, at::kDouble),
                                                   dequantize_e4m3(v, at::kDouble), options).lse;
  EXPECT_TRUE(at::allclose(full.lse, exact_lse, 1e-12, 1e-12));
  // A row that sees no key gives 0 and LSE -inf: a window that ends before the first key.
  options.window_left = 0, options.window_right = 0;
  const ReferenceOutput few_keys = fp8_path_attention({q.values, q.descale}, {k.values.narrow(1, 0, 4), k.descale},
                                                      {v.values.narrow(1, 0, 4), v.descale}, options, at::kDouble);
  EXPECT_TRUE((few_keys.out.narrow(1, 0, 20) == 0).all().item<bool>());  // rows 0..19 map before key 0
  EXPECT_FALSE((few_keys.out.narrow(1, 20, 4) == 0).all().item<bool>());
  EXPECT_TRUE(std::isinf(few_keys.lse[0][0][0].item<double>()));
}

// Packed tokens (cu_seqlens): each sequence is quantized, dequantized and run through
// the FP8 path as the fixed-length batch of one it is; an empty sequence keeps factor 1.
TEST(Fp8Quantize, PackedSequencesAreTheirOwnBatches) {
  const uint64_t seed = testing::test_seed() + 3;
  const at::Tensor cu_q = at::tensor({0, 7, 7, 20}, at::kInt), cu_k = at::tensor({0, 11, 16, 17}, at::kInt);
  at::manual_seed(seed);
  const at::Tensor xq = at::randn({20, 4, 32}, at::kFloat), xk = at::randn({17, 2, 32}, at::kFloat);
  xq.select(-1, 5).mul_(20.0);
  for (const Fp8Scaling scaling : {Fp8Scaling::per_head, Fp8Scaling::per_tensor}) {
    const Fp8Tensor q = quantize_e4m3(xq, 2, scaling, cu_q), k = quantize_e4m3(xk, 2, scaling, cu_k);
    ASSERT_TRUE(q.packed());
    ASSERT_EQ(q.descale.sizes(), at::IntArrayRef({3, 2}));
    if (scaling == Fp8Scaling::per_head) {
      EXPECT_TRUE((q.descale[1] == 1).all().item<bool>());  // no rows
      const Fp8Tensor alone = quantize_e4m3(xq.narrow(0, 7, 13).unsqueeze(0), 2, scaling);
      EXPECT_TRUE(at::equal(q.descale[2], alone.descale[0]));
      EXPECT_TRUE(at::equal(q.values.narrow(0, 7, 13).to(at::kFloat), alone.values[0].to(at::kFloat)));
    } else {
      EXPECT_TRUE((q.descale == xq.abs().max() / kE4m3Max).all().item<bool>());
    }
    EXPECT_TRUE(at::allclose(dequantize_e4m3(q, at::kFloat), xq, kE4m3Rounding, q.descale.max().item<float>()));
    ReferenceOptions options;
    options.softmax_scale = 1 / std::sqrt(32.0);
    options.window_right = 0;
    options.compute_dtype = at::kDouble;
    const ReferenceOutput packed = fp8_path_attention(q, k, k, options, at::kDouble);
    ASSERT_EQ(packed.out.sizes(), at::IntArrayRef({20, 4, 32}));
    ASSERT_EQ(packed.lse.sizes(), at::IntArrayRef({4, 20}));
    const ReferenceOutput first = fp8_path_attention(q.sequence(0, 0, 7), k.sequence(0, 0, 11), k.sequence(0, 0, 11),
                                                     options, at::kDouble);
    EXPECT_TRUE(at::equal(packed.out.narrow(0, 0, 7), first.out[0]));
    EXPECT_TRUE(at::equal(packed.lse.narrow(1, 0, 7), first.lse[0]));
    // Sequence 2 has one key: causal bottom-right, only its last query row sees it.
    EXPECT_TRUE((packed.out.narrow(0, 7, 12) == 0).all().item<bool>());
    EXPECT_TRUE(std::isinf(packed.lse[0][7].item<double>()));
    EXPECT_FALSE((packed.out[19] == 0).all().item<bool>());
  }
  EXPECT_THROW(quantize_e4m3(xq.unsqueeze(0), 2, Fp8Scaling::per_head, cu_q), c10::Error);  // 4-D with offsets
}

TEST(Fp8Quantize, RandomHadamardIsOrthogonalAndKeepsScores) {
  const at::Tensor rotation = random_hadamard(32, testing::test_seed(), at::kCPU).to(at::kDouble);
  EXPECT_TRUE(at::allclose(at::matmul(rotation, rotation.t()), at::eye(32, at::kDouble), 0, 1e-6));
  EXPECT_TRUE((rotation.abs() - 1 / std::sqrt(32.0)).abs().max().item<double>() < 1e-7);
  EXPECT_FALSE(at::equal(rotation, random_hadamard(32, testing::test_seed() + 1, at::kCPU).to(at::kDouble)));
  // An outlier channel spreads over every channel: the largest |value| drops.
  const at::Tensor x = outlier_values(testing::test_seed()).to(at::kDouble);
  EXPECT_LT(at::matmul(x, rotation).abs().max().item<double>(), 0.5 * x.abs().max().item<double>());
  EXPECT_THROW(random_hadamard(48, 0, at::kCPU), c10::Error);
}

TEST(Fp8ErrorSummary, IsRootMeanSquareAndLargestOverFiniteReference) {
  const at::Tensor expected = at::tensor({1.0, 2.0, INFINITY, 4.0}, at::kDouble);
  const ErrorSummary summary = error_summary(at::tensor({1.0, 2.3, 0.0, 3.6}, at::kDouble), expected);
  EXPECT_NEAR(summary.rmse, std::sqrt((0.09 + 0.16) / 3), 1e-12);
  EXPECT_NEAR(summary.max_abs, 0.4, 1e-12);
  EXPECT_TRUE(std::isinf(error_summary(at::tensor({NAN, 2.0, 0.0, 4.0}, at::kDouble), expected).max_abs));
}

ProblemSpec fp8_spec() {
  ProblemSpec spec;
  spec.kernel = "fa3_wgmma_sm90";
  spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
  spec.seqlen_q = 7, spec.seqlen_k = 13, spec.head_dim = 128;
  spec.dtype = at::kFloat8_e4m3fn;
  spec.outliers = true;
  spec.seed = testing::test_seed();
  return spec;
}

TEST(Fp8Problem, InputsAreQuantizedDrawsWithTheirFactorsAndOptions) {
  const ProblemSpec spec = fp8_spec();
  const ProblemInputs inputs = make_inputs(spec, at::kCPU);
  ASSERT_EQ(inputs.q.scalar_type(), at::kFloat8_e4m3fn);
  ASSERT_EQ(inputs.q_source.scalar_type(), at::kFloat);
  EXPECT_EQ(inputs.k_descale.sizes(), at::IntArrayRef({2, 2}));
  // Outlier channels 3..6 of the float32 draws: 20x.
  EXPECT_GT(inputs.q_source.narrow(-1, 3, 4).abs().mean().item<float>(),
            10 * inputs.q_source.narrow(-1, 8, 64).abs().mean().item<float>());
  EXPECT_TRUE(at::allclose(dequantize_e4m3(inputs.v8(), at::kFloat), inputs.v_source, kE4m3Rounding,
                           inputs.v_descale.max().item<float>()));
  const AttentionOptions options = attention_options(spec, inputs);
  EXPECT_TRUE(options.q_descale.is_same(inputs.q_descale));
  EXPECT_TRUE(options.v_descale.is_same(inputs.v_descale));
  EXPECT_EQ(options.output_dtype, at::kBFloat16);
  EXPECT_THROW(spec.attention_options(), c10::Error);  // the factors come with the inputs
  EXPECT_EQ(poisoned_forward_outputs(spec, inputs).out.scalar_type(), at::kBFloat16);
  const std::string text = spec.describe();
  for (const char* part : {"Float8_e4m3fn (descale per-head, output BFloat16)", "outlier channels 3-6 x20"})
    EXPECT_NE(text.find(part), std::string::npos) << text;
  // Shapes only (support checks): no draw, factors of one.
  const ProblemInputs shapes = make_inputs(spec, at::kCPU, /*random=*/false);
  EXPECT_EQ(shapes.q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_TRUE((shapes.q_descale == 1).all().item<bool>());
  EXPECT_EQ(unsupported_reason(*find_kernel("fa3_wgmma_sm90"), spec, 90), "");
  EXPECT_NE(unsupported_reason(*find_kernel("fa2_mma_sm80"), spec, 90).find("e4m3"), std::string::npos);
}

TEST(Fp8Problem, HadamardRotatesWhatIsQuantizedNotTheSources) {
  ProblemSpec spec = fp8_spec();
  spec.head_dim = 32;  // a power of two
  const ProblemInputs plain = make_inputs(spec, at::kCPU);
  spec.fp8_hadamard = true;
  const ProblemInputs rotated = make_inputs(spec, at::kCPU);
  EXPECT_TRUE(at::equal(rotated.q_source, plain.q_source));  // the same draw, unrotated
  EXPECT_FALSE(at::equal(rotated.q.to(at::kFloat), plain.q.to(at::kFloat)));
  // (q R)(k R)^T = q k^T: the dequantized rotated values' scores are the sources' up to e4m3's rounding.
  const auto scores = [](const at::Tensor& q, const at::Tensor& k) {
    return at::einsum("bqhd,bkhd->bhqk", {q.to(at::kDouble), k.to(at::kDouble).repeat_interleave(2, 2)});
  };
  const at::Tensor exact = scores(rotated.q_source, rotated.k_source);
  const at::Tensor quantized = scores(dequantize_e4m3(rotated.q8(), at::kDouble), dequantize_e4m3(rotated.k8(), at::kDouble));
  const double scale = exact.abs().max().item<double>();
  EXPECT_LT((quantized - exact).abs().max().item<double>(), 0.2 * scale);
  EXPECT_GT((quantized - exact).abs().max().item<double>(), 0.0);
}

TEST(Fp8Problem, OptionsSayWhatGoesWithE4m3) {
  const auto refused = [](std::vector<std::string> arguments, const std::string& expected) {
    try {
      parse_problem(arguments, "flashlab-run", false);
      ADD_FAILURE() << "accepted; expected: " << expected;
    } catch (const ArgumentError& error) {
      EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
    }
  };
  refused({"--descale", "none"}, "go with --dtype e4m3");
  refused({"--out-dtype", "fp16", "--dtype", "bf16"}, "go with --dtype e4m3");
  refused({"--dtype", "e4m3", "--layout", "packed-qkv"}, "takes the bshd layout");
  refused({"--dtype", "e4m3", "--descale", "per-row"}, "per-head, per-tensor, none");
  refused({"--hadamard"}, "go with --dtype e4m3");
  refused({"--dtype", "e4m3", "--hadamard", "--head-dim", "96"}, "--hadamard needs a power-of-two --head-dim");
  EXPECT_TRUE(parse_problem({"--dtype", "e4m3", "--seqlens", "3,4"}, "flashlab-run", false).is_varlen());
  const ProblemSpec spec =
      parse_problem({"--dtype", "e4m3", "--descale", "per-tensor", "--out-dtype", "fp16", "--outliers"},
                    "flashlab-run", false);
  EXPECT_TRUE(spec.is_fp8());
  EXPECT_EQ(spec.fp8_scaling, Fp8Scaling::per_tensor);
  EXPECT_EQ(spec.output_dtype(), at::kHalf);
  EXPECT_TRUE(spec.outliers);
}

}  // namespace
}  // namespace flashlab
