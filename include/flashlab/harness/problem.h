// One seeded attention problem and the shared check that every executable and
// test uses: make inputs, poison the outputs, run the kernel, compare with the
// reference under flash-attn's rule.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/compare.h"
#include "flashlab/harness/fp8.h"
#include "flashlab/harness/reference.h"

namespace flashlab {

enum class Layout { bshd, packed_qkv };

struct ProblemSpec {
  std::string kernel = "auto";
  int batch = 2, heads = 8, kv_heads = 8;
  int seqlen_q = 113, seqlen_k = 113, head_dim = 64;
  at::ScalarType dtype = at::kHalf;
  bool causal = false;
  std::optional<double> softmax_scale;
  int window_left = -1, window_right = -1;
  uint64_t seed = 0;
  Layout layout = Layout::bshd;
  bool float64_reference = false;  // always on for float32 inputs
  // Variable-length batch: per-sequence lengths (0 allowed). Empty seqlens_q:
  // fixed length. Set, batch/seqlen_q/seqlen_k are ignored and the inputs are
  // packed (total_tokens, heads, head_dim); empty seqlens_k means "as seqlens_q".
  std::vector<int> seqlens_q, seqlens_k;
  // Q and K are multiplied by this after drawing, so scores grow by its square
  // (overflow tests).
  double qk_input_scale = 1.0;
  // Score modifications (issue 33; AttentionOptions says their definitions):
  // softcap (0: off); ALiBi slopes, ALiBi's geometric 2^(-8 (h + 1) / heads)
  // per head, or per batch entry and head times (b + 1) / batches; sinks,
  // normal(0, 1) per head from their own MT19937 stream (sinks_seed).
  enum class Alibi { none, per_head, per_batch };
  double softcap = 0.0;
  Alibi alibi = Alibi::none;
  bool sinks = false;
  bool modified() const { return softcap != 0.0 || alibi != Alibi::none || sinks; }
  // Channels 3..6 of Q, K and V 20x larger after drawing (activations' outlier
  // features: what FP8's scaling has to cope with), any dtype.
  bool outliers = false;
  // FP8 (dtype Float8_e4m3fn, the e4m3 forward, fixed length and bshd only): Q, K,
  // V are drawn in float32 (qk_input_scale and outliers applied), then quantized
  // by fp8_scaling (harness/fp8.h); the output is fp8_output_dtype.
  Fp8Scaling fp8_scaling = Fp8Scaling::per_head;
  at::ScalarType fp8_output_dtype = at::kBFloat16;
  // Q and K multiplied by random_hadamard(head_dim, seed) before quantizing (q k^T
  // unchanged; FA3's incoherent processing for outlier channels).
  bool fp8_hadamard = false;
  bool is_fp8() const { return dtype == at::kFloat8_e4m3fn; }
  at::ScalarType output_dtype() const { return is_fp8() ? fp8_output_dtype : dtype; }

  bool is_varlen() const { return !seqlens_q.empty(); }
  const std::vector<int>& key_seqlens() const { return seqlens_k.empty() ? seqlens_q : seqlens_k; }
  std::string describe() const;
  // The options of a problem without score modifications or e4m3 inputs (those
  // need their inputs: attention_options(spec, inputs)).
  AttentionOptions attention_options() const;
};

struct ProblemInputs {
  at::Tensor q, k, v;  // (B, S, H, D) views; with packed_qkv they share one buffer
  // Variable-length specs: q, k, v are (total, H, D) and these describe the
  // sequences (cu_seqlens int32 on the inputs' device).
  at::Tensor cu_seqlens_q, cu_seqlens_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  // ProblemSpec's score modifications, float32 on the inputs' device; undefined when off.
  at::Tensor alibi_slopes, sinks;
  // e4m3 specs: q, k, v hold the e4m3 values; these their float32 (batch,
  // kv_heads) descale factors and the float32 values they were quantized from.
  at::Tensor q_descale, k_descale, v_descale;
  at::Tensor q_source, k_source, v_source;
  Fp8Tensor q8() const { return {q, q_descale, cu_seqlens_q}; }
  Fp8Tensor k8() const { return {k, k_descale, cu_seqlens_k}; }
  Fp8Tensor v8() const { return {v, v_descale, cu_seqlens_k}; }
};

// The options of spec with its inputs' score modifications.
AttentionOptions attention_options(const ProblemSpec& spec, const ProblemInputs& inputs);
// The reference's modification for spec and its inputs.
ScoreModification reference_modification(const ProblemSpec& spec, const ProblemInputs& inputs);
// An e4m3 spec's inputs: q_source, k_source, v_source (set from q, k, v when
// undefined: the values as drawn) quantized by the spec's fp8_scaling (and
// fp8_hadamard) into q, k, v and their descales; with random = false, uninitialized
// e4m3 tensors and descales of 1 (shapes only). make_inputs calls it; the accuracy
// report and flashlab-bench's +e4m3 rows requantize with it.
void quantize_inputs(const ProblemSpec& spec, ProblemInputs& inputs, bool random = true);
// The sinks' MT19937 stream: apart from Q, K, V's and dout's.
uint64_t sinks_seed(uint64_t seed);

// Q, K, V from MT19937 normal(0, 1) values seeded by spec.seed. With
// random = false the tensors have the right shapes and strides but no values
// (enough to ask a kernel whether it supports the problem).
ProblemInputs make_inputs(const ProblemSpec& spec, at::Device device, bool random = true);
// The spec's ALiBi slopes and sinks alone into inputs (make_inputs' last step;
// the benchmark adds them to inputs it made for the plain problem).
void draw_score_modifications(const ProblemSpec& spec, at::Device device, ProblemInputs& inputs,
                              bool random = true);

// A parameter block of spec built on the host from shapes and strides alone
// (CPU tensors without values): make(spec', inputs) on spec with one batch
// entry when it is fixed-length (strides and support do not depend on the
// batch count), then given spec's batch count; use(params) runs while the
// tensors its pointers point into (a varlen batch's cu_seqlens, which
// sequence_view reads) are alive, and its result is returned. Support checks
// and --locate.
template <class Make, class Use>
auto with_host_shape_params(const ProblemSpec& spec, Make&& make, Use&& use) {
  ProblemSpec shape_only = spec;
  if (!spec.is_varlen()) shape_only.batch = 1;
  const ProblemInputs inputs = make_inputs(shape_only, at::kCPU, /*random=*/false);
  auto params = make(shape_only, inputs);
  if (!spec.is_varlen()) params.batch = spec.batch;
  return use(params);
}

// Empty when `kernel` can run the spec on a device of this compute capability
// (0: any), else the reason. Touches no device.
std::string unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                               int compute_capability = 0);

// The check, step by step. check_kernel composes them in this order; a
// backward check reuses make_inputs, poisoned, the reference and tolerance
// rules and compare_rows with its own run and reference steps.
//
//   inputs    make_inputs(spec, device)
//   kernel    resolve_kernel(spec, inputs), forward_params(spec, inputs)
//   poison    poisoned_forward_outputs(spec, inputs)
//   run       run_forward(kernel, spec, inputs, outputs)
//   reference reference_forward(spec, inputs, params)
//   tolerance forward_tolerance(spec, reference)
//   compare   compare_forward(spec, params, tiles, outputs, reference, tolerance)

// The kernel `spec.kernel` names ("auto" resolved) for these inputs; throws
// c10::Error with the reason when it cannot run them.
const KernelVariant& resolve_kernel(const ProblemSpec& spec, const ProblemInputs& inputs);
// The forward parameter block for these inputs (out and lse may be undefined:
// then no output pointers). No launch, no device access.
AttentionParams forward_params(const ProblemSpec& spec, const ProblemInputs& inputs,
                               const at::Tensor& out = at::Tensor(),
                               const at::Tensor& lse = at::Tensor());

// A contiguous tensor of NaN: an element a kernel never writes stays NaN and
// fails the comparison.
at::Tensor poisoned(at::IntArrayRef sizes, const at::TensorOptions& options);

struct ForwardOutputs {
  at::Tensor out;  // like q (e4m3: of the spec's output dtype), contiguous
  at::Tensor lse;  // float32 (batch, heads, seqlen_q), or (heads, total_q) for varlen
};
ForwardOutputs poisoned_forward_outputs(const ProblemSpec& spec, const ProblemInputs& inputs);

// Enqueues `kernel` on the current stream, writing into `outputs`. Does not
// synchronize.
void run_forward(const KernelVariant& kernel, const ProblemSpec& spec, const ProblemInputs& inputs,
                 const ForwardOutputs& outputs);

struct ForwardReference {
  ReferenceOutput reference;       // float32, or float64 for fp32 inputs / float64_reference
  ReferenceOutput same_precision;  // torch's math attention in the input dtype
  // e4m3: reference is float64 attention of the dequantized values; same_precision's
  // out is fp8_path_attention (the FP8 arithmetic), its lse torch's in the output's
  // 16-bit dtype on the dequantized values.
};
// Softmax scale and window as the kernel sees them (from `params`).
ForwardReference reference_forward(const ProblemSpec& spec, const ProblemInputs& inputs,
                                   const AttentionParams& params);

// flash-attn's pass rule for one tensor: at most twice (gradients: three
// times) the error torch's own same-precision math makes, plus a rounding
// atol, plus 4 float32 ulps of the largest reference value (kernels accumulate
// in float32; with float32 inputs torch's own error can be a single ulp).
struct Tolerance {
  double same_precision_factor = 2;  // 2 for out and lse, 3 for dq, dk, dv
  double same_precision_err = 0;     // max |same precision - reference| (finite elements)
  double rounding_atol = 0;
  double float32_floor = 0;
  // dsinks only: twice what storing the output in the input dtype moves it (the
  // kernels take D from the stored output; torch's path never rounds it).
  double stored_output_term = 0;
  double bound() const {
    return same_precision_factor * same_precision_err + rounding_atol + float32_floor + stored_output_term;
  }
};
// The rule for `reference` (any floating dtype) against torch's same-precision result.
Tolerance tolerance_rule(const at::Tensor& reference, const at::Tensor& same_precision,
                         double rounding_atol, double same_precision_factor = 2);
// flash-attn's fwd_atol: twice the rounding of (x + 0.3) - 0.3 in `dtype`, about
// one ulp at the magnitude of `reference`.
double fwd_atol(const at::Tensor& reference, at::ScalarType dtype);

struct ForwardTolerance {
  Tolerance out;  // rounding atol: fwd_atol in the input dtype
  Tolerance lse;  // rounding atol: the rounding of the reference LSE to float32
};
ForwardTolerance forward_tolerance(const ProblemSpec& spec, const ForwardReference& reference);

// Compares a kernel's tensor with the reference element by element as
// (batch, row, head, col): (B, S, H, D) as is, a packed (total, H, D) as one
// batch of total rows.
ComparisonReport compare_rows(const std::string& name, const at::Tensor& actual,
                              const at::Tensor& expected, double tolerance,
                              const TileContext& context);
// The same for per-row statistics (LSE): (B, H, S), or packed (H, total).
ComparisonReport compare_lse_rows(const std::string& name, const at::Tensor& actual,
                                  const at::Tensor& expected, double tolerance,
                                  const TileContext& context);
// What the tile report needs to name tiles (varlen: the sequences' offsets, so
// positions and tiles are per sequence).
TileContext tile_context(const ProblemSpec& spec, const AttentionParams& params, const TileShape& tiles);

// NaN/inf origin: what a report needs to say whether a row's inputs were
// finite. Tensors as the kernel got them ((B, S, H, D), or packed (total, H, D)
// with host prefix sums); dout only for the backward.
struct OriginInputs {
  at::Tensor q, k, v, dout;
  std::vector<int> cu_seqlens_q, cu_seqlens_k;  // empty for fixed length
  int window_left = -1, window_right = -1;
};
OriginInputs origin_inputs(const ProblemSpec& spec, const ProblemInputs& inputs,
                           const AttentionParams& params, const at::Tensor& dout = at::Tensor());
// What the rows of a compared tensor are: out and dq (query rows, like q),
// lse ((B, H, S) or packed (H, total)), dk and dv (key rows, like k).
enum class RowKind { query, lse, key };
// When `actual` holds a NaN/inf the reference does not (equal infinities and
// NaN against NaN do not count), sets report.nonfinite: the first one in
// (batch, row, head, col) order, and the finiteness of its row's inputs (query
// rows: the q row, the k/v rows of the keys it sees under the mask, dout; key
// rows: the k/v row, the q and dout rows of the query rows that see it).
void explain_nonfinite(ComparisonReport& report, const at::Tensor& actual, const at::Tensor& expected,
                       const OriginInputs& inputs, RowKind kind);

// explain_nonfinite for out and lse against the forward reference: the
// forward check and the backward check report their forward alike.
void explain_forward_nonfinite(ComparisonReport& out, ComparisonReport& lse,
                               const ForwardOutputs& outputs, const ForwardReference& reference,
                               const OriginInputs& origin);


struct ForwardComparison {
  ComparisonReport out, lse;
};
ForwardComparison compare_forward(const ProblemSpec& spec, const AttentionParams& params,
                                  const TileShape& tiles, const ForwardOutputs& outputs,
                                  const ForwardReference& reference,
                                  const ForwardTolerance& tolerance);

struct CheckResult {
  std::string kernel;  // the kernel that ran (resolves "auto")
  std::string problem;
  TileShape tiles;
  ComparisonReport out, lse;
  double ref_err = 0;      // max |torch same-precision math - reference| on the output
  double storage_err = 0;  // flash-attn's fwd_atol: 2 max |((ref + 0.3) - 0.3) - ref| in the input dtype
  double kernel_ms = -1;   // median over the timed launches, when timed
  bool lse_checked = true;  // false: the code checked returned no LSE (forward_check_result)
  // e4m3 problems: the same-precision path is the FP8 arithmetic (fp8_path_attention),
  // and a timed check's extras step measures the accuracy against the unquantized values.
  bool fp8 = false;
  std::optional<Fp8Accuracy> fp8_accuracy;
  bool passed() const { return out.passed() && (!lse_checked || lse.passed()); }
  std::string format() const;
  std::string to_json() const;
};

// The forward check's compare step for outputs from any code: check_kernel's
// report (tolerances, element comparison, NaN/inf origin) naming `name` and
// its `tiles`. outputs.lse undefined: no LSE is compared (lse_checked false).
// flashlab.testing checks a user's Python function with it.
CheckResult forward_check_result(const std::string& name, const TileShape& tiles, const ProblemSpec& spec,
                                 const ProblemInputs& inputs, const ForwardOutputs& outputs,
                                 const ForwardReference& reference);

struct CheckOptions {
  int timed_launches = 0;  // > 0: also time the kernel (median of this many launches)
  // check_kvcache: one more launch, after an L2 flush, recording the split
  // kernel's block timeline (KernelVariant::supports_block_timeline).
  bool block_timeline = false;
};

// The whole forward check: src/harness/check_pipeline.h's steps (the same for
// check_backward and check_kvcache) on current_cuda_device().
CheckResult check_kernel(const ProblemSpec& spec, const CheckOptions& check_options = {});

// Skip reason for GPU tests and executables: empty when a CUDA device is usable.
std::string cuda_unavailable_reason();

// The device the harness and the tools make their tensors on and launch on:
// the current CUDA device (flashlab-run / flashlab-bench --device, or
// CUDA_VISIBLE_DEVICES, pick it), never a fixed index.
at::Device current_cuda_device();
// Makes CUDA device `index` the current one (the tools' --device); empty on
// success, else why not ("--device 2: this machine has 1 CUDA device (0)").
std::string select_cuda_device(int index);

}  // namespace flashlab
