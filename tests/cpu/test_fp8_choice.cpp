// The FP8 (e4m3) forward without a GPU (issue 36): its arguments' checks, provoked on
// CPU tensors, and which kernel the choice gives an e4m3 problem on compute
// capability 9.0 and 8.0 (parameter blocks only: nothing runs). The kernel's results:
// tests/python/test_fp8_gpu.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "flashlab/attention.h"
#include "flashlab/harness/dev_kernels.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

constexpr auto kE4m3 = at::kFloat8_e4m3fn;

// batch 2, 8 query heads over 2 kv heads, 16 x 32 rows.
struct Fp8Problem {
  at::Tensor q, k, v;
  AttentionOptions options;
  explicit Fp8Problem(int head_dim = 128, at::ScalarType dtype = kE4m3) {
    q = cpu_tensor({2, 16, 8, head_dim}, dtype);
    k = v = cpu_tensor({2, 32, 2, head_dim}, dtype);
  }
  void run() const { attention_forward(q, k, v, options); }
  AttentionParams forward(int compute_capability) const {
    AttentionParams params = make_params(q, k, v, at::Tensor(), at::Tensor(), options);
    params.device_compute_capability = compute_capability;
    return params;
  }
};

TEST(Fp8Arguments, SayWhatTheyExpect) {
  Fp8Problem problem;
  problem.options.q_descale = cpu_tensor({2, 8}, at::kFloat);  // per query head: not FA3's shape
  expect_rejected([&] { problem.run(); },
                  {"q_descale must be float32 of shape (batch, kv_heads) = (2, 2)", "got [2, 8]"});
  problem.options.q_descale = cpu_tensor({2, 2}, at::kDouble);
  expect_rejected([&] { problem.run(); }, {"q_descale must be float32", "got Double"});
  problem.options.q_descale = cpu_tensor({2, 2}, at::kFloat).t();
  expect_rejected([&] { problem.run(); }, {"q_descale must be contiguous"});
  problem.options.q_descale = at::Tensor();
  problem.options.output_dtype = at::kFloat;
  expect_rejected([&] { problem.run(); }, {"output_dtype of an e4m3 forward must be BFloat16 or Half", "got Float"});

  Fp8Problem half(128, at::kHalf);
  half.options.v_descale = cpu_tensor({2, 2}, at::kFloat);
  expect_rejected([&] { half.run(); }, {"v_descale is for e4m3 (Float8_e4m3fn) inputs"});
  half.options.v_descale = at::Tensor();
  half.options.output_dtype = at::kBFloat16;
  expect_rejected([&] { half.run(); }, {"output_dtype is for e4m3 (Float8_e4m3fn) inputs"});

  // The FP8 forward has no variable-length path: its arguments are refused there.
  const at::Tensor packed_q = cpu_tensor({16, 8, 128}), packed_kv = cpu_tensor({32, 2, 128});
  const at::Tensor cu_q = at::tensor({0, 16}, at::kInt), cu_k = at::tensor({0, 32}, at::kInt);
  AttentionOptions varlen;
  varlen.k_descale = cpu_tensor({1, 2}, at::kFloat);
  expect_rejected([&] { attention_varlen_forward(packed_q, packed_kv, packed_kv, cu_q, cu_k, 16, 32, varlen); },
                  {"are for the e4m3 (FP8) forward, which takes fixed-length batches"});
}

TEST(Fp8Arguments, OutputBufferHasTheOutputDtype) {
  Fp8Problem problem;
  const at::Tensor lse = at::zeros({2, 8, 16}, at::kFloat);
  expect_rejected([&] { attention_forward_into(problem.q, problem.k, problem.v, problem.q, lse, problem.options); },
                  {"out must have q's shape and dtype BFloat16 (the e4m3 forward's output)", "got out [2, 16, 8, 128] Float8_e4m3fn"});
}

// fa3_wgmma_sm90 takes e4m3 at head_dim 128 and 256 on 9.0, fixed-length, forward
// only; every other kernel and case is refused with the reason.
TEST(Fp8Choice, OnlyTheHopperForwardTakesIt) {
  for (const int head_dim : {128, 256}) {
    const Fp8Problem problem(head_dim);
    const AttentionParams params = problem.forward(90);
    EXPECT_EQ(params.dtype, DataType::e4m3);
    EXPECT_EQ(params.output_dtype, DataType::bfloat16);
    EXPECT_EQ(select_kernel(params, "auto").name, "fa3_wgmma_sm90") << head_dim;
    EXPECT_EQ(select_kernel(params, "auto").tile_shape(params).block_k, 128);  // Fp8Traits, not the 16-bit tiling
  }
  const Fp8Problem d128;
  expect_rejected([&] { select_kernel(d128.forward(80), "auto"); },
                  {"no registered kernel can run", "e4m3", "fa1_scalar takes no e4m3 (FP8) inputs"});
  expect_rejected([&] { select_kernel(d128.forward(90), "fa2_mma_sm80"); }, {"fa2_mma_sm80", "e4m3"});
  const Fp8Problem d64(64);
  expect_rejected([&] { select_kernel(d64.forward(90), "fa3_wgmma_sm90"); },
                  {"takes e4m3 (FP8) inputs at head_dim 128, 256", "got 64"});
  Fp8Problem modified;
  modified.options.softcap = 30.0;
  expect_rejected([&] { select_kernel(modified.forward(90), "fa3_wgmma_sm90"); }, {"applies no score modifications"});
  // The tuning copy with no workspace has nowhere to write V^T.
  for (const KernelVariant& tuning : tuning_kernels())
    if (tuning.name == "fa3_wgmma_sm90_static") EXPECT_FALSE(tuning.supports_e4m3);
  const at::Tensor lse = at::zeros({2, 8, 16}, at::kFloat);
  AttentionBackwardParams backward =
      make_backward_params(d128.q, d128.q, d128.k, d128.v, d128.q, lse, at::Tensor(), at::Tensor(), at::Tensor(), {});
  backward.device_compute_capability = 90;
  expect_rejected([&] { select_backward_kernel(backward, "auto"); },
                  {"backward takes no e4m3 (FP8) inputs", "fa3_wgmma_sm90's e4m3 (FP8) path is a forward only"});
}

}  // namespace
}  // namespace flashlab
