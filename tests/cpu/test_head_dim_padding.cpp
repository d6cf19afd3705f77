// Head-dim padding (attention.h, issue 12) without a GPU: the head dim each
// kernel runs a head_dim at (KernelVariant::padded_head_dim), which kernel
// "auto" and a named kernel take on compute capability 9.0 and 8.0 when
// padding is allowed (the public entries) and when it is not (run_kernel, the
// harness), and the errors for a head_dim no kernel reaches. The padded runs
// themselves: tests/gpu/test_head_dim_padding.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

const KernelVariant& kernel_named(const std::string& name) {
  const KernelVariant* kernel = find_kernel(name);
  EXPECT_NE(kernel, nullptr) << name;
  return *kernel;
}

TEST(HeadDimPadding, EachKernelPadsToItsNextHeadDim) {
  struct Expected {
    int head_dim, fa3, fa2;  // 0: above the kernel's largest
  };
  const Expected table[] = {{1, 64, 32},     {32, 64, 32},   {33, 64, 64},   {40, 64, 64},
                            {59, 64, 64},    {64, 64, 64},   {65, 128, 96},  {80, 128, 96},
                            {96, 128, 96},   {97, 128, 128}, {111, 128, 128}, {128, 128, 128},
                            {129, 256, 256}, {160, 256, 256}, {192, 256, 256}, {224, 256, 256},
                            {256, 256, 256}, {257, 0, 0},     {300, 0, 0}};
  const KernelVariant& fa3 = kernel_named("fa3_wgmma_sm90");
  const KernelVariant& fa2 = kernel_named("fa2_mma_sm80");
  const KernelVariant& fa1 = kernel_named("fa1_scalar");
  ASSERT_NE(fa3.padded_head_dim, nullptr);
  ASSERT_NE(fa2.padded_head_dim, nullptr);
  // fa1_scalar runs every head_dim from 1 to 128 as it is (its own padding is internal).
  EXPECT_EQ(fa1.padded_head_dim, nullptr);
  for (const Expected& row : table) {
    SCOPED_TRACE("head_dim " + std::to_string(row.head_dim));
    EXPECT_EQ(padded_head_dim(fa3, row.head_dim), row.fa3);
    EXPECT_EQ(padded_head_dim(fa2, row.head_dim), row.fa2);
    EXPECT_EQ(padded_head_dim(fa1, row.head_dim), row.head_dim);
  }
}

// A problem's tensors on the CPU and its parameter blocks as a device of
// `compute_capability` would see them (the blocks only ask; nothing runs).
struct Problem {
  at::Tensor q, k, v, out, lse;
  Problem(int head_dim, at::ScalarType dtype) {
    q = out = cpu_tensor({2, 16, 8, head_dim}, dtype);
    k = v = cpu_tensor({2, 32, 2, head_dim}, dtype);
    lse = at::zeros({2, 8, 16}, at::kFloat);
  }
  AttentionParams forward(int compute_capability) const {
    AttentionParams params = make_params(q, k, v, at::Tensor(), at::Tensor(), {});
    params.device_compute_capability = compute_capability;
    return params;
  }
  AttentionBackwardParams backward(int compute_capability) const {
    AttentionBackwardParams params =
        make_backward_params(out, q, k, v, out, lse, at::Tensor(), at::Tensor(), at::Tensor(), {});
    params.device_compute_capability = compute_capability;
    return params;
  }
};

// "auto" with padding allowed: the first registered kernel (fa3_wgmma_sm90,
// fa2_mma_sm80, fa1_scalar) that takes the problem at the head dim it pads it
// to.
TEST(HeadDimPadding, AutoPrefersAPaddedTensorCoreKernelOverFa1Scalar) {
  struct Expected {
    int head_dim;
    const char* on_90;  // forward kernel on compute capability 9.0
    int dim_90;
    int dim_80;  // fa2_mma_sm80 on 8.0 (and the backward where fa3_wgmma_sm90's has no head dim)
  };
  const Expected table[] = {
      {40, "fa3_wgmma_sm90", 64, 64},    {59, "fa3_wgmma_sm90", 64, 64},
      {80, "fa3_wgmma_sm90", 128, 96},   {111, "fa3_wgmma_sm90", 128, 128},
      {160, "fa3_wgmma_sm90", 256, 256}, {192, "fa3_wgmma_sm90", 256, 256},
      {224, "fa3_wgmma_sm90", 256, 256}, {256, "fa3_wgmma_sm90", 256, 256}};
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    for (const Expected& row : table) {
      SCOPED_TRACE("head_dim " + std::to_string(row.head_dim) + (dtype == at::kHalf ? " fp16" : " bf16"));
      const Problem problem(row.head_dim, dtype);
      const KernelVariant& on_90 = select_kernel(problem.forward(90), "auto", HeadDimPadding::allowed);
      EXPECT_EQ(on_90.name, row.on_90);
      EXPECT_EQ(padded_head_dim(on_90, row.head_dim), row.dim_90);
      const KernelVariant& on_80 = select_kernel(problem.forward(80), "auto", HeadDimPadding::allowed);
      EXPECT_EQ(on_80.name, "fa2_mma_sm80");
      EXPECT_EQ(padded_head_dim(on_80, row.head_dim), row.dim_80);
      // The backward: fa3_wgmma_sm90's on 9.0 (head_dim 256 and its
      // deterministic mode included), except softcap at 256 (none there):
      // fa2_mma_sm80's, as on 8.0.
      for (const int compute_capability : {90, 80})
        for (const bool deterministic : {false, true})
          for (const bool softcap : {false, true}) {
            AttentionBackwardParams params = problem.backward(compute_capability);
            params.deterministic = deterministic;
            if (softcap) params.modification.softcap = 30.f;
            const KernelVariant& backward = select_backward_kernel(params, "auto", HeadDimPadding::allowed);
            const bool hopper = compute_capability == 90 && (row.dim_90 <= 128 || !softcap);
            EXPECT_EQ(backward.name, hopper ? "fa3_wgmma_sm90" : "fa2_mma_sm80")
                << "compute capability " << compute_capability << (deterministic ? ", deterministic" : "")
                << (softcap ? ", softcap" : "");
            EXPECT_EQ(padded_head_dim(backward, row.head_dim), hopper ? row.dim_90 : row.dim_80);
          }
    }
  }
}

// "NAME,auto" (what the autograd asks for the forward's kernel): NAME where its
// backward takes the problem, else auto; an unknown NAME is still an error.
TEST(HeadDimPadding, NamedKernelOrAutoFallsBackWhereTheNamedOneCannot) {
  const Problem fits(80, at::kBFloat16), wide(160, at::kBFloat16);
  AttentionBackwardParams wide_softcap = wide.backward(90);
  wide_softcap.modification.softcap = 30.f;  // none at head_dim 256 (padded from 160)
  EXPECT_EQ(select_backward_kernel(fits.backward(90), "fa3_wgmma_sm90,auto", HeadDimPadding::allowed).name,
            "fa3_wgmma_sm90");
  EXPECT_EQ(select_backward_kernel(wide.backward(90), "fa3_wgmma_sm90,auto", HeadDimPadding::allowed).name,
            "fa3_wgmma_sm90");
  EXPECT_EQ(select_backward_kernel(wide_softcap, "fa3_wgmma_sm90,auto", HeadDimPadding::allowed).name,
            "fa2_mma_sm80");
  EXPECT_EQ(select_backward_kernel(fits.backward(80), "fa3_wgmma_sm90,auto", HeadDimPadding::allowed).name,
            "fa2_mma_sm80");  // not on compute capability 8.0
  expect_rejected(
      [&] { select_backward_kernel(wide_softcap, "fa3_wgmma_sm90", HeadDimPadding::allowed); },
      {"kernel fa3_wgmma_sm90 cannot run the backward of", "head_dim 160",
       "no softcap or ALiBi at head_dim 256"});
  expect_rejected([&] { select_backward_kernel(fits.backward(90), "fa9_imaginary,auto", HeadDimPadding::allowed); },
                  {"unknown kernel 'fa9_imaginary'"});
}

// float32: only fa1_scalar takes it, unpadded, up to 128.
TEST(HeadDimPadding, Float32RunsFa1ScalarUnpadded) {
  for (const int compute_capability : {90, 80}) {
    const Problem problem(40, at::kFloat);
    const KernelVariant& forward =
        select_kernel(problem.forward(compute_capability), "auto", HeadDimPadding::allowed);
    EXPECT_EQ(forward.name, "fa1_scalar");
    EXPECT_EQ(padded_head_dim(forward, 40), 40);
    EXPECT_EQ(select_backward_kernel(problem.backward(compute_capability), "auto",
                                     HeadDimPadding::allowed).name,
              "fa1_scalar");
  }
  const Problem too_wide(160, at::kFloat);
  expect_rejected(
      [&] { select_kernel(too_wide.forward(90), "auto", HeadDimPadding::allowed); },
      {"no registered kernel can run", "head_dim 160", "fa3_wgmma_sm90 supports float16, bfloat16 and e4m3",
       "fa2_mma_sm80 supports float16 and bfloat16", "fa1_scalar supports head_dim 1 to 128, got 160"});
}

// A named kernel pads to its own head dims: fa2_mma_sm80 on an H100 at 96 for head_dim 80.
TEST(HeadDimPadding, NamedKernelPadsToItsOwnHeadDims) {
  const Problem problem(80, at::kBFloat16);
  const KernelVariant& fa2 = select_kernel(problem.forward(90), "fa2_mma_sm80", HeadDimPadding::allowed);
  EXPECT_EQ(fa2.name, "fa2_mma_sm80");
  EXPECT_EQ(padded_head_dim(fa2, 80), 96);
  const KernelVariant& fa3 = select_kernel(problem.forward(90), "fa3_wgmma_sm90", HeadDimPadding::allowed);
  EXPECT_EQ(padded_head_dim(fa3, 80), 128);
  // The device is still checked at the padded head dim.
  expect_rejected(
      [&] { select_kernel(problem.forward(80), "fa3_wgmma_sm90", HeadDimPadding::allowed); },
      {"fa3_wgmma_sm90 runs on compute capability 9.0 (sm_90a); this device has 8.0"});
}

// Above 256 no kernel reaches: the message names what was given and what each kernel takes.
TEST(HeadDimPadding, HeadDimAboveEveryKernelIsRejected) {
  const Problem problem(300, at::kHalf);
  const std::initializer_list<std::string> forward_fragments = {
      "no registered kernel can run", "head_dim 300",
      "fa3_wgmma_sm90 supports head_dim 64, 128, 256; got 300",
      "fa2_mma_sm80 supports head_dim 32, 64, 96, 128, 256; got 300",
      "fa1_scalar supports head_dim 1 to 128, got 300",
      "zero-pad a head_dim up to the next one the kernel has"};
  for (const int compute_capability : {90, 80})
    expect_rejected(
        [&] { select_kernel(problem.forward(compute_capability), "auto", HeadDimPadding::allowed); },
        forward_fragments);
  expect_rejected(
      [&] { select_kernel(problem.forward(90), "fa3_wgmma_sm90", HeadDimPadding::allowed); },
      {"kernel fa3_wgmma_sm90 cannot run", "head_dim 300", "supports head_dim 64, 128, 256; got 300",
       "zero-pad a head_dim up to the next one"});
  expect_rejected(
      [&] { select_backward_kernel(problem.backward(90), "auto", HeadDimPadding::allowed); },
      {"no registered kernel has a backward that can run", "head_dim 300",
       "fa3_wgmma_sm90 supports head_dim 64, 128, 256; got 300", "fa2_mma_sm80 supports head_dim 32, 64, 96, 128, 256; got 300",
       "fa1_scalar supports head_dim 1 to 128, got 300"});
  // Through the public entries, on CPU tensors: rejected before the device check.
  expect_rejected([&] { attention_forward(problem.q, problem.k, problem.v); },
                  {"no registered kernel can run", "head_dim 300"});
  expect_rejected(
      [&] { attention_backward(problem.out, problem.q, problem.k, problem.v, problem.out, problem.lse); },
      {"no registered kernel has a backward that can run", "head_dim 300"});
}

// Without padding (run_kernel's view, the harness's and flashlab-run's):
// auto falls back to the kernel that runs the head dim as it is, and a named
// kernel that lacks it says what the public entries would do.
TEST(HeadDimPadding, WithoutPaddingKernelsRunTheirOwnHeadDims) {
  const Problem problem(40, at::kHalf);
  EXPECT_EQ(select_kernel(problem.forward(90), "auto").name, "fa1_scalar");
  EXPECT_EQ(select_kernel(problem.forward(80), "auto", HeadDimPadding::none).name, "fa1_scalar");
  EXPECT_EQ(select_backward_kernel(problem.backward(90), "auto").name, "fa1_scalar");
  const Problem fa3_lacks(96, at::kBFloat16);
  expect_rejected([&] { select_kernel(fa3_lacks.forward(90), "fa3_wgmma_sm90"); },
                  {"kernel fa3_wgmma_sm90 cannot run", "supports head_dim 64, 128, 256; got 96",
                   "attention_forward would zero-pad head_dim 96 to 128 for fa3_wgmma_sm90"});
  // The tensor-level selections pad by default, and take HeadDimPadding::none.
  EXPECT_EQ(select_kernel(problem.q, problem.k, problem.v, {}).name, "fa3_wgmma_sm90");
  EXPECT_EQ(select_kernel(problem.q, problem.k, problem.v, {}, HeadDimPadding::none).name,
            "fa1_scalar");
}

// An odd head_dim's strides (59 elements) are not the 16-byte multiples the
// tensor-core kernels need, but the padded copies' are: the public entries
// get past selection to the device check.
TEST(HeadDimPadding, OddHeadDimGetsPastSelection) {
  const Problem problem(59, at::kHalf);
  expect_rejected([&] { attention_forward(problem.q, problem.k, problem.v); },
                  {"must be on a CUDA device", "got cpu"});
  expect_rejected(
      [&] { attention_backward(problem.out, problem.q, problem.k, problem.v, problem.out, problem.lse); },
      {"must be on a CUDA device", "got cpu"});
  const at::Tensor cu_seqlens = at::tensor({0, 16}, at::kInt);
  const at::Tensor packed_q = cpu_tensor({16, 8, 59}), packed_kv = cpu_tensor({16, 2, 59});
  expect_rejected(
      [&] { attention_varlen_forward(packed_q, packed_kv, packed_kv, cu_seqlens, cu_seqlens, 16, 16); },
      {"must be on a CUDA device", "got cpu"});
}

}  // namespace
}  // namespace flashlab
