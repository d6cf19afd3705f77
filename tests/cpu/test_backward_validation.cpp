// Every input check of attention_backward and its varlen twin, provoked on CPU
// tensors (structure is checked before the kernel and the device, so each
// message can be seen without a GPU), and the parameter blocks that
// make_backward_params / make_varlen_backward_params build.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

// A valid problem (2 batches, 8 heads over 2 kv heads, seqlens 16 x 32,
// head_dim 64, fp16), on the CPU: only the device check rejects it.
struct BackwardInputs {
  at::Tensor q = cpu_tensor({2, 16, 8, 64});
  at::Tensor k = cpu_tensor({2, 32, 2, 64});
  at::Tensor v = cpu_tensor({2, 32, 2, 64});
  at::Tensor out = cpu_tensor({2, 16, 8, 64});
  at::Tensor lse = cpu_tensor({2, 8, 16}, at::kFloat);
  at::Tensor dout = cpu_tensor({2, 16, 8, 64});
  at::Tensor dq = cpu_tensor({2, 16, 8, 64});
  at::Tensor dk = cpu_tensor({2, 32, 2, 64});
  at::Tensor dv = cpu_tensor({2, 32, 2, 64});
  BackwardOptions options;
  void run() const { attention_backward(dout, q, k, v, out, lse, options); }
  void run_into() const { attention_backward_into(dout, q, k, v, out, lse, dq, dk, dv, options); }
  AttentionBackwardParams params() const {
    return make_backward_params(dout, q, k, v, out, lse, dq, dk, dv, options);
  }
};

// The first registered kernel without a backward; nullptr when every one has one.
// A kernel with a forward only: every registered kernel has a backward now
// (fa3_wgmma_sm90's since session 21), so a copy of fa1_scalar without one
// stands in for a kernel that never had it.
KernelVariant kernel_without_backward() {
  KernelVariant kernel = *find_kernel("fa1_scalar");
  kernel.name = "forward_only";
  kernel.backward_unsupported_reason = nullptr;
  kernel.backward_workspace_bytes = nullptr;
  kernel.backward_launch = nullptr;
  kernel.backward_tile_shape = nullptr;
  return kernel;
}

TEST(BackwardValidation, ValidProblemReachesTheDeviceCheck) {
  BackwardInputs inputs;
  expect_rejected([&] { inputs.run(); }, {"q, k and v must be on a CUDA device", "got cpu"});
  expect_rejected([&] { inputs.run_into(); }, {"q, k and v must be on a CUDA device", "got cpu"});
}

TEST(BackwardValidation, ForwardStructureChecksApply) {
  BackwardInputs inputs;
  inputs.q = cpu_tensor({2, 16, 512});
  expect_rejected([&] { inputs.run(); }, {"q must be 4-D", "got a 3-D tensor", "[2, 16, 512]"});
  BackwardInputs heads;
  heads.k = heads.v = cpu_tensor({2, 32, 3, 64});
  expect_rejected([&] { heads.run(); }, {"q has 8 heads", "multiple of the 3 heads"});
  BackwardInputs window;
  window.options.window_right = -5;
  expect_rejected([&] { window.run(); }, {"window_left and window_right must be >= -1", "(-1, -5)"});
}

TEST(BackwardValidation, DoutMustBeDefined) {
  BackwardInputs inputs;
  inputs.dout = at::Tensor();
  expect_rejected([&] { inputs.run(); }, {"dout must be a defined tensor"});
}

TEST(BackwardValidation, DoutShapeMustMatchQ) {
  BackwardInputs inputs;
  inputs.dout = cpu_tensor({2, 16, 8, 32});
  expect_rejected([&] { inputs.run(); },
                  {"dout must match q in shape and dtype", "got dout [2, 16, 8, 32] Half",
                   "q [2, 16, 8, 64] Half"});
}

TEST(BackwardValidation, DoutDtypeMustMatchQ) {
  BackwardInputs inputs;
  inputs.dout = cpu_tensor({2, 16, 8, 64}, at::kFloat);
  expect_rejected([&] { inputs.run(); },
                  {"dout must match q in shape and dtype", "dout [2, 16, 8, 64] Float",
                   "q [2, 16, 8, 64] Half"});
}

TEST(BackwardValidation, DoutLastDimensionMustBeContiguous) {
  BackwardInputs inputs;
  inputs.dout = cpu_tensor({2, 16, 64, 8}).transpose(2, 3);
  expect_rejected([&] { inputs.run(); }, {"dout must have a contiguous last dimension", "strides"});
}

TEST(BackwardValidation, DoutOnAnotherDevice) {
  BackwardInputs inputs;
  inputs.dout = at::empty({2, 16, 8, 64}, at::TensorOptions().dtype(at::kHalf).device(at::kMeta));
  expect_rejected([&] { inputs.run(); }, {"dout must be on q's device cpu", "got meta"});
}

TEST(BackwardValidation, OutMustMatchQ) {
  BackwardInputs inputs;
  inputs.out = cpu_tensor({2, 16, 8, 64}, at::kBFloat16);
  expect_rejected([&] { inputs.run(); },
                  {"out must match q in shape and dtype", "out [2, 16, 8, 64] BFloat16"});
}

TEST(BackwardValidation, LseMustHaveTheForwardsShape) {
  BackwardInputs inputs;
  inputs.lse = cpu_tensor({2, 16, 8}, at::kFloat);  // (batch, seqlen_q, heads): transposed
  expect_rejected([&] { inputs.run(); },
                  {"lse must be a contiguous float32 tensor of shape (batch, heads, seqlen_q) = [2, 8, 16]",
                   "got [2, 16, 8] Float"});
}

TEST(BackwardValidation, LseMustBeFloat32) {
  BackwardInputs inputs;
  inputs.lse = cpu_tensor({2, 8, 16}, at::kHalf);
  expect_rejected([&] { inputs.run(); }, {"lse must be a contiguous float32 tensor", "got [2, 8, 16] Half"});
}

TEST(BackwardValidation, LseMustBeContiguous) {
  BackwardInputs inputs;
  inputs.lse = cpu_tensor({2, 16, 8}, at::kFloat).transpose(1, 2);  // right shape, wrong strides
  expect_rejected([&] { inputs.run(); }, {"lse must be a contiguous float32 tensor", "= [2, 8, 16]"});
}

TEST(BackwardValidation, OutAndLseOnAnotherDevice) {
  BackwardInputs inputs;
  inputs.lse = at::empty({2, 8, 16}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta));
  expect_rejected([&] { inputs.run(); }, {"out and lse must be on q's device cpu", "and meta"});
}

TEST(BackwardValidation, GradientsMustBeDefined) {
  BackwardInputs inputs;
  inputs.dk = at::Tensor();
  expect_rejected([&] { inputs.run_into(); }, {"dq, dk and dv must all be defined tensors"});
}

TEST(BackwardValidation, DqMustMatchQ) {
  BackwardInputs inputs;
  inputs.dq = cpu_tensor({2, 16, 2, 64});
  expect_rejected([&] { inputs.run_into(); },
                  {"dq must match q in shape and dtype", "got dq [2, 16, 2, 64] Half",
                   "q [2, 16, 8, 64] Half"});
}

TEST(BackwardValidation, DkMustMatchK) {
  BackwardInputs inputs;
  inputs.dk = cpu_tensor({2, 32, 2, 64}, at::kFloat);
  expect_rejected([&] { inputs.run_into(); },
                  {"dk must match k in shape and dtype", "dk [2, 32, 2, 64] Float",
                   "k [2, 32, 2, 64] Half"});
}

TEST(BackwardValidation, DvLastDimensionMustBeContiguous) {
  BackwardInputs inputs;
  inputs.dv = cpu_tensor({2, 32, 64, 2}).transpose(2, 3);
  expect_rejected([&] { inputs.run_into(); }, {"dv must have a contiguous last dimension", "strides"});
}

TEST(BackwardValidation, GradientOnAnotherDevice) {
  BackwardInputs inputs;
  inputs.dv = at::empty({2, 32, 2, 64}, at::TensorOptions().dtype(at::kHalf).device(at::kMeta));
  expect_rejected([&] { inputs.run_into(); }, {"dv must be on v's device cpu", "got meta"});
}

TEST(BackwardValidation, UnknownKernelListsRegisteredOnes) {
  BackwardInputs inputs;
  inputs.options.kernel = "fa9_imaginary";
  expect_rejected([&] { inputs.run(); },
                  {"unknown kernel 'fa9_imaginary'", registered_kernel_names(), "(or auto)"});
}

TEST(BackwardValidation, EveryRegisteredKernelHasABackward) {
  // So a named kernel through the public entries always has one; the message
  // for a kernel without one: RunBackwardKernelRefusesAKernelWithoutBackward.
  for (const auto& kernel : registered_kernels()) EXPECT_NE(kernel.backward_launch, nullptr) << kernel.name;
}

TEST(BackwardValidation, KernelRejectsHeadDim) {
  BackwardInputs inputs;
  inputs.q = inputs.out = inputs.dout = cpu_tensor({2, 16, 8, 160});
  inputs.k = inputs.v = cpu_tensor({2, 32, 2, 160});
  inputs.options.kernel = "fa1_scalar";
  expect_rejected([&] { inputs.run(); },
                  {"kernel fa1_scalar cannot run the backward of", "head_dim 160",
                   "supports head_dim 1 to 128"});
}

TEST(BackwardValidation, AutoFindsNoKernel) {
  BackwardInputs inputs;
  inputs.q = inputs.out = inputs.dout = cpu_tensor({2, 16, 8, 1000});
  inputs.k = inputs.v = cpu_tensor({2, 32, 2, 1000});
  expect_rejected([&] { inputs.run(); },
                  {"no registered kernel has a backward that can run", "head_dim 1000", "fa1_scalar"});
}

TEST(BackwardValidation, AutoSelectsAKernelWithABackward) {
  for (const bool deterministic : {false, true}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      BackwardInputs inputs;
      inputs.q = inputs.out = inputs.dout = cpu_tensor({2, 16, 8, 64}, dtype);
      inputs.k = inputs.v = cpu_tensor({2, 32, 2, 64}, dtype);
      inputs.options.deterministic = deterministic;
      const AttentionBackwardParams params = inputs.params();
      const KernelVariant& kernel = select_backward_kernel(params, "auto");
      ASSERT_NE(kernel.backward_launch, nullptr) << kernel.name;
      EXPECT_EQ(kernel.backward_unsupported_reason(params), "") << kernel.name;
    }
  }
  // Named, a kernel with a backward that takes the problem is that kernel.
  BackwardInputs inputs;
  EXPECT_EQ(select_backward_kernel(inputs.params(), "fa1_scalar").name, "fa1_scalar");
}

TEST(BackwardValidation, RunBackwardKernelNeedsEveryTensor) {
  BackwardInputs inputs;
  const KernelVariant* fa1 = find_kernel("fa1_scalar");
  ASSERT_NE(fa1, nullptr);
  // dq, dk, dv undefined: a block enough to ask a kernel, not to run one.
  const AttentionBackwardParams params = make_backward_params(
      inputs.dout, inputs.q, inputs.k, inputs.v, inputs.out, inputs.lse, {}, {}, {}, inputs.options);
  EXPECT_EQ(params.dq, nullptr);
  EXPECT_EQ(params.dk, nullptr);
  EXPECT_EQ(params.dv, nullptr);
  expect_rejected([&] { run_backward_kernel(*fa1, params); },
                  {"run_backward_kernel needs every tensor of the backward", "got no dq, dk, dv"});
}

TEST(BackwardValidation, RunBackwardKernelRefusesAKernelWithoutBackward) {
  const KernelVariant kernel = kernel_without_backward();
  BackwardInputs inputs;
  expect_rejected([&] { run_backward_kernel(kernel, inputs.params()); },
                  {"kernel forward_only cannot run the backward of",
                   "forward_only has no backward pass (kernels with one: ", "fa1_scalar"});
}

TEST(BackwardValidation, RunBackwardKernelRefusesATileTrace) {
  BackwardInputs inputs;
  AttentionBackwardParams params = inputs.params();
  float trace_storage = 0.f;
  params.trace.row_max = params.trace.row_sum = &trace_storage;
  expect_rejected([&] { run_backward_kernel(*find_kernel("fa1_scalar"), params); },
                  {"fa1_scalar's backward does not record tile states"});
}

// make_backward_params: make_params's block plus every gradient's strides, in
// elements, from strided (non-contiguous) tensors; softmax_d and dq_accum null.
TEST(BackwardParams, FillsEveryStride) {
  BackwardInputs inputs;
  inputs.q = cpu_tensor({2, 16, 8, 96}).narrow(3, 0, 64);  // row stride 768, head stride 96
  inputs.dout = cpu_tensor({2, 8, 16, 64}).transpose(1, 2);
  inputs.dq = cpu_tensor({2, 16, 8, 80}).narrow(3, 16, 64);
  inputs.dk = cpu_tensor({2, 2, 32, 64}).transpose(1, 2);
  inputs.dv = cpu_tensor({3, 32, 2, 64}).narrow(0, 1, 2);
  inputs.options.deterministic = true;
  inputs.options.causal = true;
  const AttentionBackwardParams p = inputs.params();

  EXPECT_EQ(p.q, inputs.q.data_ptr());
  EXPECT_EQ(p.q_row_stride, 768);
  EXPECT_EQ(p.q_head_stride, 96);
  EXPECT_EQ(p.dout, inputs.dout.data_ptr());
  EXPECT_EQ(p.dout_batch_stride, 8 * 16 * 64);
  EXPECT_EQ(p.dout_row_stride, 64);
  EXPECT_EQ(p.dout_head_stride, 16 * 64);
  EXPECT_EQ(p.dq, inputs.dq.data_ptr());
  EXPECT_EQ(p.dq_batch_stride, 16 * 8 * 80);
  EXPECT_EQ(p.dq_row_stride, 8 * 80);
  EXPECT_EQ(p.dq_head_stride, 80);
  EXPECT_EQ(p.dk, inputs.dk.data_ptr());
  EXPECT_EQ(p.dk_batch_stride, 2 * 32 * 64);
  EXPECT_EQ(p.dk_row_stride, 64);
  EXPECT_EQ(p.dk_head_stride, 32 * 64);
  EXPECT_EQ(p.dv, inputs.dv.data_ptr());
  EXPECT_EQ(p.dv_batch_stride, 32 * 2 * 64);
  EXPECT_EQ(p.dv_row_stride, 2 * 64);
  EXPECT_EQ(p.dv_head_stride, 64);
  EXPECT_EQ(p.lse_batch_stride, 8 * 16);
  EXPECT_EQ(p.lse_head_stride, 16);
  EXPECT_EQ(p.softmax_d, nullptr);
  EXPECT_EQ(p.dq_accum, nullptr);
  EXPECT_TRUE(p.deterministic);
  EXPECT_TRUE(p.causal());
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.heads, 8);
  EXPECT_EQ(p.kv_heads, 2);
  EXPECT_EQ(p.seqlen_q, 16);
  EXPECT_EQ(p.seqlen_k, 32);
  EXPECT_EQ(p.head_dim, 64);
  EXPECT_EQ(p.device_compute_capability, 0);  // CPU tensors
}

// fa1_scalar's workspace: softmax_d, one float per lse element.
TEST(BackwardParams, Fa1ScalarWorkspaceIsSoftmaxD) {
  const KernelVariant* fa1 = find_kernel("fa1_scalar");
  ASSERT_NE(fa1, nullptr);
  ASSERT_NE(fa1->backward_workspace_bytes, nullptr);
  BackwardInputs inputs;
  EXPECT_EQ(fa1->backward_workspace_bytes(inputs.params()), sizeof(float) * 2 * 8 * 16);
}

// Three sequences: queries 5, 0, 11 (16 tokens); keys 7, 3, 0 (10 tokens).
struct VarlenBackwardInputs {
  at::Tensor q = cpu_tensor({16, 8, 64});
  at::Tensor k = cpu_tensor({10, 2, 64});
  at::Tensor v = cpu_tensor({10, 2, 64});
  at::Tensor out = cpu_tensor({16, 8, 64});
  at::Tensor lse = cpu_tensor({8, 16}, at::kFloat);
  at::Tensor dout = cpu_tensor({16, 8, 64});
  at::Tensor dq = cpu_tensor({16, 8, 64});
  at::Tensor dk = cpu_tensor({10, 2, 64});
  at::Tensor dv = cpu_tensor({10, 2, 64});
  at::Tensor cu_seqlens_q = at::tensor(std::vector<int>{0, 5, 5, 16}, at::kInt);
  at::Tensor cu_seqlens_k = at::tensor(std::vector<int>{0, 7, 10, 10}, at::kInt);
  int max_seqlen_q = 11, max_seqlen_k = 7;
  BackwardOptions options;
  void run() const {
    attention_varlen_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, options);
  }
  void run_into() const {
    attention_varlen_backward_into(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                   max_seqlen_q, max_seqlen_k, dq, dk, dv, options);
  }
  AttentionBackwardParams params() const {
    return make_varlen_backward_params(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                       max_seqlen_q, max_seqlen_k, dq, dk, dv, options);
  }
};

TEST(VarlenBackwardValidation, ValidProblemReachesTheDeviceCheck) {
  VarlenBackwardInputs inputs;
  expect_rejected([&] { inputs.run(); }, {"q, k and v must be on a CUDA device", "got cpu"});
  expect_rejected([&] { inputs.run_into(); }, {"q, k and v must be on a CUDA device", "got cpu"});
}

TEST(VarlenBackwardValidation, VarlenInputChecksApply) {
  VarlenBackwardInputs rank;
  rank.q = cpu_tensor({1, 16, 8, 64});
  expect_rejected([&] { rank.run(); }, {"q must be 3-D (total_q, heads, head_dim)", "got a 4-D tensor"});
  VarlenBackwardInputs offsets;
  offsets.cu_seqlens_k = at::tensor(std::vector<int>{0, 7, 10, 10}, at::kInt).to(at::kLong);
  expect_rejected([&] { offsets.run(); }, {"cu_seqlens_k must have dtype Int (int32); got Long"});
  VarlenBackwardInputs longest;
  longest.options.strict_checks = true;  // the offsets' values are read on the host in strict mode only
  longest.max_seqlen_q = 10;
  expect_rejected([&] { longest.run(); },
                  {"max_seqlen_q must be at least the longest sequence (11 tokens in cu_seqlens_q)", "got 10"});
}

TEST(VarlenBackwardValidation, LseMustBeHeadsByTotalQ) {
  VarlenBackwardInputs inputs;
  inputs.lse = cpu_tensor({3, 8, 11}, at::kFloat);  // a fixed-length batch's layout
  expect_rejected([&] { inputs.run(); },
                  {"lse must be a contiguous float32 tensor of shape (heads, total_q) = [8, 16]",
                   "got [3, 8, 11] Float"});
}

TEST(VarlenBackwardValidation, DoutMustMatchQ) {
  VarlenBackwardInputs inputs;
  inputs.dout = cpu_tensor({1, 16, 8, 64});
  expect_rejected([&] { inputs.run(); },
                  {"dout must match q in shape and dtype", "got dout [1, 16, 8, 64] Half",
                   "q [16, 8, 64] Half"});
}

TEST(VarlenBackwardValidation, GradientsMustMatchInputs) {
  VarlenBackwardInputs dk;
  dk.dk = cpu_tensor({16, 2, 64});
  expect_rejected([&] { dk.run_into(); },
                  {"dk must match k in shape and dtype", "dk [16, 2, 64] Half", "k [10, 2, 64] Half"});
  VarlenBackwardInputs dq;
  dq.dq = cpu_tensor({16, 64, 8}).transpose(1, 2);
  expect_rejected([&] { dq.run_into(); }, {"dq must have a contiguous last dimension", "strides"});
}

TEST(VarlenBackwardValidation, KernelRejectsHeadDim) {
  VarlenBackwardInputs inputs;
  inputs.q = inputs.out = inputs.dout = cpu_tensor({16, 8, 160});
  inputs.k = inputs.v = cpu_tensor({10, 2, 160});
  inputs.options.kernel = "fa1_scalar";
  expect_rejected([&] { inputs.run(); },
                  {"kernel fa1_scalar cannot run the backward of varlen batch 3", "head_dim 160"});
}

// make_varlen_backward_params: packed tensors, batch strides 0, lse (heads, total_q).
TEST(VarlenBackwardParams, PackedStrides) {
  VarlenBackwardInputs inputs;
  inputs.dout = cpu_tensor({8, 16, 64}).transpose(0, 1);
  inputs.dk = cpu_tensor({10, 2, 96}).narrow(2, 32, 64);
  const AttentionBackwardParams p = inputs.params();
  EXPECT_TRUE(p.is_varlen());
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seqlen_q, 11);
  EXPECT_EQ(p.seqlen_k, 7);
  EXPECT_EQ(p.total_rows_q, 16);
  EXPECT_EQ(p.total_rows_k, 10);
  EXPECT_EQ(p.dout_batch_stride, 0);
  EXPECT_EQ(p.dout_row_stride, 64);
  EXPECT_EQ(p.dout_head_stride, 16 * 64);
  EXPECT_EQ(p.dq_batch_stride, 0);
  EXPECT_EQ(p.dq_row_stride, 8 * 64);
  EXPECT_EQ(p.dq_head_stride, 64);
  EXPECT_EQ(p.dk_batch_stride, 0);
  EXPECT_EQ(p.dk_row_stride, 2 * 96);
  EXPECT_EQ(p.dk_head_stride, 96);
  EXPECT_EQ(p.dv_row_stride, 2 * 64);
  EXPECT_EQ(p.dv_head_stride, 64);
  EXPECT_EQ(p.lse_batch_stride, 0);
  EXPECT_EQ(p.lse_head_stride, 16);
  EXPECT_EQ(p.softmax_d, nullptr);
  EXPECT_EQ(p.dq_accum, nullptr);
  const KernelVariant* fa1 = find_kernel("fa1_scalar");
  ASSERT_NE(fa1, nullptr);
  EXPECT_EQ(fa1->backward_workspace_bytes(p), sizeof(float) * 8 * 16);
}

}  // namespace
}  // namespace flashlab
