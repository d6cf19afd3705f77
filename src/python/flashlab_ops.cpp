// The flashlab Python package's extension: the C++ API of flashlab/attention.h
// as torch operators, flashlab::fwd, varlen_fwd, bwd, varlen_bwd and
// fwd_kvcache (CUDA kernels), plus flashlab::kernels (the registry, no device).
//
// Only TORCH_LIBRARY: no Python module, no Python headers. The package loads
// this library with torch.ops.load_library, which dlopens it; its static
// initializers register the schemas and kernels, and nothing here touches CUDA
// until an op is called. Fake (meta) kernels and autograd are registered from
// Python (flashlab/_ops.py), so torch.compile and torch.library.opcheck see the
// same definitions.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/kernel_registry.h"

namespace flashlab::python {
namespace {

using TensorPair = std::tuple<at::Tensor, at::Tensor>;
using TensorTriple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The fake kernels (flashlab/_ops.py) promise contiguous outputs. The C++ API
// returns them so, except where it pads the head dim for a kernel and hands back
// a slice of the padded result: then this copy keeps the promise.
TensorPair contiguous(const at::Tensor& a, const at::Tensor& b) {
  return {a.contiguous(), b.contiguous()};
}
TensorTriple contiguous(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
  return {a.contiguous(), b.contiguous(), c.contiguous()};
}

int to_int(int64_t value, const char* name) {
  TORCH_CHECK_VALUE(value >= INT32_MIN && value <= INT32_MAX, name, " must fit in 32 bits; got ",
                    value);
  return static_cast<int>(value);
}

template <typename Options>
Options attention_options(std::optional<double> softmax_scale, bool causal, int64_t window_left,
                          int64_t window_right, c10::string_view kernel) {
  Options options;
  options.causal = causal;
  options.softmax_scale = softmax_scale;
  options.window_left = to_int(window_left, "window_left");
  options.window_right = to_int(window_right, "window_right");
  options.kernel = std::string(kernel);
  return options;
}

// `deterministic` is the backward's (the autograd formula reads it from the
// forward's inputs); the forward is deterministic anyway.
TensorPair fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               std::optional<double> softmax_scale, bool causal, int64_t window_left,
               int64_t window_right, bool /*deterministic*/, c10::string_view kernel) {
  auto result = attention_forward(
      q, k, v,
      attention_options<AttentionOptions>(softmax_scale, causal, window_left, window_right, kernel));
  return contiguous(result.out, result.lse);
}

TensorPair varlen_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                      std::optional<double> softmax_scale, bool causal, int64_t window_left,
                      int64_t window_right, bool /*deterministic*/, c10::string_view kernel) {
  auto result = attention_varlen_forward(
      q, k, v, cu_seqlens_q, cu_seqlens_k, to_int(max_seqlen_q, "max_seqlen_q"),
      to_int(max_seqlen_k, "max_seqlen_k"),
      attention_options<AttentionOptions>(softmax_scale, causal, window_left, window_right, kernel));
  return contiguous(result.out, result.lse);
}

BackwardOptions backward_options(std::optional<double> softmax_scale, bool causal,
                                 int64_t window_left, int64_t window_right, bool deterministic,
                                 c10::string_view kernel) {
  auto options = attention_options<BackwardOptions>(softmax_scale, causal, window_left,
                                                    window_right, kernel);
  options.deterministic = deterministic;
  return options;
}

TensorTriple bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                 std::optional<double> softmax_scale, bool causal, int64_t window_left,
                 int64_t window_right, bool deterministic, c10::string_view kernel) {
  auto grads = attention_backward(
      dout, q, k, v, out, lse,
      backward_options(softmax_scale, causal, window_left, window_right, deterministic, kernel));
  return contiguous(grads.dq, grads.dk, grads.dv);
}

TensorTriple varlen_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                        const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                        int64_t max_seqlen_q, int64_t max_seqlen_k,
                        std::optional<double> softmax_scale, bool causal, int64_t window_left,
                        int64_t window_right, bool deterministic, c10::string_view kernel) {
  auto grads = attention_varlen_backward(
      dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, to_int(max_seqlen_q, "max_seqlen_q"),
      to_int(max_seqlen_k, "max_seqlen_k"),
      backward_options(softmax_scale, causal, window_left, window_right, deterministic, kernel));
  return contiguous(grads.dq, grads.dk, grads.dv);
}

TensorPair fwd_kvcache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v,
                       const std::optional<at::Tensor>& cache_seqlens,
                       const std::optional<at::Tensor>& block_table,
                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                       int64_t window_right, int64_t num_splits, c10::string_view kernel) {
  auto options =
      attention_options<KvCacheOptions>(softmax_scale, causal, window_left, window_right, kernel);
  options.k_new = k;
  options.v_new = v;
  options.cache_seqlens = cache_seqlens;
  options.block_table = block_table;
  options.num_splits = to_int(num_splits, "num_splits");
  auto result = attention_with_kvcache(q, k_cache, v_cache, options);
  return contiguous(result.out, result.lse);
}

// One entry per registered kernel, fastest first (the order "auto" tries):
// "name\tforward[,backward][,kvcache]\tsummary". No device access.
std::vector<std::string> kernels() {
  std::vector<std::string> entries;
  for (const auto& kernel : registered_kernels()) {
    std::string passes = "forward";
    if (kernel.backward_launch != nullptr) passes += ",backward";
    if (kernel.kvcache_launch != nullptr) passes += ",kvcache";
    entries.push_back(kernel.name + "\t" + passes + "\t" + kernel.summary);
  }
  return entries;
}

}  // namespace
}  // namespace flashlab::python

// The kernel choice is `kernel_name`, not `kernel`: Inductor lowers these ops
// through FallbackKernel.create(kernel, ...), and a schema argument named
// `kernel` collides with it under torch.compile (seen on the H100, torch 2.11).
TORCH_LIBRARY(flashlab, m) {
  const std::vector<at::Tag> tags{at::Tag::pt2_compliant_tag};
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, float? softmax_scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, bool deterministic=False, str kernel_name=\"auto\") "
      "-> (Tensor out, Tensor lse)",
      tags);
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, bool deterministic=False, str kernel_name=\"auto\") "
      "-> (Tensor out, Tensor lse)",
      tags);
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "bool deterministic=False, str kernel_name=\"auto\") -> (Tensor dq, Tensor dk, Tensor dv)",
      tags);
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "bool deterministic=False, str kernel_name=\"auto\") -> (Tensor dq, Tensor dk, Tensor dv)",
      tags);
  // k_cache and v_cache are written in place when k and v are given.
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, "
      "Tensor? v=None, Tensor? cache_seqlens=None, Tensor? block_table=None, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "int num_splits=0, str kernel_name=\"auto\") -> (Tensor out, Tensor lse)",
      tags);
  m.def("kernels() -> str[]", &flashlab::python::kernels);
}

TORCH_LIBRARY_IMPL(flashlab, CUDA, m) {
  m.impl("fwd", &flashlab::python::fwd);
  m.impl("varlen_fwd", &flashlab::python::varlen_fwd);
  m.impl("bwd", &flashlab::python::bwd);
  m.impl("varlen_bwd", &flashlab::python::varlen_bwd);
  m.impl("fwd_kvcache", &flashlab::python::fwd_kvcache);
}
