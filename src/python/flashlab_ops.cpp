// The flashlab Python package's extension: the C++ API of flashlab/attention.h
// as torch operators, flashlab::fwd, varlen_fwd, bwd, varlen_bwd and
// fwd_kvcache (CUDA kernels), merge_attention_states_ (the ring's merge), their autograd (fwd and varlen_fwd, here), plus
// flashlab::kernels (the registry), check_errors and the strict-checks switch.
//
// Only TORCH_LIBRARY: no Python module, no Python headers. The package loads
// this library with torch.ops.load_library, which dlopens it; its static
// initializers register the schemas and kernels, and nothing here touches CUDA
// until an op is called. Fake (meta) kernels are registered from Python
// (flashlab/_ops.py). Autograd is registered here, in C++: the Python
// registration (torch.library.register_autograd) cost about 14 us a call on the
// H100 machine's host (session 19, call 1: 44.4 against 33.1 us a tiny
// forward), more than the kernel.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>
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

// The score modifications (attention.h): softcap, ALiBi slopes, sinks.
struct Modifications {
  double softcap = 0.0;
  std::optional<at::Tensor> alibi_slopes, sinks;
};

template <typename Options>
Options attention_options(std::optional<double> softmax_scale, bool causal, int64_t window_left,
                          int64_t window_right, c10::string_view kernel, const Modifications& modifications) {
  Options options;
  options.causal = causal;
  options.softmax_scale = softmax_scale;
  options.window_left = to_int(window_left, "window_left");
  options.window_right = to_int(window_right, "window_right");
  options.kernel = std::string(kernel);
  options.softcap = modifications.softcap;
  if (modifications.alibi_slopes) options.alibi_slopes = *modifications.alibi_slopes;
  if (modifications.sinks) options.sinks = *modifications.sinks;
  return options;
}

// `deterministic` is the backward's (the autograd formula reads it from the
// forward's inputs); the forward is deterministic anyway.
TensorPair fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               std::optional<double> softmax_scale, bool causal, int64_t window_left,
               int64_t window_right, bool /*deterministic*/, c10::string_view kernel, double softcap,
               const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
               int64_t sm_margin) {
  auto options = attention_options<AttentionOptions>(softmax_scale, causal, window_left, window_right, kernel,
                                                     {softcap, alibi_slopes, sinks});
  options.sm_margin = to_int(sm_margin, "sm_margin");
  auto result = attention_forward(q, k, v, options);
  return contiguous(result.out, result.lse);
}

TensorPair varlen_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k,
                      std::optional<double> softmax_scale, bool causal, int64_t window_left,
                      int64_t window_right, bool /*deterministic*/, c10::string_view kernel, double softcap,
                      const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
                      int64_t sm_margin) {
  auto options = attention_options<AttentionOptions>(softmax_scale, causal, window_left, window_right, kernel,
                                                     {softcap, alibi_slopes, sinks});
  options.sm_margin = to_int(sm_margin, "sm_margin");
  auto result = attention_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, to_int(max_seqlen_q, "max_seqlen_q"),
                                         to_int(max_seqlen_k, "max_seqlen_k"), options);
  return contiguous(result.out, result.lse);
}

// The e4m3 (FP8) forwards' options: no autograd (a forward only), FA3's descale factors.
AttentionOptions fp8_options(const std::optional<at::Tensor>& q_descale, const std::optional<at::Tensor>& k_descale,
                             const std::optional<at::Tensor>& v_descale, std::optional<double> softmax_scale,
                             bool causal, int64_t window_left, int64_t window_right,
                             std::optional<at::ScalarType> out_dtype, c10::string_view kernel) {
  auto options =
      attention_options<AttentionOptions>(softmax_scale, causal, window_left, window_right, kernel, Modifications{});
  options.q_descale = q_descale.value_or(at::Tensor());
  options.k_descale = k_descale.value_or(at::Tensor());
  options.v_descale = v_descale.value_or(at::Tensor());
  options.output_dtype = out_dtype;
  return options;
}

TensorPair fwd_fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& q_descale, const std::optional<at::Tensor>& k_descale,
                   const std::optional<at::Tensor>& v_descale, std::optional<double> softmax_scale, bool causal,
                   int64_t window_left, int64_t window_right, std::optional<at::ScalarType> out_dtype,
                   c10::string_view kernel) {
  auto result = attention_forward(q, k, v,
                                  fp8_options(q_descale, k_descale, v_descale, softmax_scale, causal, window_left,
                                              window_right, out_dtype, kernel));
  return contiguous(result.out, result.lse);
}

// fwd_fp8 on a variable-length batch: the descales (sequences, kv_heads).
TensorPair varlen_fwd_fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q,
                          int64_t max_seqlen_k, const std::optional<at::Tensor>& q_descale,
                          const std::optional<at::Tensor>& k_descale, const std::optional<at::Tensor>& v_descale,
                          std::optional<double> softmax_scale, bool causal, int64_t window_left,
                          int64_t window_right, std::optional<at::ScalarType> out_dtype, c10::string_view kernel) {
  auto result = attention_varlen_forward(
      q, k, v, cu_seqlens_q, cu_seqlens_k, to_int(max_seqlen_q, "max_seqlen_q"), to_int(max_seqlen_k, "max_seqlen_k"),
      fp8_options(q_descale, k_descale, v_descale, softmax_scale, causal, window_left, window_right, out_dtype, kernel));
  return contiguous(result.out, result.lse);
}

BackwardOptions backward_options(std::optional<double> softmax_scale, bool causal,
                                 int64_t window_left, int64_t window_right, bool deterministic,
                                 c10::string_view kernel, const Modifications& modifications) {
  auto options = attention_options<BackwardOptions>(softmax_scale, causal, window_left,
                                                    window_right, kernel, modifications);
  options.deterministic = deterministic;
  return options;
}

// dq, dk, dv and dsinks: float32 (heads) with sinks, else an empty (0,) float32 tensor.
using Gradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
Gradients with_dsinks(const AttentionGradients& grads, const at::Tensor& q) {
  auto [dq, dk, dv] = contiguous(grads.dq, grads.dk, grads.dv);
  return {dq, dk, dv, grads.dsinks.defined() ? grads.dsinks : q.new_empty({0}, q.options().dtype(at::kFloat))};
}

Gradients bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& out, const at::Tensor& lse, std::optional<double> softmax_scale, bool causal,
              int64_t window_left, int64_t window_right, bool deterministic, c10::string_view kernel,
              double softcap, const std::optional<at::Tensor>& alibi_slopes,
              const std::optional<at::Tensor>& sinks) {
  auto grads = attention_backward(dout, q, k, v, out, lse,
                                  backward_options(softmax_scale, causal, window_left, window_right, deterministic,
                                                   kernel, {softcap, alibi_slopes, sinks}));
  return with_dsinks(grads, q);
}

Gradients varlen_bwd(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
                     const at::Tensor& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                     std::optional<double> softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                     bool deterministic, c10::string_view kernel, double softcap,
                     const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  auto grads = attention_varlen_backward(
      dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, to_int(max_seqlen_q, "max_seqlen_q"),
      to_int(max_seqlen_k, "max_seqlen_k"),
      backward_options(softmax_scale, causal, window_left, window_right, deterministic, kernel,
                       {softcap, alibi_slopes, sinks}));
  return with_dsinks(grads, q);
}

TensorPair fwd_kvcache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                       const std::optional<at::Tensor>& k, const std::optional<at::Tensor>& v,
                       const std::optional<at::Tensor>& cache_seqlens,
                       const std::optional<at::Tensor>& block_table,
                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                       int64_t window_right, int64_t num_splits, c10::string_view kernel, double softcap,
                       const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks) {
  auto options = attention_options<KvCacheOptions>(softmax_scale, causal, window_left, window_right, kernel,
                                                   {softcap, alibi_slopes, sinks});
  options.k_new = k;
  options.v_new = v;
  options.cache_seqlens = cache_seqlens;
  options.block_table = block_table;
  options.num_splits = to_int(num_splits, "num_splits");
  auto result = attention_with_kvcache(q, k_cache, v_cache, options);
  return contiguous(result.out, result.lse);
}

// ---------------------------------------------------------------------------
// Autograd: the forward ops' backward is flashlab::bwd / varlen_bwd with the
// forward's options, run by the forward's kernel when that kernel has a
// backward pass that can run the problem ("NAME,auto"), else by "auto" (a
// kernel's out and lse are plain attention output and natural-log LSE,
// whichever kernel wrote them). lse has no
// gradient (as in flash-attn): it is marked non-differentiable. The ops are
// called through the dispatcher below autograd, so FakeTensor and meta tensors
// (torch.compile) reach their fake kernels.

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string backward_kernel(c10::string_view kernel) {
  const KernelVariant* variant = find_kernel(std::string_view(kernel.data(), kernel.size()));
  // "NAME,auto": NAME's backward where it takes the problem (e.g. not
  // fa3_wgmma_sm90 at head_dim 256), else auto (select_mode_kernel).
  return variant != nullptr && variant->backward_launch != nullptr ? std::string(kernel) + ",auto" : "auto";
}

template <class Signature>
const c10::TypedOperatorHandle<Signature>& op_handle(const char* name) {
  // One lookup per op (a static per instantiation: each Signature is one op).
  static const auto handle = c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
  return handle;
}

using OptionalTensor = const std::optional<at::Tensor>&;
using FwdSignature = TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                std::optional<double>, bool, int64_t, int64_t, bool, c10::string_view, double,
                                OptionalTensor, OptionalTensor, int64_t);
using VarlenFwdSignature = TensorPair(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                      std::optional<double>, bool, int64_t, int64_t, bool,
                                      c10::string_view, double, OptionalTensor, OptionalTensor, int64_t);
using BwdSignature = Gradients(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               std::optional<double>, bool, int64_t, int64_t, bool, c10::string_view, double,
                               OptionalTensor, OptionalTensor);
using VarlenBwdSignature = Gradients(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                     std::optional<double>, bool, int64_t, int64_t, bool,
                                     c10::string_view, double, OptionalTensor, OptionalTensor);

// A variable-length batch's lengths; cu_seqlens undefined: a fixed-length
// batch. Not an input of the autograd graph (an argument of another type than
// a tensor: no gradient, and C++ autograd takes no undefined input tensor).
struct Lengths {
  at::Tensor cu_seqlens_q, cu_seqlens_k;
  int64_t max_seqlen_q = 0, max_seqlen_k = 0;
};

// The autograd node of both forwards, fixed-length and variable-length. sinks
// (optional: an absent one is no input of the graph) has a gradient; the ALiBi
// slopes (in `alibi`, like the lengths) have none, as in flash-attn.
struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const std::optional<at::Tensor>& sinks, const Lengths& lengths,
                               std::optional<double> softmax_scale, bool causal, int64_t window_left,
                               int64_t window_right, bool deterministic, c10::string_view kernel, double softcap,
                               const Modifications& alibi, int64_t sm_margin) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    const auto& [cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k] = lengths;
    const bool varlen = cu_seqlens_q.defined();
    auto [out, lse] =
        varlen ? op_handle<VarlenFwdSignature>("flashlab::varlen_fwd")
                     .call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                           causal, window_left, window_right, deterministic, kernel, softcap, alibi.alibi_slopes,
                           sinks, sm_margin)
               : op_handle<FwdSignature>("flashlab::fwd")
                     .call(q, k, v, softmax_scale, causal, window_left, window_right, deterministic, kernel,
                           softcap, alibi.alibi_slopes, sinks, sm_margin);
    ctx->save_for_backward({q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi.alibi_slopes.value_or(at::Tensor()),
                            sinks.value_or(at::Tensor())});
    ctx->saved_data["softcap"] = softcap;
    ctx->saved_data["max_seqlen_q"] = max_seqlen_q;
    ctx->saved_data["max_seqlen_k"] = max_seqlen_k;
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["kernel"] = backward_kernel(kernel);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    auto& data = ctx->saved_data;
    const std::optional<double> softmax_scale = data["softmax_scale"].toOptional<double>();
    const bool causal = data["causal"].toBool(), deterministic = data["deterministic"].toBool();
    const int64_t window_left = data["window_left"].toInt(), window_right = data["window_right"].toInt();
    const std::string kernel = data["kernel"].toStringRef();
    const at::Tensor dout = grads[0].contiguous();
    const double softcap = data["softcap"].toDouble();
    const auto optional = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    const std::optional<at::Tensor> alibi_slopes = optional(saved[7]), sinks = optional(saved[8]);
    auto [dq, dk, dv, dsinks] =
        saved[5].defined()
            ? op_handle<VarlenBwdSignature>("flashlab::varlen_bwd")
                  .call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5], saved[6],
                        data["max_seqlen_q"].toInt(), data["max_seqlen_k"].toInt(), softmax_scale, causal,
                        window_left, window_right, deterministic, kernel, softcap, alibi_slopes, sinks)
            : op_handle<BwdSignature>("flashlab::bwd")
                  .call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], softmax_scale, causal,
                        window_left, window_right, deterministic, kernel, softcap, alibi_slopes, sinks);
    return {dq, dk, dv, sinks ? dsinks : at::Tensor(), {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  }
};

TensorPair fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        std::optional<double> softmax_scale, bool causal, int64_t window_left,
                        int64_t window_right, bool deterministic, c10::string_view kernel, double softcap,
                        const std::optional<at::Tensor>& alibi_slopes, const std::optional<at::Tensor>& sinks,
                        int64_t sm_margin) {
  const variable_list result =
      AttentionFunction::apply(q, k, v, sinks, Lengths{}, softmax_scale, causal, window_left, window_right,
                               deterministic, kernel, softcap, Modifications{0.0, alibi_slopes, std::nullopt},
                               sm_margin);
  return {result[0], result[1]};
}

TensorPair varlen_fwd_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k,
                               std::optional<double> softmax_scale, bool causal,
                               int64_t window_left, int64_t window_right, bool deterministic,
                               c10::string_view kernel, double softcap,
                               const std::optional<at::Tensor>& alibi_slopes,
                               const std::optional<at::Tensor>& sinks, int64_t sm_margin) {
  const variable_list result = AttentionFunction::apply(
      q, k, v, sinks, Lengths{cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k}, softmax_scale, causal,
      window_left, window_right, deterministic, kernel, softcap, Modifications{0.0, alibi_slopes, std::nullopt},
      sm_margin);
  return {result[0], result[1]};
}

// ---------------------------------------------------------------------------
// Device-side values (attention.h, "Values on the device").

void check_errors(std::optional<int64_t> device) {
  check_device_errors(device ? std::optional<int>(to_int(*device, "device")) : std::nullopt);
}

bool set_strict(bool on) {
  const bool before = strict_checks();
  set_strict_checks(on);
  return before;
}

bool strict() { return strict_checks(); }

// A problem the kernel is asked about (no device: compute capability 0): one
// contiguous (1, 128, 1, head_dim) sequence of `dtype`.
AttentionParams probe(int head_dim, DataType dtype) {
  AttentionParams params;
  params.batch = params.heads = params.kv_heads = 1;
  params.seqlen_q = params.seqlen_k = 128;
  params.head_dim = head_dim;
  params.dtype = dtype;
  params.q_head_stride = params.k_head_stride = params.v_head_stride = params.out_head_stride = head_dim;
  params.q_row_stride = params.k_row_stride = params.v_row_stride = params.out_row_stride = head_dim;
  params.q_batch_stride = params.k_batch_stride = params.v_batch_stride = params.out_batch_stride = 128 * head_dim;
  params.lse_batch_stride = params.lse_head_stride = 128;
  return params;
}

// The head dims the kernel has code for (those it runs a problem at, 1 to 256:
// what its padded_head_dim maps every head dim to) that its unsupported_reason
// takes in fp16, and the dtypes it takes at the first of them.
std::pair<std::vector<int>, std::vector<std::string>> head_dims_and_dtypes(const KernelVariant& kernel) {
  std::vector<int> head_dims;
  for (int head_dim = 1; head_dim <= 256; ++head_dim) {
    const int runs_at = padded_head_dim(kernel, head_dim);
    if (runs_at == head_dim && kernel.unsupported_reason(probe(head_dim, DataType::float16)).empty())
      head_dims.push_back(head_dim);
  }
  std::vector<std::string> dtypes;
  if (!head_dims.empty())
    for (const DataType dtype : {DataType::float16, DataType::bfloat16, DataType::float32})
      if (kernel.unsupported_reason(probe(head_dims.front(), dtype)).empty()) dtypes.push_back(data_type_name(dtype));
  return {head_dims, dtypes};
}

// One entry per registered kernel, fastest first (the order "auto" tries):
// "name\tforward[,backward][,kvcache]\tsummary\tdtypes\thead dims" (dtypes
// "fp16,bf16[,fp32]", head dims the ones it has code for, "64,128,256").
// No device access.
std::vector<std::string> kernels() {
  std::vector<std::string> entries;
  for (const auto& kernel : registered_kernels()) {
    std::string passes = "forward";
    if (kernel.backward_launch != nullptr) passes += ",backward";
    if (kernel.kvcache_launch != nullptr) passes += ",kvcache";
    const auto [head_dims, dtypes] = head_dims_and_dtypes(kernel);
    std::string dims, types;
    for (const int head_dim : head_dims) dims += (dims.empty() ? "" : ",") + std::to_string(head_dim);
    for (const std::string& dtype : dtypes) types += (types.empty() ? "" : ",") + dtype;
    entries.push_back(kernel.name + "\t" + passes + "\t" + kernel.summary + "\t" + types + "\t" + dims);
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
      "int window_left=-1, int window_right=-1, bool deterministic=False, str kernel_name=\"auto\", float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, "
      "int sm_margin=0) -> (Tensor out, Tensor lse)",
      tags);
  m.def(
      "varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
      "int max_seqlen_q, int max_seqlen_k, float? softmax_scale=None, bool causal=False, "
      "int window_left=-1, int window_right=-1, bool deterministic=False, str kernel_name=\"auto\", float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None, "
      "int sm_margin=0) -> (Tensor out, Tensor lse)",
      tags);
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "bool deterministic=False, str kernel_name=\"auto\", float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
      tags);
  m.def(
      "varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "bool deterministic=False, str kernel_name=\"auto\", float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)",
      tags);
  // k_cache and v_cache are written in place when k and v are given.
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k=None, "
      "Tensor? v=None, Tensor? cache_seqlens=None, Tensor? block_table=None, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "int num_splits=0, str kernel_name=\"auto\", float softcap=0.0, Tensor? alibi_slopes=None, Tensor? sinks=None) -> (Tensor out, Tensor lse)",
      tags);
  // e4m3 q, k, v (forward only): out (out_dtype: BFloat16 by default, or Half), lse.
  m.def(
      "fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor? q_descale=None, Tensor? k_descale=None, "
      "Tensor? v_descale=None, float? softmax_scale=None, bool causal=False, int window_left=-1, "
      "int window_right=-1, ScalarType? out_dtype=None, str kernel_name=\"auto\") -> (Tensor out, Tensor lse)",
      tags);
  m.def(
      "varlen_fwd_fp8(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, "
      "int max_seqlen_k, Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, "
      "float? softmax_scale=None, bool causal=False, int window_left=-1, int window_right=-1, "
      "ScalarType? out_dtype=None, str kernel_name=\"auto\") -> (Tensor out, Tensor lse)",
      tags);
  m.def("kernels() -> str[]", &flashlab::python::kernels);
  // The ring's merge step (flashlab.distributed.merge_partial on CUDA tensors).
  m.def("merge_attention_states_(Tensor(a!) out, Tensor(b!) lse, Tensor block_out, Tensor block_lse) -> ()");
  // No tensors: catch-all kernels, callable without a device.
  m.def("check_errors(int? device=None) -> ()", &flashlab::python::check_errors);
  m.def("set_strict_checks(bool on) -> bool", &flashlab::python::set_strict);
  m.def("strict_checks() -> bool", &flashlab::python::strict);
}

TORCH_LIBRARY_IMPL(flashlab, Autograd, m) {
  m.impl("fwd", &flashlab::python::fwd_autograd);
  m.impl("varlen_fwd", &flashlab::python::varlen_fwd_autograd);
}

TORCH_LIBRARY_IMPL(flashlab, CUDA, m) {
  m.impl("fwd", &flashlab::python::fwd);
  m.impl("varlen_fwd", &flashlab::python::varlen_fwd);
  m.impl("bwd", &flashlab::python::bwd);
  m.impl("varlen_bwd", &flashlab::python::varlen_bwd);
  m.impl("fwd_kvcache", &flashlab::python::fwd_kvcache);
  m.impl("fwd_fp8", &flashlab::python::fwd_fp8);
  m.impl("varlen_fwd_fp8", &flashlab::python::varlen_fwd_fp8);
  m.impl("merge_attention_states_", &flashlab::merge_attention_states_);
}
