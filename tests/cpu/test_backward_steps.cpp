// The backward check's steps on the CPU (no kernel): torch's same-precision
// gradients, standing in for a kernel, pass flash-attn's gradient rule;
// poisoned gradients fail everywhere; a planted dk error is found at its key
// row and named by key tile; packed-qkv gradients share one buffer; a kernel
// without a backward, or whose backward rejects a case, is reported so.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <vector>

#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

// The varlen problem's key lengths: sequence 2 keeps the fixed length's 53, so
// its gradients equal the fixed-length reference's.
const std::vector<int> kVarlenSeqlensK = {11, 3, 53, 0};

struct Steps {
  ProblemInputs inputs;
  at::Tensor dout;
  AttentionParams params;
  BackwardReference reference;
  BackwardTolerance tolerance;
};

Steps run_steps(const ProblemSpec& spec) {
  Steps steps;
  steps.inputs = make_inputs(spec, at::kCPU);
  steps.dout = make_dout(spec, steps.inputs);
  steps.params = forward_params(spec, steps.inputs);
  steps.reference = reference_backward(spec, steps.inputs, steps.dout, steps.params);
  steps.tolerance = backward_tolerance(spec, steps.reference);
  return steps;
}

// torch's own gradients in the input dtype, as a kernel would write them.
Gradients same_precision_gradients(const Steps& steps) {
  const ReferenceGradients& same = steps.reference.same_precision;
  return {same.dq.contiguous(), same.dk.contiguous(), same.dv.contiguous()};
}

class BackwardSteps : public ::testing::TestWithParam<bool> {};

TEST_P(BackwardSteps, ComposeIntoFlashAttnGradientRule) {
  const ProblemSpec problem = GetParam() ? steps_varlen_spec(kVarlenSeqlensK) : steps_fixed_length_spec();
  SCOPED_TRACE(problem.describe());
  const Steps steps = run_steps(problem);
  const TileShape tiles{16, 32};

  {
    SCOPED_TRACE("dout is a seeded normal like q, apart from Q, K, V");
    EXPECT_EQ(steps.dout.sizes(), steps.inputs.q.sizes());
    EXPECT_EQ(steps.dout.scalar_type(), problem.dtype);
    EXPECT_NE(dout_seed(problem.seed), problem.seed);
    EXPECT_FALSE(at::equal(steps.dout, steps.inputs.q.contiguous()));
    EXPECT_TRUE(at::equal(steps.dout, make_dout(problem, steps.inputs)));
  }
  {
    SCOPED_TRACE("the tolerance is 3x torch's same-precision gradient error plus the forward's atol");
    const ReferenceGradients& exact = steps.reference.reference;
    const std::pair<const Tolerance*, const at::Tensor*> rules[] = {
        {&steps.tolerance.dq, &exact.dq}, {&steps.tolerance.dk, &exact.dk}, {&steps.tolerance.dv, &exact.dv}};
    for (const auto& [tolerance, reference] : rules) {
      EXPECT_EQ(reference->scalar_type(), at::kFloat);
      EXPECT_EQ(tolerance->same_precision_factor, 3);
      EXPECT_EQ(tolerance->bound(), 3 * tolerance->same_precision_err + tolerance->rounding_atol +
                                        tolerance->float32_floor);
      EXPECT_GT(tolerance->same_precision_err, 0);  // fp16 autograd differs from float32 somewhere
      EXPECT_DOUBLE_EQ(tolerance->rounding_atol, fwd_atol(*reference, problem.dtype));
      EXPECT_DOUBLE_EQ(tolerance->float32_floor,
                       4 * FLT_EPSILON * reference->abs().max().item<double>());
    }
  }
  {
    SCOPED_TRACE("torch's same-precision gradients, standing in for a kernel, pass");
    const GradientComparison comparison =
        compare_backward(problem, steps.params, tiles, same_precision_gradients(steps),
                         steps.reference, steps.tolerance);
    for (const ComparisonReport* report : {&comparison.dq, &comparison.dk, &comparison.dv}) {
      EXPECT_TRUE(report->passed()) << report->format();
      EXPECT_GT(report->max_abs_error, 0) << report->name;
    }
    EXPECT_EQ(comparison.dq.total, steps.inputs.q.numel());
    EXPECT_EQ(comparison.dk.total, steps.inputs.k.numel());
    EXPECT_FALSE(comparison.dq.context.rows_are_keys);
    EXPECT_TRUE(comparison.dk.context.rows_are_keys);
    EXPECT_TRUE(comparison.dv.context.rows_are_keys);
  }
  {
    SCOPED_TRACE("poisoned gradients fail everywhere");
    const Gradients poisoned = poisoned_gradients(problem, steps.inputs);
    EXPECT_EQ(poisoned.dq.sizes(), steps.inputs.q.sizes());
    EXPECT_EQ(poisoned.dk.sizes(), steps.inputs.k.sizes());
    EXPECT_EQ(poisoned.dv.sizes(), steps.inputs.v.sizes());
    const GradientComparison comparison = compare_backward(
        problem, steps.params, tiles, poisoned, steps.reference, steps.tolerance);
    for (const ComparisonReport* report : {&comparison.dq, &comparison.dk, &comparison.dv}) {
      EXPECT_FALSE(report->passed());
      EXPECT_EQ(report->nan_count, report->total) << report->name;
    }
  }
  {
    SCOPED_TRACE("one planted dk error is found at its key row");
    Gradients gradients = same_precision_gradients(steps);
    gradients.dk = gradients.dk.clone();
    // Fixed length: batch 1, key 40, kv head 1, col 7. Varlen: key 40 of the
    // third sequence, which starts at packed key row 11 + 3.
    const int64_t key = problem.is_varlen() ? 14 + 40 : 40;
    at::Tensor element = problem.is_varlen() ? gradients.dk[key][1][7] : gradients.dk[1][key][1][7];
    element.add_(4 * steps.tolerance.dk.bound() + 0.01);
    const GradientComparison comparison = compare_backward(
        problem, steps.params, tiles, gradients, steps.reference, steps.tolerance);
    EXPECT_TRUE(comparison.dq.passed());
    EXPECT_TRUE(comparison.dv.passed());
    ASSERT_FALSE(comparison.dk.passed());
    EXPECT_EQ(comparison.dk.over_tolerance, 1);
    ASSERT_TRUE(comparison.dk.first_bad.has_value());
    // Varlen positions name the sequence (as batch) and the key row within it.
    EXPECT_EQ(comparison.dk.first_bad->batch, problem.is_varlen() ? 2 : 1);
    EXPECT_EQ(comparison.dk.first_bad->row, 40);
    EXPECT_EQ(comparison.dk.first_bad->packed_row, problem.is_varlen() ? key : -1);
    EXPECT_EQ(comparison.dk.first_bad->head, 1);
    EXPECT_EQ(comparison.dk.first_bad->col, 7);
    // Causal, 37 queries over 53 keys (the varlen problem's third sequence too):
    // row i sees keys 0..i+16, so key 40 is seen by rows 24..36, query tiles
    // 1..2 of 16 rows; key tile 1 of 32.
    const std::string text = comparison.dk.format();
    EXPECT_NE(text.find("key tile 1 (keys 32..63, block_k 32)"), std::string::npos) << text;
    EXPECT_NE(text.find("query tiles 1..2 (block_q 16)"), std::string::npos) << text;
  }
}

INSTANTIATE_TEST_SUITE_P(FixedLengthAndVarlen, BackwardSteps, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "varlen" : "fixed_length"; });

TEST(BackwardCheckParts, PackedQkvGradientsShareOneBuffer) {
  ProblemSpec spec = steps_fixed_length_spec();
  spec.seqlen_k = spec.seqlen_q;
  spec.layout = Layout::packed_qkv;
  const ProblemInputs inputs = make_inputs(spec, at::kCPU, /*random=*/false);
  const Gradients gradients = poisoned_gradients(spec, inputs);
  EXPECT_EQ(gradients.dq.sizes(), inputs.q.sizes());
  EXPECT_EQ(gradients.dk.sizes(), inputs.k.sizes());
  EXPECT_EQ(gradients.dq.strides(), inputs.q.strides());
  EXPECT_EQ(gradients.dv.strides(), inputs.v.strides());
  const auto* base = static_cast<const char*>(gradients.dq.data_ptr());
  const int64_t element = gradients.dq.element_size();
  EXPECT_EQ(static_cast<const char*>(gradients.dk.data_ptr()) - base, spec.heads * spec.head_dim * element);
  EXPECT_EQ(static_cast<const char*>(gradients.dv.data_ptr()) - base,
            (spec.heads + spec.kv_heads) * spec.head_dim * element);
  EXPECT_TRUE(at::isnan(gradients.dv).all().item<bool>());
}

TEST(BackwardCheckParts, VarlenReferenceIsOneSequenceAtATime) {
  // Sequence 1 has keys but no queries, sequence 3 queries but no keys: their
  // gradients are 0. Sequence 2's equal the fixed-length reference's.
  const ProblemSpec spec = steps_varlen_spec(kVarlenSeqlensK);
  const ProblemInputs inputs = make_inputs(spec, at::kCPU);
  const at::Tensor dout = make_dout(spec, inputs);
  ReferenceOptions options;
  options.softmax_scale = 0.25;
  options.window_right = 0;
  const ReferenceGradients packed = reference_attention_varlen_backward(
      inputs.q, inputs.k, inputs.v, dout, inputs.cu_seqlens_q, inputs.cu_seqlens_k, options);
  EXPECT_EQ(packed.dk.narrow(0, 11, 3).abs().max().item<double>(), 0.0);
  EXPECT_EQ(packed.dq.narrow(0, 42, 1).abs().max().item<double>(), 0.0);
  const auto rows = [](const at::Tensor& tensor, int64_t start, int64_t length) {
    return tensor.narrow(0, start, length).unsqueeze(0);
  };
  const ReferenceGradients alone = reference_attention_backward(
      rows(inputs.q, 5, 37), rows(inputs.k, 14, 53), rows(inputs.v, 14, 53), rows(dout, 5, 37), options);
  EXPECT_TRUE(at::equal(packed.dq.narrow(0, 5, 37), alone.dq.squeeze(0)));
  EXPECT_TRUE(at::equal(packed.dk.narrow(0, 14, 53), alone.dk.squeeze(0)));
  EXPECT_TRUE(at::equal(packed.dv.narrow(0, 14, 53), alone.dv.squeeze(0)));
  EXPECT_GT(packed.dq.narrow(0, 5, 37).abs().max().item<double>(), 0.0);
}

// --show-element (what cuda-gdb's backward stops are checked against): dk/dv
// of the key row at the query head's kv head, dq of the query row, rows within
// the sequence (packed rows for varlen), a row a sequence lacks left out.
TEST(BackwardCheckParts, ShownElementsAreTheRowsOfTheSequence) {
  for (const bool varlen : {false, true}) {
    SCOPED_TRACE(varlen ? "varlen" : "fixed length");
    const ProblemSpec spec = varlen ? steps_varlen_spec(kVarlenSeqlensK) : steps_fixed_length_spec();
    const ProblemInputs inputs = make_inputs(spec, at::kCPU);
    // Distinct values everywhere: element i of each tensor is i (+ 0.5 for the "reference").
    const auto numbered = [](const at::Tensor& like) {
      return at::arange(like.numel(), at::TensorOptions().dtype(at::kDouble)).view(like.sizes());
    };
    const Gradients kernel{numbered(inputs.q), numbered(inputs.k), numbered(inputs.v)};
    const Gradients reference{kernel.dq + 0.5, kernel.dk + 0.5, kernel.dv + 0.5};
    // Sequence 1 of 2, or 2 of the varlen 4 (37 query rows, 53 key rows either way), head 3
    // (kv head 1), row 36, column 7.
    const int batch = varlen ? 2 : 1, head = 3, row = 36, col = 7;
    const std::string at_batch = std::to_string(batch);
    const std::vector<GradientElement> shown = gradient_elements(spec, {batch, head, row, col}, kernel, reference);
    ASSERT_EQ(shown.size(), 3u);
    const int64_t q_row = varlen ? 5 + 0 + row : batch * spec.seqlen_q + row;
    const int64_t k_row = varlen ? 11 + 3 + row : batch * spec.seqlen_k + row;
    EXPECT_EQ(shown[0].name, "dk[" + at_batch + ",36,1,7]");
    EXPECT_EQ(shown[0].kernel, static_cast<double>((k_row * spec.kv_heads + 1) * spec.head_dim + col));
    EXPECT_EQ(shown[1].name, "dv[" + at_batch + ",36,1,7]");
    EXPECT_EQ(shown[1].reference, shown[0].kernel + 0.5);
    EXPECT_EQ(shown[2].name, "dq[" + at_batch + ",36,3,7]");
    EXPECT_EQ(shown[2].kernel, static_cast<double>((q_row * spec.heads + head) * spec.head_dim + col));
    // Row 40: past the sequence's 37 query rows, within its 53 keys.
    const std::vector<GradientElement> keys_only = gradient_elements(spec, {batch, head, 40, col}, kernel, reference);
    ASSERT_EQ(keys_only.size(), 2u);
    EXPECT_EQ(keys_only[1].name, "dv[" + at_batch + ",40,1,7]");
    expect_rejected([&] { gradient_elements(spec, {batch, spec.heads, row, col}, kernel, reference); },
                    {"outside the problem"});
  }
}

// Stand-ins for a kernel's backward hooks.
void no_launch(const AttentionBackwardParams&) {}
std::string rejects_windows(const AttentionBackwardParams& params) {
  return params.window_left >= 0 ? "backward takes no left window; got " + std::to_string(params.window_left)
                                 : "";
}

TEST(BackwardCheckParts, UnsupportedReasonNamesTheMissingBackward) {
  const KernelVariant* fa1 = find_kernel("fa1_scalar");
  ASSERT_NE(fa1, nullptr);
  KernelVariant kernel = *fa1;
  kernel.name = "forward_only";
  kernel.backward_launch = nullptr;
  ProblemSpec spec = steps_fixed_length_spec();
  spec.kernel = kernel.name;
  // The op library's words for a kernel without the mode, and the kernels that have it.
  EXPECT_EQ(backward_unsupported_reason(kernel, spec).rfind("forward_only has no backward pass (kernels with one: ", 0), 0u)
      << backward_unsupported_reason(kernel, spec);

  kernel.backward_launch = no_launch;
  kernel.backward_unsupported_reason = rejects_windows;
  EXPECT_EQ(backward_unsupported_reason(kernel, spec), "");
  spec.window_left = 17;
  EXPECT_EQ(backward_unsupported_reason(kernel, spec), "backward takes no left window; got 17");
  // The forward's reason comes first: the check runs the kernel's forward.
  spec.head_dim = 4096;
  EXPECT_EQ(backward_unsupported_reason(kernel, spec), unsupported_reason(kernel, spec));
  EXPECT_FALSE(backward_unsupported_reason(kernel, spec).empty());
}

// dsinks' rule adds twice the stored-output shift (the kernels form D from the
// output stored in the input dtype; torch's autograd never rounds it), taken
// on the float32 reference run only, for fixed-length and varlen problems with
// sinks; no other gradient's rule, and none without sinks.
TEST_P(BackwardSteps, SinksRuleAddsTwiceTheStoredOutputShift) {
  ProblemSpec problem = GetParam() ? steps_varlen_spec(kVarlenSeqlensK) : steps_fixed_length_spec();
  EXPECT_EQ(run_steps(problem).tolerance.dsinks.stored_output_term, 0);
  problem.sinks = true;
  const Steps steps = run_steps(problem);
  ASSERT_TRUE(steps.reference.reference.dsinks_stored_output_shift.defined());
  EXPECT_FALSE(steps.reference.same_precision.dsinks_stored_output_shift.defined());
  const double shift = steps.reference.reference.dsinks_stored_output_shift.abs().max().item<double>();
  const Tolerance& dsinks = steps.tolerance.dsinks;
  EXPECT_GT(shift, 0.0);
  EXPECT_DOUBLE_EQ(dsinks.stored_output_term, 2 * shift);
  EXPECT_DOUBLE_EQ(dsinks.bound(),
                   3 * dsinks.same_precision_err + dsinks.rounding_atol + dsinks.float32_floor + 2 * shift);
  for (const Tolerance* other : {&steps.tolerance.dq, &steps.tolerance.dk, &steps.tolerance.dv})
    EXPECT_EQ(other->stored_output_term, 0);
}

}  // namespace
}  // namespace flashlab::testing
