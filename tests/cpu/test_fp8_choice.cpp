// The FP8 (e4m3) forward without a GPU (issue 36): its arguments' checks, provoked on
// CPU tensors, and which kernel the choice gives an e4m3 problem on compute
// capability 9.0 and 8.0 (parameter blocks only: nothing runs), and the V^T layout of
// variable-length batches. The kernel's results:
// tests/python/test_fp8_gpu.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "flashlab/attention.h"
#include "flashlab/harness/dev_kernels.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"  // the V^T layout
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

  // Variable-length batches: a descale row a sequence; 16-bit packed inputs take none.
  const at::Tensor cu_q = at::tensor({0, 5, 16}, at::kInt), cu_k = at::tensor({0, 20, 32}, at::kInt);
  const at::Tensor packed_q = cpu_tensor({16, 8, 128}, kE4m3), packed_kv = cpu_tensor({32, 2, 128}, kE4m3);
  AttentionOptions varlen;
  varlen.k_descale = cpu_tensor({1, 2}, at::kFloat);
  expect_rejected([&] { attention_varlen_forward(packed_q, packed_kv, packed_kv, cu_q, cu_k, 11, 20, varlen); },
                  {"k_descale must be float32 of shape (batch, kv_heads) = (2, 2)", "got [1, 2]"});
  const at::Tensor half_q = cpu_tensor({16, 8, 128}), half_kv = cpu_tensor({32, 2, 128});
  varlen.k_descale = cpu_tensor({2, 2}, at::kFloat);
  expect_rejected([&] { attention_varlen_forward(half_q, half_kv, half_kv, cu_q, cu_k, 11, 20, varlen); },
                  {"k_descale is for e4m3 (Float8_e4m3fn) inputs"});
}

// A variable-length e4m3 batch goes to fa3_wgmma_sm90, whose V^T workspace holds every
// sequence's region (fp8_vt_key0) in one row of fp8_vt_row_keys keys.
TEST(Fp8Choice, VariableLengthBatchesGoToTheHopperForward) {
  const at::Tensor cu_q = at::tensor({0, 5, 16}, at::kInt), cu_k = at::tensor({0, 20, 33}, at::kInt);
  const at::Tensor q = cpu_tensor({16, 8, 128}, kE4m3), kv = cpu_tensor({33, 2, 128}, kE4m3);
  AttentionParams params = make_varlen_params(q, kv, kv, cu_q, cu_k, 11, 20, at::Tensor(), at::Tensor(), {});
  params.device_compute_capability = 90;
  const KernelVariant& kernel = select_kernel(params, "auto");
  EXPECT_EQ(kernel.name, "fa3_wgmma_sm90");
  // One plane: 2 kv heads x 128 rows of fp8_vt_keys(33 + 2 x 16) = 80 keys, after the offset.
  EXPECT_EQ(fa3_wgmma_sm90::fp8_vt_row_keys(params), 80);
  EXPECT_EQ(kernel.workspace_bytes(params), fa3_wgmma_sm90::kFp8VtOffset + 2 * 128 * 80);
}

// Each sequence's V^T region (its keys rounded up to 16) starts on a multiple of 16,
// ends at or before the next one's start, and the last one's fits the row, for
// lengths that are and are not multiples of 16 (empty ones included).
TEST(Fp8Choice, VariableLengthVtRegionsDoNotOverlap) {
  AttentionParams params;
  std::vector<int> lengths = {1, 7, 16, 0, 113, 15, 17, 1023, 0, 32, 4097, 3};
  params.batch = static_cast<int>(lengths.size());
  params.cu_seqlens_q = params.cu_seqlens_k = lengths.data();  // is_varlen(); never read here
  int64_t first_row = 0;
  int64_t previous_end = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t start = fa3_wgmma_sm90::fp8_vt_key0(params, first_row, static_cast<int>(b));
    EXPECT_EQ(start % 16, 0) << b;
    EXPECT_GE(start, previous_end) << b;
    previous_end = start + fa3_wgmma_sm90::fp8_vt_keys(lengths[b]);
    first_row += lengths[b];
  }
  params.total_rows_k = first_row;
  EXPECT_LE(previous_end, fa3_wgmma_sm90::fp8_vt_row_keys(params));
}

TEST(Fp8Arguments, OutputBufferHasTheOutputDtype) {
  Fp8Problem problem;
  const at::Tensor lse = at::zeros({2, 8, 16}, at::kFloat);
  expect_rejected([&] { attention_forward_into(problem.q, problem.k, problem.v, problem.q, lse, problem.options); },
                  {"out must have q's shape and dtype BFloat16 (the e4m3 forward's output)", "got out [2, 16, 8, 128] Float8_e4m3fn"});
}

// fa3_wgmma_sm90 takes e4m3 at head_dim 64, 128 and 256 on 9.0, fixed-length, forward
// only; every other kernel and case is refused with the reason.
TEST(Fp8Choice, OnlyTheHopperForwardTakesIt) {
  for (const int head_dim : {64, 128, 256}) {
    const Fp8Problem problem(head_dim);
    const AttentionParams params = problem.forward(90);
    EXPECT_EQ(params.dtype, DataType::e4m3);
    EXPECT_EQ(params.output_dtype, DataType::bfloat16);
    EXPECT_EQ(select_kernel(params, "auto").name, "fa3_wgmma_sm90") << head_dim;
    // Fp8Traits' key tile, not the 16-bit tiling's: 128, and 192 at head_dim 128 from 2048 keys on.
    EXPECT_EQ(select_kernel(params, "auto").tile_shape(params).block_k, 128) << head_dim;
    AttentionParams long_keys = params;
    long_keys.seqlen_k = 2048;
    EXPECT_EQ(select_kernel(long_keys, "auto").tile_shape(long_keys).block_k, head_dim == 128 ? 192 : 128) << head_dim;
    long_keys.seqlen_k = 2047;
    EXPECT_EQ(select_kernel(long_keys, "auto").tile_shape(long_keys).block_k, 128) << head_dim;
  }
  const Fp8Problem d128;
  expect_rejected([&] { select_kernel(d128.forward(80), "auto"); },
                  {"no registered kernel can run", "e4m3", "fa1_scalar takes no e4m3 (FP8) inputs"});
  expect_rejected([&] { select_kernel(d128.forward(90), "fa2_mma_sm80"); }, {"fa2_mma_sm80", "e4m3"});
  const Fp8Problem d96(96);
  expect_rejected([&] { select_kernel(d96.forward(90), "fa3_wgmma_sm90"); },
                  {"takes e4m3 (FP8) inputs at head_dim 64, 128, 256", "got 96"});
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
