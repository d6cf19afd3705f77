// Head-dim padding through the public entries (attention.h, issue 12): a
// head_dim the chosen kernel lacks runs zero-padded to its next one, with the
// softmax scale of the head_dim given, and out, lse, dq, dk, dv match the
// harness's reference of the unpadded problem under the usual pass rules
// (problem.h, backward_check.h). Each case runs the _into forms into poisoned
// buffers and the returning forms (views of the padded results); the backward
// gets the returning forward's out, itself a view. The kernel-by-kernel
// matrices (test_kernels.cpp, test_backward.cpp) run kernels unpadded.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

struct PaddingCase {
  std::string name;
  std::string kernel;  // "auto" or a registered kernel
  int head_dim = 0;
  at::ScalarType dtype = at::kHalf;
  bool causal = false;
  bool varlen = false;
  std::optional<double> softmax_scale;  // given explicitly: kept as it is
};

void PrintTo(const PaddingCase& padding_case, std::ostream* stream) { *stream << padding_case.name; }

std::vector<PaddingCase> padding_cases() {
  return {
      {"auto_d40_fp16", "auto", 40, at::kHalf, false, false, std::nullopt},
      {"auto_d59_bf16_causal", "auto", 59, at::kBFloat16, true, false, std::nullopt},
      {"auto_d80_fp16_causal", "auto", 80, at::kHalf, true, false, std::nullopt},
      {"auto_d111_bf16_scale_0_3", "auto", 111, at::kBFloat16, false, false, 0.3},
      {"auto_d160_fp16", "auto", 160, at::kHalf, false, false, std::nullopt},
      {"auto_d224_bf16_causal", "auto", 224, at::kBFloat16, true, false, std::nullopt},
      {"auto_d59_fp16_varlen_causal", "auto", 59, at::kHalf, true, true, std::nullopt},
      // A named kernel pads to its own head dims (96 here, where fa3_wgmma_sm90 takes 128).
      {"fa2_mma_sm80_d80_bf16", "fa2_mma_sm80", 80, at::kBFloat16, false, false, std::nullopt},
  };
}

class HeadDimPadding : public ::testing::TestWithParam<PaddingCase> {
 protected:
  void SetUp() override {
    FLASHLAB_REQUIRE_GPU();
    const PaddingCase& c = GetParam();
    spec_.kernel = c.kernel;
    spec_.heads = 4, spec_.kv_heads = 2;  // GQA
    spec_.head_dim = c.head_dim;
    spec_.dtype = c.dtype;
    spec_.causal = c.causal;
    spec_.softmax_scale = c.softmax_scale;
    if (c.varlen) {
      spec_.seqlens_q = {17, 0, 65, 1};
      spec_.seqlens_k = {33, 5, 65, 9};
    } else {
      spec_.batch = 2, spec_.seqlen_q = 77, spec_.seqlen_k = 93;
    }
    spec_.seed = case_seed(c.name);
  }
  ProblemSpec spec_;
};

TEST_P(HeadDimPadding, ForwardAndBackwardMatchReference) {
  SCOPED_TRACE(spec_.describe());
  const ProblemInputs in = make_inputs(spec_, at::Device(at::kCUDA, 0));
  const bool varlen = spec_.is_varlen();
  const AttentionOptions options = spec_.attention_options();
  // The unpadded block: softmax scale 1/sqrt(head_dim) (or the given one), what the reference uses.
  const AttentionParams params = forward_params(spec_, in);

  const KernelVariant& kernel =
      varlen ? select_varlen_kernel(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k,
                                    in.max_seqlen_q, in.max_seqlen_k, options)
             : select_kernel(in.q, in.k, in.v, options);
  const int padded = padded_head_dim(kernel, spec_.head_dim);
  SCOPED_TRACE(kernel.name + " at head_dim " + std::to_string(padded));
  EXPECT_GT(padded, spec_.head_dim) << "the kernel runs this head_dim unpadded: nothing is padded";
  AttentionParams padded_params = params;
  padded_params.head_dim = padded;
  const TileShape tiles = kernel.tile_shape(padded_params);

  // Forward: into poisoned buffers, and the returning form.
  const ForwardOutputs into = poisoned_forward_outputs(spec_, in);
  AttentionOutput returned;
  if (varlen) {
    attention_varlen_forward_into(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k,
                                  in.max_seqlen_q, in.max_seqlen_k, into.out, into.lse, options);
    returned = attention_varlen_forward(in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_k,
                                        in.max_seqlen_q, in.max_seqlen_k, options);
  } else {
    attention_forward_into(in.q, in.k, in.v, into.out, into.lse, options);
    returned = attention_forward(in.q, in.k, in.v, options);
  }
  const ForwardReference forward_reference = reference_forward(spec_, in, params);
  const ForwardTolerance forward_bounds = forward_tolerance(spec_, forward_reference);
  for (const auto& [form, outputs] :
       {std::pair{"_into", into}, {"returned", ForwardOutputs{returned.out, returned.lse}}}) {
    SCOPED_TRACE(std::string("forward, ") + form);
    const ForwardComparison comparison =
        compare_forward(spec_, params, tiles, outputs, forward_reference, forward_bounds);
    EXPECT_TRUE(comparison.out.passed()) << comparison.out.format();
    EXPECT_TRUE(comparison.lse.passed()) << comparison.lse.format();
  }
  EXPECT_TRUE(at::equal(into.out, returned.out)) << "the copy into out differs from the view";

  // Backward of the returned forward (its out a view of the padded output).
  const at::Tensor dout = make_dout(spec_, in);
  const BackwardOptions backward_opts = backward_options(spec_);
  const Gradients into_gradients = poisoned_gradients(spec_, in);
  AttentionGradients new_gradients;
  if (varlen) {
    attention_varlen_backward_into(dout, in.q, in.k, in.v, returned.out, returned.lse,
                                   in.cu_seqlens_q, in.cu_seqlens_k, in.max_seqlen_q,
                                   in.max_seqlen_k, into_gradients.dq, into_gradients.dk,
                                   into_gradients.dv, backward_opts);
    new_gradients = attention_varlen_backward(dout, in.q, in.k, in.v, returned.out, returned.lse,
                                              in.cu_seqlens_q, in.cu_seqlens_k, in.max_seqlen_q,
                                              in.max_seqlen_k, backward_opts);
  } else {
    attention_backward_into(dout, in.q, in.k, in.v, returned.out, returned.lse, into_gradients.dq,
                            into_gradients.dk, into_gradients.dv, backward_opts);
    new_gradients =
        attention_backward(dout, in.q, in.k, in.v, returned.out, returned.lse, backward_opts);
  }
  const BackwardReference backward_reference = reference_backward(spec_, in, dout, params);
  const BackwardTolerance backward_bounds = backward_tolerance(spec_, backward_reference);
  for (const auto& [form, gradients] :
       {std::pair{"_into", into_gradients},
        {"returned", Gradients{new_gradients.dq, new_gradients.dk, new_gradients.dv}}}) {
    SCOPED_TRACE(std::string("backward, ") + form);
    const GradientComparison comparison = compare_backward(
        spec_, params, TileShape{}, gradients, backward_reference, backward_bounds);
    EXPECT_TRUE(comparison.dq.passed()) << comparison.dq.format();
    EXPECT_TRUE(comparison.dk.passed()) << comparison.dk.format();
    EXPECT_TRUE(comparison.dv.passed()) << comparison.dv.format();
  }
}

INSTANTIATE_TEST_SUITE_P(PublicApi, HeadDimPadding, ::testing::ValuesIn(padding_cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashlab::testing
