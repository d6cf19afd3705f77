// The backward pass of every registered kernel that has one, over the backward
// matrices of kernel_cases.h (one fixture per property):
//   Backward.MatchesReference     forward then backward against autograd through
//                                 the reference: seqlens, masks, GQA/MQA, layouts,
//                                 head dims, dtypes, windows, variable lengths
//   BackwardMasked.GradientIsZeroNeverNaN
//                                 rows that see no key and keys no row sees have
//                                 gradient exactly 0 through the public API
//   BackwardDeterminism.DeterministicModeIsBitwiseStable
//   BackwardDeterminism.KeyGradientsBitwiseStableInDefaultMode
// and the gradient of a scalar loss through fa1_scalar's forward and backward
// (a torch autograd Function) against autograd through the reference.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <sstream>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/reference.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

class Backward : public KernelCaseTest {};
class BackwardMasked : public KernelCaseTest {};
class BackwardDeterminism : public KernelCaseTest {};

TEST_P(Backward, MatchesReference) {
  const BackwardCheckResult result = check_backward(spec_);
  EXPECT_EQ(result.kernel, GetParam().kernel) << result.format();
  EXPECT_TRUE(result.passed()) << result.format();
}

// The gradients of a spec through the public API (attention_backward and its
// varlen twin), given the kernel's own forward.
struct PublicRun {
  ProblemInputs inputs;
  AttentionOutput forward;
  at::Tensor dout;
};

PublicRun public_forward(const ProblemSpec& spec) {
  PublicRun run;
  run.inputs = make_inputs(spec, at::Device(at::kCUDA, 0));
  const ProblemInputs& in = run.inputs;
  run.forward = spec.is_varlen()
                    ? attention_varlen_forward(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k,
                                               in.max_seqlen_q, in.max_seqlen_k,
                                               spec.attention_options())
                    : attention_forward(in.q, in.k, in.v, spec.attention_options());
  run.dout = make_dout(spec, in);
  return run;
}

AttentionGradients public_backward(const ProblemSpec& spec, const PublicRun& run,
                                   bool deterministic) {
  const ProblemInputs& in = run.inputs;
  const BackwardOptions options = backward_options(spec, deterministic);
  return spec.is_varlen()
             ? attention_varlen_backward(run.dout, in.q, in.k, in.v, run.forward.out,
                                         run.forward.lse, in.cu_seqlens_q, in.cu_seqlens_k,
                                         in.max_seqlen_q, in.max_seqlen_k, options)
             : attention_backward(run.dout, in.q, in.k, in.v, run.forward.out, run.forward.lse,
                                  options);
}

// Per packed (or per batch-flattened) row: does the row see any key, is the
// key seen by any row. Fixed length: (seqlen_q) and (seqlen_k), the same for
// every batch entry; varlen: (total_q) and (total_k).
struct Visibility {
  at::Tensor row_sees_a_key, key_is_seen;  // bool, CPU
};

Visibility visibility(const ProblemSpec& spec, const AttentionParams& params) {
  if (!spec.is_varlen()) {
    const at::Tensor mask = visibility_mask(spec.seqlen_q, spec.seqlen_k, params.window_left,
                                            params.window_right, at::kCPU);
    return {mask.any(1), mask.any(0)};
  }
  std::vector<at::Tensor> rows, keys;
  const std::vector<int>& seqlens_k = spec.key_seqlens();
  for (size_t index = 0; index < spec.seqlens_q.size(); ++index) {
    const int seqlen_q = spec.seqlens_q[index], seqlen_k = seqlens_k[index];
    const at::Tensor mask = visibility_mask(seqlen_q, seqlen_k, params.window_left,
                                            params.window_right, at::kCPU);
    rows.push_back(seqlen_k == 0 ? at::zeros({seqlen_q}, at::kBool) : mask.any(1));
    keys.push_back(seqlen_q == 0 ? at::zeros({seqlen_k}, at::kBool) : mask.any(0));
  }
  return {at::cat(rows), at::cat(keys)};
}

TEST_P(BackwardMasked, GradientIsZeroNeverNaN) {
  SCOPED_TRACE(spec_.describe());
  {
    SCOPED_TRACE("the harness's check (out, lse, dq, dk, dv against the reference)");
    const BackwardCheckResult result = check_backward(spec_);
    EXPECT_TRUE(result.passed()) << result.format();
  }
  const PublicRun run = public_forward(spec_);
  const AttentionGradients gradients = public_backward(spec_, run, /*deterministic=*/false);
  const Visibility visible = visibility(spec_, forward_params(spec_, run.inputs));
  const int64_t masked_rows = (~visible.row_sees_a_key).sum().item<int64_t>();
  const int64_t unseen_keys = (~visible.key_is_seen).sum().item<int64_t>();
  ASSERT_GT(masked_rows + unseen_keys, 0) << "the case masks nothing fully";
  // Row axis: 1 for (B, S, H, D), 0 for packed (total, H, D).
  const int64_t row_axis = spec_.is_varlen() ? 0 : 1;
  const auto select_rows = [&](const at::Tensor& gradient, const at::Tensor& which) {
    return gradient.cpu().index_select(row_axis, which.nonzero().squeeze(1));
  };
  const std::pair<const char*, const at::Tensor*> all[] = {
      {"dq", &gradients.dq}, {"dk", &gradients.dk}, {"dv", &gradients.dv}};
  for (const auto& [name, gradient] : all)
    EXPECT_TRUE(at::isfinite(*gradient).all().item<bool>()) << name << " holds NaN or inf";
  if (masked_rows > 0)
    EXPECT_EQ(select_rows(gradients.dq, ~visible.row_sees_a_key).abs().max().item<double>(), 0.0)
        << "dq of rows that see no key (" << masked_rows << " rows)";
  if (unseen_keys > 0)
    for (const auto& [name, gradient] : {all[1], all[2]})
      EXPECT_EQ(select_rows(*gradient, ~visible.key_is_seen).abs().max().item<double>(), 0.0)
          << name << " of keys no row sees (" << unseen_keys << " keys)";
}

// The first run that differs bitwise from run 0, or -1; `compare` picks the
// tensors that must agree.
template <class Compare>
int first_differing_run(int runs, const std::function<AttentionGradients()>& run,
                        const Compare& equal, std::string& detail) {
  const AttentionGradients first = run();
  for (int index = 1; index < runs; ++index) {
    const AttentionGradients again = run();
    if (!equal(first, again, detail)) return index;
  }
  return -1;
}

bool same_bits(const char* name, const at::Tensor& a, const at::Tensor& b, std::string& detail) {
  if (at::equal(a, b)) return true;
  std::ostringstream text;
  text << name << " differs: " << (a != b).sum().item<int64_t>() << " elements, max |difference| "
       << (a.to(at::kFloat) - b.to(at::kFloat)).abs().max().item<float>();
  detail = text.str();
  return false;
}

TEST_P(BackwardDeterminism, DeterministicModeIsBitwiseStable) {
  SCOPED_TRACE(spec_.describe());
  ASSERT_GT(GetParam().runs, 1);
  {
    SCOPED_TRACE("the deterministic backward is correct too");
    BackwardCheckOptions options;
    options.deterministic = true;
    const BackwardCheckResult result = check_backward(spec_, options);
    EXPECT_TRUE(result.passed()) << result.format();
  }
  const PublicRun run = public_forward(spec_);
  std::string detail;
  const int differing = first_differing_run(
      GetParam().runs, [&] { return public_backward(spec_, run, /*deterministic=*/true); },
      [](const AttentionGradients& a, const AttentionGradients& b, std::string& text) {
        return same_bits("dq", a.dq, b.dq, text) && same_bits("dk", a.dk, b.dk, text) &&
               same_bits("dv", a.dv, b.dv, text);
      },
      detail);
  EXPECT_EQ(differing, -1) << "deterministic run " << differing << " of " << GetParam().runs
                           << " differs from run 0: " << detail;
}

TEST_P(BackwardDeterminism, KeyGradientsBitwiseStableInDefaultMode) {
  // dk and dv are each owned by one key block: no atomics, even in default mode.
  SCOPED_TRACE(spec_.describe());
  const PublicRun run = public_forward(spec_);
  std::string detail;
  const int differing = first_differing_run(
      GetParam().runs, [&] { return public_backward(spec_, run, /*deterministic=*/false); },
      [](const AttentionGradients& a, const AttentionGradients& b, std::string& text) {
        return same_bits("dk", a.dk, b.dk, text) && same_bits("dv", a.dv, b.dv, text);
      },
      detail);
  EXPECT_EQ(differing, -1) << "default-mode run " << differing << " of " << GetParam().runs
                           << " differs from run 0: " << detail;
}

const auto case_name = [](const auto& info) { return info.param.name; };

INSTANTIATE_TEST_SUITE_P(BackwardCorrectness, Backward, ::testing::ValuesIn(backward_correctness_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BackwardHeadDims, Backward, ::testing::ValuesIn(backward_head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BackwardSlidingWindow, Backward, ::testing::ValuesIn(backward_window_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BackwardVarlen, Backward, ::testing::ValuesIn(backward_varlen_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BackwardQueryBlocks, Backward, ::testing::ValuesIn(backward_query_block_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(BackwardPersistentGrid, Backward, ::testing::ValuesIn(backward_persistent_grid_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(BackwardScoreModifications, Backward,
                         ::testing::ValuesIn(backward_score_modification_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(AllBackwardKernels, BackwardMasked, ::testing::ValuesIn(backward_masked_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(AllBackwardKernels, BackwardDeterminism, ::testing::ValuesIn(backward_determinism_cases()), case_name);

// flashlab's forward and backward as one torch autograd Function, so a loss
// can be differentiated through them like through any torch op.
struct FlashlabAttention : public torch::autograd::Function<FlashlabAttention> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const std::string& kernel,
                            bool causal) {
    AttentionOptions options;
    options.kernel = kernel;
    options.causal = causal;
    const AttentionOutput output = attention_forward(q, k, v, options);
    context->save_for_backward({q, k, v, output.out, output.lse});
    context->saved_data["kernel"] = kernel;
    context->saved_data["causal"] = causal;
    return output.out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = context->get_saved_variables();
    BackwardOptions options;
    options.kernel = context->saved_data["kernel"].toStringRef();
    options.causal = context->saved_data["causal"].toBool();
    const AttentionGradients gradients = attention_backward(
        grad_outputs[0].contiguous(), saved[0], saved[1], saved[2], saved[3], saved[4], options);
    return {gradients.dq, gradients.dk, gradients.dv, at::Tensor(), at::Tensor()};
  }
};

// L = sum(out * w) + sum(out^2) / 2: dL/dout = w + out depends on the
// forward's output, so the backward sees what training would give it.
at::Tensor loss_of(const at::Tensor& out, const at::Tensor& weights) {
  return (out * weights).sum() + out.pow(2).sum() / 2;
}

TEST(BackwardLoss, GradientThroughFa1ScalarMatchesAutogradOnTheReference) {
  FLASHLAB_REQUIRE_GPU();
  const KernelVariant* kernel = find_kernel("fa1_scalar");
  ASSERT_NE(kernel, nullptr);
  ASSERT_NE(kernel->backward_launch, nullptr) << "fa1_scalar has no backward pass";
  ProblemSpec spec;
  spec.kernel = "fa1_scalar";
  spec.batch = 1, spec.heads = 2, spec.kv_heads = 1;
  spec.seqlen_q = 9, spec.seqlen_k = 13;
  spec.head_dim = 16;
  spec.dtype = at::kFloat;
  spec.causal = true;
  spec.seed = case_seed("BackwardLoss");
  SCOPED_TRACE(spec.describe());
  const std::string reason = backward_unsupported_reason(*kernel, spec, device_compute_capability());
  if (!reason.empty()) GTEST_SKIP() << reason;
  const ProblemInputs inputs = make_inputs(spec, at::Device(at::kCUDA, 0));
  const at::Tensor weights = make_dout(spec, inputs);

  // Through flashlab: the loss's gradient reaches q, k, v via FlashlabAttention::backward.
  const c10::AutoGradMode enable_grad(true);
  const auto leaf = [](const at::Tensor& tensor, at::ScalarType dtype) {
    return tensor.detach().to(dtype).clone().requires_grad_(true);
  };
  const at::Tensor q = leaf(inputs.q, at::kFloat), k = leaf(inputs.k, at::kFloat),
                   v = leaf(inputs.v, at::kFloat);
  const at::Tensor out = FlashlabAttention::apply(q, k, v, std::string("fa1_scalar"), spec.causal);
  const auto kernel_gradients = torch::autograd::grad({loss_of(out, weights)}, {q, k, v});

  // Autograd through the reference, in float64 (the reference) and float32 (torch's own error).
  const auto reference_gradients = [&](at::ScalarType dtype) {
    const at::Tensor q_ref = leaf(inputs.q, dtype), k_ref = leaf(inputs.k, dtype),
                     v_ref = leaf(inputs.v, dtype);
    ReferenceOptions options;
    options.softmax_scale = 1.0 / std::sqrt(double(spec.head_dim));
    options.window_right = 0;
    options.compute_dtype = dtype;
    // reference_attention is not differentiable at rows that see no key (none
    // here: seqlen_q <= seqlen_k), so autograd through it is the reference.
    const at::Tensor out_ref = reference_attention(q_ref, k_ref, v_ref, options).out;
    return torch::autograd::grad({loss_of(out_ref, weights.to(dtype))}, {q_ref, k_ref, v_ref});
  };
  const auto exact = reference_gradients(at::kDouble);
  const auto same_precision = reference_gradients(at::kFloat);
  const char* names[] = {"dq", "dk", "dv"};
  for (int index = 0; index < 3; ++index) {
    const Tolerance tolerance =
        tolerance_rule(exact[index], same_precision[index],
                       fwd_atol(exact[index], spec.dtype), /*same_precision_factor=*/3);
    const ComparisonReport report = compare_rows(names[index], kernel_gradients[index],
                                                 exact[index], tolerance.bound(), TileContext{});
    EXPECT_TRUE(report.passed()) << report.format();
    EXPECT_GT(exact[index].abs().max().item<double>(), 0.0) << names[index] << " is all zero";
  }
}

}  // namespace
}  // namespace flashlab::testing
