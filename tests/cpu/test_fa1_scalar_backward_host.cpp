// fa1_scalar's backward without a GPU: the kernels' per-thread functions run on
// the host for every thread of their grids (fa1_scalar_backward_host.cu) and
// are compared element by element with autograd through the float64
// reference: causal, windows, fully masked rows, GQA/MQA, strided tensors,
// odd head dims, the three dtypes, variable-length batches with empty
// sequences. The grid and block mapping, shared memory and the launch itself
// are the GPU tests' to check.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "fa1_scalar_backward_host.h"
#include "flashlab/attention.h"
#include "flashlab/harness/reference.h"

namespace flashlab {
namespace {

struct HostCase {
  std::string name;
  int batch = 1, heads = 1, kv_heads = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 16;
  at::ScalarType dtype = at::kFloat;
  bool causal = false;
  int window_left = -1, window_right = -1;
  bool strided = false;  // q/k/v/dout and dq/dk/dv as slices of wider tensors
};

void PrintTo(const HostCase& host_case, std::ostream* os) { *os << host_case.name; }

struct Tolerance {
  double atol, rtol;
};

Tolerance tolerance(at::ScalarType dtype) {
  // float32 accumulates in float32 from exact inputs; 16-bit cases also see out
  // rounded to the input dtype (D = rowsum(dout * out)) and the gradients rounded
  // on the store. An indexing or masking mistake is off by O(1).
  switch (dtype) {
    case at::kFloat: return {1e-4, 1e-4};
    case at::kHalf: return {1e-2, 1e-2};
    default: return {5e-2, 3e-2};
  }
}

// Random (shape) in dtype; `strided`: a slice of a tensor with a wider last
// dimension, so row and head strides differ from a contiguous tensor's.
at::Tensor input(at::IntArrayRef shape, at::ScalarType dtype, bool strided) {
  std::vector<int64_t> wide(shape.begin(), shape.end());
  if (!strided) return at::randn(shape, at::kDouble).to(dtype);
  wide.back() += 7;
  return at::randn(wide, at::kDouble).to(dtype).narrow(-1, 3, shape.back());
}

// A gradient buffer full of NaN (an element the kernels never write stays NaN).
at::Tensor poisoned(at::IntArrayRef shape, at::ScalarType dtype, bool strided) {
  std::vector<int64_t> wide(shape.begin(), shape.end());
  if (strided) wide.back() += 5;
  const at::Tensor full = at::full(wide, std::numeric_limits<double>::quiet_NaN(), at::TensorOptions().dtype(dtype));
  return strided ? full.narrow(-1, 2, shape.back()) : full;
}

void expect_close(const char* name, const at::Tensor& actual, const at::Tensor& expected,
                  Tolerance tol) {
  const at::Tensor got = actual.to(at::kDouble);
  ASSERT_EQ(got.sizes(), expected.sizes()) << name;
  EXPECT_FALSE(got.isnan().any().item<bool>()) << name << " has NaN: an element never written?";
  const at::Tensor excess = (got - expected).abs() - (tol.atol + tol.rtol * expected.abs());
  if (!(excess > 0).any().item<bool>()) return;
  const int64_t flat = excess.flatten().argmax().item<int64_t>();
  std::vector<int64_t> index(got.dim());
  for (int64_t d = got.dim() - 1, rest = flat; d >= 0; --d) {
    index[d] = rest % got.size(d);
    rest /= got.size(d);
  }
  ADD_FAILURE() << name << " departs most at " << at::IntArrayRef(index) << ": got "
                << got.flatten()[flat].item<double>() << ", expected "
                << expected.flatten()[flat].item<double>() << " (atol " << tol.atol << ", rtol "
                << tol.rtol << ")";
}

// Runs the host backward on params (host pointers) with fa1_scalar's workspace.
void run_host_backward(AttentionBackwardParams params) {
  const KernelVariant* fa1 = find_kernel("fa1_scalar");
  ASSERT_NE(fa1, nullptr);
  ASSERT_NE(fa1->backward_workspace_bytes, nullptr);
  ASSERT_EQ(fa1->backward_unsupported_reason(params), "");
  std::vector<float> workspace(fa1->backward_workspace_bytes(params) / sizeof(float) + 1);
  params.workspace = workspace.data();
  params.workspace_bytes = workspace.size() * sizeof(float);
  testing::fa1_scalar_backward_on_host(params);
}

class Fa1ScalarBackwardOnHost : public ::testing::TestWithParam<HostCase> {};

TEST_P(Fa1ScalarBackwardOnHost, MatchesAutogradReference) {
  const HostCase& c = GetParam();
  at::manual_seed(20260 + c.seqlen_q * 31 + c.head_dim);
  const at::Tensor q = input({c.batch, c.seqlen_q, c.heads, c.head_dim}, c.dtype, c.strided);
  const at::Tensor k = input({c.batch, c.seqlen_k, c.kv_heads, c.head_dim}, c.dtype, c.strided);
  const at::Tensor v = input({c.batch, c.seqlen_k, c.kv_heads, c.head_dim}, c.dtype, c.strided);
  const at::Tensor dout = input({c.batch, c.seqlen_q, c.heads, c.head_dim}, c.dtype, c.strided);

  BackwardOptions options;
  options.softmax_scale = 0.3;
  options.causal = c.causal;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  ReferenceOptions reference;
  reference.softmax_scale = 0.3;
  reference.window_left = c.window_left;
  reference.window_right = c.causal ? 0 : c.window_right;
  reference.compute_dtype = at::kDouble;

  // out and lse as the forward returns them: input dtype and float32.
  const ReferenceOutput forward = reference_attention(q, k, v, reference);
  const at::Tensor out = forward.out.to(c.dtype);
  const at::Tensor lse = forward.lse.to(at::kFloat).contiguous();
  const ReferenceGradients expected = reference_attention_backward(q, k, v, dout, reference);

  const at::Tensor dq = poisoned(q.sizes(), c.dtype, c.strided);
  const at::Tensor dk = poisoned(k.sizes(), c.dtype, c.strided);
  const at::Tensor dv = poisoned(v.sizes(), c.dtype, c.strided);
  run_host_backward(make_backward_params(dout, q, k, v, out, lse, dq, dk, dv, options));

  const Tolerance tol = tolerance(c.dtype);
  expect_close("dq", dq, expected.dq, tol);
  expect_close("dk", dk, expected.dk, tol);
  expect_close("dv", dv, expected.dv, tol);
}

std::vector<HostCase> host_cases() {
  std::vector<HostCase> cases;
  // Key and query counts across the 32-row blocks; head dims odd, even, not a multiple of 32.
  cases.push_back({"full_fp32", 2, 4, 4, 37, 45, 24, at::kFloat});
  cases.push_back({"causal_gqa_fp32", 2, 4, 2, 45, 37, 33, at::kFloat, true});
  // seqlen_q > seqlen_k, causal: the first rows see no key (lse -inf, gradient 0).
  cases.push_back({"causal_masked_rows_mqa_fp32", 1, 3, 1, 50, 20, 16, at::kFloat, true});
  cases.push_back({"window_fp32", 2, 2, 1, 70, 66, 8, at::kFloat, false, 9, 4});
  cases.push_back({"window_left_only_strided_fp32", 1, 4, 2, 33, 40, 20, at::kFloat, false, 5, -1, true});
  cases.push_back({"causal_strided_fp16", 2, 4, 2, 40, 50, 32, at::kHalf, true, -1, -1, true});
  cases.push_back({"window_bf16", 1, 2, 2, 35, 35, 64, at::kBFloat16, false, 3, 6});
  cases.push_back({"full_head_dim_128_fp16", 1, 2, 1, 9, 13, 128, at::kHalf});
  cases.push_back({"single_row_and_key_fp32", 1, 2, 1, 1, 1, 1, at::kFloat});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, Fa1ScalarBackwardOnHost, ::testing::ValuesIn(host_cases()),
                         [](const auto& info) { return info.param.name; });

// Variable-length batch: query lengths 5, 0, 40, 33 and key lengths 7, 3, 0,
// 50, so one sequence has keys without queries (dk = dv = 0) and one queries
// without keys (dq = 0, lse -inf).
void run_varlen_case(at::ScalarType dtype, bool causal, int window_left, int window_right) {
  at::manual_seed(4242);
  const std::vector<int> starts_q{0, 5, 5, 45, 78}, starts_k{0, 7, 10, 10, 60};
  const at::Tensor cu_seqlens_q = at::tensor(starts_q, at::kInt);
  const at::Tensor cu_seqlens_k = at::tensor(starts_k, at::kInt);
  const int heads = 4, kv_heads = 2, head_dim = 20, max_q = 40, max_k = 50;
  const at::Tensor q = input({78, heads, head_dim}, dtype, false);
  const at::Tensor k = input({60, kv_heads, head_dim}, dtype, true);
  const at::Tensor v = input({60, kv_heads, head_dim}, dtype, false);
  const at::Tensor dout = input({78, heads, head_dim}, dtype, true);

  BackwardOptions options;
  options.causal = causal;
  options.window_left = window_left;
  options.window_right = window_right;
  ReferenceOptions reference;
  reference.softmax_scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  reference.window_left = window_left;
  reference.window_right = causal ? 0 : window_right;
  reference.compute_dtype = at::kDouble;

  const ReferenceOutput forward =
      reference_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, reference);
  const at::Tensor out = forward.out.to(dtype);
  const at::Tensor lse = forward.lse.to(at::kFloat).contiguous();
  at::Tensor expected_dq = at::zeros(q.sizes(), at::kDouble);
  at::Tensor expected_dk = at::zeros(k.sizes(), at::kDouble);
  at::Tensor expected_dv = at::zeros(v.sizes(), at::kDouble);
  for (size_t b = 0; b + 1 < starts_q.size(); ++b) {
    const int q0 = starts_q[b], rows = starts_q[b + 1] - q0;
    const int k0 = starts_k[b], keys = starts_k[b + 1] - k0;
    if (rows == 0 || keys == 0) continue;  // gradients 0
    const ReferenceGradients one = reference_attention_backward(
        q.narrow(0, q0, rows).unsqueeze(0), k.narrow(0, k0, keys).unsqueeze(0),
        v.narrow(0, k0, keys).unsqueeze(0), dout.narrow(0, q0, rows).unsqueeze(0), reference);
    expected_dq.narrow(0, q0, rows).copy_(one.dq.squeeze(0));
    expected_dk.narrow(0, k0, keys).copy_(one.dk.squeeze(0));
    expected_dv.narrow(0, k0, keys).copy_(one.dv.squeeze(0));
  }

  const at::Tensor dq = poisoned(q.sizes(), dtype, true);
  const at::Tensor dk = poisoned(k.sizes(), dtype, false);
  const at::Tensor dv = poisoned(v.sizes(), dtype, true);
  run_host_backward(make_varlen_backward_params(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k,
                                                max_q, max_k, dq, dk, dv, options));
  const Tolerance tol = tolerance(dtype);
  expect_close("dq", dq, expected_dq, tol);
  expect_close("dk", dk, expected_dk, tol);
  expect_close("dv", dv, expected_dv, tol);
}

TEST(Fa1ScalarBackwardOnHostVarlen, FullFp32) { run_varlen_case(at::kFloat, false, -1, -1); }
TEST(Fa1ScalarBackwardOnHostVarlen, CausalFp32) { run_varlen_case(at::kFloat, true, -1, -1); }
TEST(Fa1ScalarBackwardOnHostVarlen, WindowFp16) { run_varlen_case(at::kHalf, false, 6, 2); }

}  // namespace
}  // namespace flashlab
