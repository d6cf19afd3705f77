// The check's named steps on the CPU (no kernel): torch's same-precision
// attention, standing in for a kernel, passes the forward rule; poisoned
// outputs fail everywhere; one planted error is found where it was planted.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>

#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

struct Steps {
  ProblemInputs inputs;
  AttentionParams params;
  ForwardReference reference;
  ForwardTolerance tolerance;
};

Steps run_steps(const ProblemSpec& spec) {
  Steps steps;
  steps.inputs = make_inputs(spec, at::kCPU);
  steps.params = forward_params(spec, steps.inputs);
  steps.reference = reference_forward(spec, steps.inputs, steps.params);
  steps.tolerance = forward_tolerance(spec, steps.reference);
  return steps;
}

// torch's own result in the input dtype, as a kernel would write it.
ForwardOutputs same_precision_outputs(const Steps& steps) {
  return {steps.reference.same_precision.out.contiguous(),
          steps.reference.same_precision.lse.to(at::kFloat).contiguous()};
}

// One test per layout: the inputs come from the host MT19937 generator, whose
// seeding takes seconds, so the steps share one problem.
class CheckSteps : public ::testing::TestWithParam<bool> {};

TEST_P(CheckSteps, ComposeIntoFlashAttnRule) {
  const ProblemSpec problem = GetParam() ? steps_varlen_spec({11, 3, 29, 0}) : steps_fixed_length_spec();
  SCOPED_TRACE(problem.describe());
  const Steps steps = run_steps(problem);
  const TileShape tiles{64, 32};

  {
    SCOPED_TRACE("the tolerance is flash-attn's rule");
    for (const Tolerance* tolerance : {&steps.tolerance.out, &steps.tolerance.lse}) {
      EXPECT_EQ(tolerance->bound(), 2 * tolerance->same_precision_err + tolerance->rounding_atol +
                                        tolerance->float32_floor);
      EXPECT_GT(tolerance->same_precision_err, 0);  // fp16 math differs from float32 somewhere
    }
    const at::Tensor out = steps.reference.reference.out;
    EXPECT_EQ(out.scalar_type(), at::kFloat);
    const double largest = out.abs().max().item<double>();
    EXPECT_DOUBLE_EQ(steps.tolerance.out.float32_floor, 4 * FLT_EPSILON * largest);
    // fwd_atol: about one fp16 ulp at the output's largest magnitude (plus 0.3).
    EXPECT_GT(steps.tolerance.out.rounding_atol, 0);
    EXPECT_LE(steps.tolerance.out.rounding_atol, 4 * (largest + 0.3) * 0x1p-10);
  }
  {
    SCOPED_TRACE("torch's same-precision result, standing in for a kernel, passes");
    const ForwardComparison comparison = compare_forward(
        problem, steps.params, tiles, same_precision_outputs(steps), steps.reference, steps.tolerance);
    EXPECT_TRUE(comparison.out.passed()) << comparison.out.format();
    EXPECT_TRUE(comparison.lse.passed()) << comparison.lse.format();
    EXPECT_EQ(comparison.out.total, steps.inputs.q.numel());
    EXPECT_EQ(comparison.lse.total, steps.inputs.q.numel() / problem.head_dim);
    EXPECT_GT(comparison.out.max_abs_error, 0);
  }
  {
    SCOPED_TRACE("poisoned outputs fail everywhere");
    const ForwardOutputs poisoned = poisoned_forward_outputs(problem, steps.inputs);
    EXPECT_EQ(poisoned.out.sizes(), steps.inputs.q.sizes());
    EXPECT_TRUE(poisoned.out.is_contiguous());
    EXPECT_EQ(poisoned.lse.scalar_type(), at::kFloat);
    const ForwardComparison comparison =
        compare_forward(problem, steps.params, tiles, poisoned, steps.reference, steps.tolerance);
    EXPECT_FALSE(comparison.out.passed());
    EXPECT_EQ(comparison.out.nan_count, comparison.out.total);
    // Rows that see no key have LSE -inf in the reference; NaN there is still bad.
    EXPECT_EQ(comparison.lse.nan_count, comparison.lse.total);
  }
  {
    SCOPED_TRACE("one planted error is found where it was planted");
    ForwardOutputs outputs = same_precision_outputs(steps);
    outputs.out = outputs.out.clone();
    // Fixed length: batch 1, row 20, head 3, col 7. Varlen: row 20 of the third
    // sequence, which starts at packed row 5.
    const int64_t row = problem.is_varlen() ? 5 + 20 : 20;
    at::Tensor element = problem.is_varlen() ? outputs.out[row][3][7] : outputs.out[1][row][3][7];
    element.add_(4 * steps.tolerance.out.bound() + 0.01);
    const ForwardComparison comparison =
        compare_forward(problem, steps.params, tiles, outputs, steps.reference, steps.tolerance);
    EXPECT_TRUE(comparison.lse.passed());
    ASSERT_FALSE(comparison.out.passed());
    EXPECT_EQ(comparison.out.over_tolerance, 1);
    ASSERT_TRUE(comparison.out.first_bad.has_value());
    // Varlen positions name the sequence and the row within it, and their tiles count from there.
    EXPECT_EQ(comparison.out.first_bad->batch, problem.is_varlen() ? 2 : 1);
    EXPECT_EQ(comparison.out.first_bad->row, 20);
    EXPECT_EQ(comparison.out.first_bad->packed_row, problem.is_varlen() ? row : -1);
    EXPECT_EQ(comparison.out.first_bad->head, 3);
    EXPECT_EQ(comparison.out.first_bad->col, 7);
    const std::string text = comparison.out.format(), json = comparison.out.first_bad_json();
    EXPECT_NE(text.find(problem.is_varlen() ? "(sequence 2, row 20 = packed row 25, head 3, col 7)"
                                            : "(batch 1, row 20, head 3, col 7)"),
              std::string::npos) << text;
    EXPECT_NE(text.find("it lies in query tile 0 (rows 0..63, block_q 64)"), std::string::npos) << text;
    EXPECT_NE(json.find("\"query_tile\": 0"), std::string::npos) << json;
    EXPECT_EQ(json.find("\"sequence\": 2, \"packed_row\": 25") != std::string::npos, problem.is_varlen()) << json;
  }
}

INSTANTIATE_TEST_SUITE_P(FixedLengthAndVarlen, CheckSteps, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "varlen" : "fixed_length"; });

}  // namespace
}  // namespace flashlab::testing
