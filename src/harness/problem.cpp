#include "flashlab/harness/problem.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <functional>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/event_timer.h"
#include "flashlab/harness/random_inputs.h"
#include "flashlab/harness/reference.h"
#include "common/visible_keys.h"
#include "check_pipeline.h"
#include "json_text.h"

namespace flashlab {
namespace {

double max_finite_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor difference = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  const at::Tensor finite = difference.masked_select(at::isfinite(difference));
  return finite.numel() == 0 ? 0.0 : finite.max().item<double>();
}

std::string join_lengths(const std::vector<int>& lengths) {
  std::string text;
  for (const int length : lengths) text += (text.empty() ? "" : ",") + std::to_string(length);
  return text;
}

// The sequences of a variable-length spec as prefix sums (cu_seqlens).
std::vector<int> sequence_offsets(const std::vector<int>& lengths) {
  std::vector<int> offsets(lengths.size() + 1, 0);
  for (size_t index = 0; index < lengths.size(); ++index)
    offsets[index + 1] = offsets[index] + lengths[index];
  return offsets;
}
at::Tensor prefix_sums(const std::vector<int>& lengths, at::Device device) {
  return at::tensor(sequence_offsets(lengths), at::TensorOptions().dtype(at::kInt)).to(device);
}


// A packed (total, H, D) tensor as one batch of rows; (B, H, S) LSE as (B, S, H, 1).
at::Tensor as_rows(const at::Tensor& values) { return values.dim() == 3 ? values.unsqueeze(0) : values; }
at::Tensor lse_as_rows(const at::Tensor& values) {
  return values.dim() == 2 ? values.t().unsqueeze(0).unsqueeze(-1) : values.permute({0, 2, 1}).unsqueeze(-1);
}

// Non-finite values of one (row, head) of a (B, S, H, D) or packed (total, H, D) tensor.
int64_t nonfinite_in_row(const at::Tensor& tensor, int64_t batch, int64_t packed_row, int64_t row,
                         int64_t head) {
  const at::Tensor values = tensor.dim() == 3 ? tensor[packed_row][head] : tensor[batch][row][head];
  return at::isfinite(values).logical_not().sum().item<int64_t>();
}

// Rows first..first + count - 1 of heads [head, head + heads) of one sequence:
// (count, heads, D).
at::Tensor row_block(const at::Tensor& tensor, int64_t batch, int64_t row0, int64_t first, int64_t count,
                     int64_t head, int64_t heads) {
  const at::Tensor sequence = tensor.dim() == 3 ? tensor.narrow(0, row0, tensor.size(0) - row0) : tensor[batch];
  return sequence.narrow(0, first, count).narrow(1, head, heads);
}

// Per row of a (count, heads, D) block: whether any value is NaN/inf, (count, heads).
at::Tensor nonfinite_rows(const at::Tensor& block) { return at::isfinite(block).logical_not().any(-1); }


}  // namespace

std::string ProblemSpec::describe() const {
  std::ostringstream text;
  if (is_varlen())
    text << "varlen seqlens_q [" << join_lengths(seqlens_q) << "], seqlens_k ["
         << join_lengths(key_seqlens()) << "]";
  else
    text << "batch " << batch;
  text << ", heads " << heads << "/" << kv_heads;
  if (!is_varlen()) text << ", seqlen " << seqlen_q << "x" << seqlen_k;
  text << ", head_dim " << head_dim << ", " << c10::toString(dtype);
  if (is_fp8())
    text << " (descale " << fp8_scaling_name(fp8_scaling) << (fp8_hadamard ? ", Q and K Hadamard-rotated" : "")
         << ", output " << c10::toString(fp8_output_dtype) << ")";
  text << (causal ? ", causal" : "");
  if (window_left >= 0 || window_right >= 0)
    text << ", window (" << window_left << ", " << window_right << ")";
  if (softmax_scale) text << ", softmax_scale " << *softmax_scale;
  if (qk_input_scale != 1.0) text << ", q and k scaled by " << qk_input_scale;
  if (outliers) text << ", outlier channels 3-6 x20";
  if (softcap != 0.0) text << ", softcap " << softcap;
  if (alibi != Alibi::none) text << ", alibi " << (alibi == Alibi::per_head ? "per head" : "per batch entry and head");
  if (sinks) text << ", sinks";
  text << ", " << (layout == Layout::bshd ? "bshd" : "packed-qkv") << ", seed " << seed;
  return text.str();
}

namespace {
AttentionOptions mask_options(const ProblemSpec& spec) {
  AttentionOptions options;
  options.causal = spec.causal;
  options.softmax_scale = spec.softmax_scale;
  options.kernel = spec.kernel;
  options.window_left = spec.window_left;
  options.window_right = spec.window_right;
  return options;
}
}  // namespace

AttentionOptions ProblemSpec::attention_options() const {
  TORCH_CHECK(!modified() && !is_fp8(), "the problem has score modifications or e4m3 inputs (", describe(),
              "): its options come from attention_options(spec, inputs)");
  return mask_options(*this);
}

void draw_score_modifications(const ProblemSpec& spec, at::Device device, ProblemInputs& inputs, bool random) {
  const auto float32 = at::TensorOptions().dtype(at::kFloat);
  if (spec.alibi != ProblemSpec::Alibi::none) {
    const at::Tensor heads = at::arange(1, spec.heads + 1, float32.dtype(at::kDouble));
    at::Tensor slopes = at::pow(2.0, heads * (-8.0 / spec.heads));
    if (spec.alibi == ProblemSpec::Alibi::per_batch) {
      const int64_t batches = spec.is_varlen() ? static_cast<int64_t>(spec.seqlens_q.size()) : spec.batch;
      slopes = at::outer(at::arange(1, batches + 1, float32.dtype(at::kDouble)) / batches, slopes);
    }
    inputs.alibi_slopes = slopes.to(at::kFloat).contiguous().to(device);
  }
  if (spec.sinks)
    inputs.sinks = random ? mt19937_normal({spec.heads}, sinks_seed(spec.seed), device).to(at::kFloat)
                          : at::zeros({spec.heads}, float32.device(device));
}

ProblemInputs make_inputs(const ProblemSpec& spec, at::Device device, bool random) {
  // Leading dimensions: (batch, seqlen) for fixed length, (total_tokens) packed.
  std::vector<int64_t> q_rows = {spec.batch, spec.seqlen_q}, k_rows = {spec.batch, spec.seqlen_k};
  ProblemInputs inputs;
  if (spec.is_varlen()) {
    const std::vector<int>& seqlens_k = spec.key_seqlens();
    TORCH_CHECK(seqlens_k.size() == spec.seqlens_q.size(),
                "seqlens_q and seqlens_k must name the same number of sequences; got ",
                spec.seqlens_q.size(), " and ", seqlens_k.size());
    int64_t total_q = 0, total_k = 0;
    for (size_t index = 0; index < seqlens_k.size(); ++index) {
      TORCH_CHECK(spec.seqlens_q[index] >= 0 && seqlens_k[index] >= 0,
                  "sequence lengths must be >= 0; got ", spec.seqlens_q[index], " and ",
                  seqlens_k[index], " for sequence ", index);
      total_q += spec.seqlens_q[index];
      total_k += seqlens_k[index];
      inputs.max_seqlen_q = std::max(inputs.max_seqlen_q, spec.seqlens_q[index]);
      inputs.max_seqlen_k = std::max(inputs.max_seqlen_k, seqlens_k[index]);
    }
    TORCH_CHECK(total_q <= std::numeric_limits<int>::max() && total_k <= std::numeric_limits<int>::max(),
                "cu_seqlens are int32: the total token counts must fit; got ", total_q, " and ",
                total_k);
    inputs.cu_seqlens_q = prefix_sums(spec.seqlens_q, device);
    inputs.cu_seqlens_k = prefix_sums(seqlens_k, device);
    q_rows = {total_q};
    k_rows = {total_k};
  }
  const auto shape = [](std::vector<int64_t> rows, int64_t heads, int64_t head_dim) {
    rows.push_back(heads);
    rows.push_back(head_dim);
    return rows;
  };
  const auto count = [](const std::vector<int64_t>& dims) {
    int64_t product = 1;
    for (const int64_t dim : dims) product *= dim;
    return product;
  };
  const std::vector<int64_t> q_shape = shape(q_rows, spec.heads, spec.head_dim);
  const std::vector<int64_t> kv_shape = shape(k_rows, spec.kv_heads, spec.head_dim);
  // One generator draws Q, K and V back to back: creating and seeding an
  // MT19937 generator is the expensive part (seconds for the host generator).
  const int64_t q_count = count(q_shape);
  const int64_t kv_count = count(kv_shape);
  // e4m3: drawn in float32, quantized below.
  const at::ScalarType drawn = spec.is_fp8() ? at::kFloat : spec.dtype;
  TORCH_CHECK(!spec.is_fp8() || spec.layout == Layout::bshd,
              "e4m3 problems have the bshd layout (q, k and v are quantized one by one); got ", spec.describe());
  const auto options = at::TensorOptions().dtype(drawn).device(device);
  const at::Tensor pool = random ? mt19937_normal({q_count + 2 * kv_count}, spec.seed, device).to(drawn)
                                 : at::empty({q_count + 2 * kv_count}, options);
  if (spec.layout == Layout::packed_qkv) {
    TORCH_CHECK(q_rows == k_rows, "packed-qkv layout needs equal query and key lengths; got ",
                spec.is_varlen() ? "seqlens_q [" + join_lengths(spec.seqlens_q) + "] and seqlens_k [" +
                                       join_lengths(spec.key_seqlens()) + "]"
                                 : std::to_string(spec.seqlen_q) + " and " + std::to_string(spec.seqlen_k));
    const int64_t head_axis = static_cast<int64_t>(q_rows.size());
    const at::Tensor packed = pool.view(shape(q_rows, spec.heads + 2 * spec.kv_heads, spec.head_dim));
    inputs.q = packed.narrow(head_axis, 0, spec.heads);
    inputs.k = packed.narrow(head_axis, spec.heads, spec.kv_heads);
    inputs.v = packed.narrow(head_axis, spec.heads + spec.kv_heads, spec.kv_heads);
  } else {
    inputs.q = pool.narrow(0, 0, q_count).view(q_shape);
    inputs.k = pool.narrow(0, q_count, kv_count).view(kv_shape);
    inputs.v = pool.narrow(0, q_count + kv_count, kv_count).view(kv_shape);
  }
  if (random && spec.qk_input_scale != 1.0) {
    inputs.q.mul_(spec.qk_input_scale);
    inputs.k.mul_(spec.qk_input_scale);
  }
  if (random && spec.outliers && spec.head_dim > 3)
    for (const at::Tensor& x : {inputs.q, inputs.k, inputs.v}) x.narrow(-1, 3, std::min(4, spec.head_dim - 3)).mul_(20.0);
  if (spec.is_fp8()) quantize_inputs(spec, inputs, random);
  draw_score_modifications(spec, device, inputs, random);
  return inputs;
}

void quantize_inputs(const ProblemSpec& spec, ProblemInputs& inputs, bool random) {
  if (!inputs.q_source.defined()) inputs.q_source = inputs.q, inputs.k_source = inputs.k, inputs.v_source = inputs.v;
  at::Tensor sources[] = {inputs.q_source.to(at::kFloat), inputs.k_source.to(at::kFloat),
                          inputs.v_source.to(at::kFloat)};
  if (spec.fp8_hadamard && random) {  // q R (k R)^T = q k^T
    const at::Tensor rotation = random_hadamard(spec.head_dim, spec.seed, inputs.q_source.device());
    sources[0] = at::matmul(sources[0], rotation), sources[1] = at::matmul(sources[1], rotation);
  }
  at::Tensor* values[] = {&inputs.q, &inputs.k, &inputs.v};
  at::Tensor* descales[] = {&inputs.q_descale, &inputs.k_descale, &inputs.v_descale};
  const at::Tensor* offsets[] = {&inputs.cu_seqlens_q, &inputs.cu_seqlens_k, &inputs.cu_seqlens_k};
  const int64_t batches = spec.is_varlen() ? static_cast<int64_t>(spec.seqlens_q.size()) : spec.batch;
  for (int index = 0; index < 3; ++index) {
    const at::Tensor& source = sources[index];
    const Fp8Tensor quantized =
        random ? quantize_e4m3(source, spec.kv_heads, spec.fp8_scaling, *offsets[index])
               : Fp8Tensor{at::empty(source.sizes(), source.options().dtype(at::kFloat8_e4m3fn)),
                           at::ones({batches, spec.kv_heads}, source.options())};
    *values[index] = quantized.values;
    *descales[index] = quantized.descale;
  }
}

uint64_t sinks_seed(uint64_t seed) { return seed ^ 0x2545F4914F6CDD1DULL; }

AttentionOptions attention_options(const ProblemSpec& spec, const ProblemInputs& inputs) {
  AttentionOptions options = mask_options(spec);
  options.softcap = spec.softcap;
  options.alibi_slopes = inputs.alibi_slopes;
  options.sinks = inputs.sinks;
  if (spec.is_fp8()) {
    options.q_descale = inputs.q_descale;
    options.k_descale = inputs.k_descale;
    options.v_descale = inputs.v_descale;
    options.output_dtype = spec.fp8_output_dtype;
  }
  return options;
}

ScoreModification reference_modification(const ProblemSpec& spec, const ProblemInputs& inputs) {
  ScoreModification modification;
  modification.softcap = spec.softcap;
  modification.alibi_slopes = inputs.alibi_slopes;
  modification.sinks = inputs.sinks;
  return modification;
}

std::string unsupported_reason(const KernelVariant& kernel, const ProblemSpec& spec,
                               int compute_capability) {
  return with_host_shape_params(
      spec, [](const ProblemSpec& shape_only, const ProblemInputs& inputs) { return forward_params(shape_only, inputs); },
      [&](AttentionParams& params) {
        params.device_compute_capability = compute_capability;
        return cannot_run_reason(kernel, params);
      });
}

std::string cuda_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls start clean
    return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return "no CUDA device found";
  if (!at::hasCUDA()) return "this torch build has no CUDA support";
  return {};
}

at::Device current_cuda_device() { return at::Device(at::kCUDA, c10::cuda::current_device()); }

std::string select_cuda_device(int index) {
  const std::string unavailable = cuda_unavailable_reason();
  if (!unavailable.empty()) return unavailable;
  const int count = static_cast<int>(c10::cuda::device_count());
  if (index < 0 || index >= count)
    return "--device " + std::to_string(index) + ": this machine has " + std::to_string(count) + " CUDA device" +
           (count == 1 ? " (0)" : "s (0 to " + std::to_string(count - 1) + ")");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return {};
}

const KernelVariant& resolve_kernel(const ProblemSpec& spec, const ProblemInputs& inputs) {
  const AttentionOptions options = attention_options(spec, inputs);
  // Developer kernels (planted bug, tuning configurations) by name.
  if (spec.kernel != "auto" && find_kernel(spec.kernel) == nullptr)
    if (const KernelVariant* dev = find_any_kernel(spec.kernel)) {
      const AttentionParams params = forward_params(spec, inputs);
      const std::string reason = cannot_run_reason(*dev, params);
      TORCH_CHECK(reason.empty(), "kernel ", dev->name, " cannot run ", describe_problem(params),
                  ": ", reason);
      return *dev;
    }
  // The kernel as it is, at its own head dims (no padding: run_forward calls run_kernel).
  return spec.is_varlen()
             ? select_varlen_kernel(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q,
                                    inputs.cu_seqlens_k, inputs.max_seqlen_q, inputs.max_seqlen_k,
                                    options, HeadDimPadding::none)
             : select_kernel(inputs.q, inputs.k, inputs.v, options, HeadDimPadding::none);
}

AttentionParams forward_params(const ProblemSpec& spec, const ProblemInputs& inputs,
                               const at::Tensor& out, const at::Tensor& lse) {
  const AttentionOptions options = attention_options(spec, inputs);
  return spec.is_varlen()
             ? make_varlen_params(inputs.q, inputs.k, inputs.v, inputs.cu_seqlens_q,
                                  inputs.cu_seqlens_k, inputs.max_seqlen_q, inputs.max_seqlen_k,
                                  out, lse, options)
             : make_params(inputs.q, inputs.k, inputs.v, out, lse, options);
}

at::Tensor poisoned(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return at::full(sizes, std::numeric_limits<double>::quiet_NaN(),
                  options.memory_format(at::MemoryFormat::Contiguous));
}

ForwardOutputs poisoned_forward_outputs(const ProblemSpec& spec, const ProblemInputs& inputs) {
  // LSE: (batch, heads, seqlen_q), or (heads, total_q) for a variable-length batch.
  const std::vector<int64_t> lse_shape =
      spec.is_varlen() ? std::vector<int64_t>{spec.heads, inputs.q.size(0)}
                       : std::vector<int64_t>{spec.batch, spec.heads, spec.seqlen_q};
  return {poisoned(inputs.q.sizes(), inputs.q.options().dtype(spec.output_dtype())),
          poisoned(lse_shape, inputs.q.options().dtype(at::kFloat))};
}

void run_forward(const KernelVariant& kernel, const ProblemSpec& spec, const ProblemInputs& inputs,
                 const ForwardOutputs& outputs) {
  run_kernel(kernel, forward_params(spec, inputs, outputs.out, outputs.lse));
}

namespace {
// The reference's scale, window and modifications as the kernel sees them (from `params`).
ReferenceOptions reference_options(const ProblemSpec& spec, const ProblemInputs& inputs,
                                   const AttentionParams& params) {
  ReferenceOptions options;
  options.softmax_scale = params.softmax_scale;
  options.window_left = params.window_left;
  options.window_right = params.window_right;
  options.modification = reference_modification(spec, inputs);
  return options;
}

// The reference attention of (q, k, v) laid out as `inputs` (packed rows for varlen).
ReferenceOutput reference_of(const ProblemSpec& spec, const ProblemInputs& inputs, const at::Tensor& q,
                             const at::Tensor& k, const at::Tensor& v, const ReferenceOptions& options) {
  return spec.is_varlen() ? reference_attention_varlen(q, k, v, inputs.cu_seqlens_q, inputs.cu_seqlens_k, options)
                          : reference_attention(q, k, v, options);
}
}  // namespace

ForwardReference reference_forward(const ProblemSpec& spec, const ProblemInputs& inputs,
                                   const AttentionParams& params) {
  ReferenceOptions options = reference_options(spec, inputs, params);
  const auto run = [&] { return reference_of(spec, inputs, inputs.q, inputs.k, inputs.v, options); };
  ForwardReference reference;
  if (spec.is_fp8()) {
    // The dequantized values' attention in float64, and the FP8 path's own arithmetic.
    const Fp8Tensor q = inputs.q8(), k = inputs.k8(), v = inputs.v8();
    const at::Tensor qd = dequantize_e4m3(q, at::kDouble), kd = dequantize_e4m3(k, at::kDouble),
                     vd = dequantize_e4m3(v, at::kDouble);
    options.compute_dtype = at::kDouble;
    reference.reference = reference_of(spec, inputs, qd, kd, vd, options);
    options.compute_dtype = spec.fp8_output_dtype;
    const ReferenceOutput fp8_path = fp8_path_attention(q, k, v, options, spec.fp8_output_dtype);
    const at::Tensor lse_16bit = reference_of(spec, inputs, qd, kd, vd, options).lse;
    // The LSE's same-precision path: the FP8 arithmetic's (scores from the FP8 tensor
    // cores' short accumulator) or torch's in the output dtype, whichever is further off.
    const at::Tensor& exact_lse = reference.reference.lse;
    reference.same_precision = {fp8_path.out, max_finite_abs_difference(fp8_path.lse, exact_lse) >=
                                                      max_finite_abs_difference(lse_16bit, exact_lse)
                                                  ? fp8_path.lse
                                                  : lse_16bit};
    return reference;
  }
  options.compute_dtype =
      (spec.float64_reference || spec.dtype == at::kFloat) ? at::kDouble : at::kFloat;
  reference.reference = run();
  options.compute_dtype = spec.dtype;
  reference.same_precision = run();
  return reference;
}

double fwd_atol(const at::Tensor& reference, at::ScalarType dtype) {
  const at::Tensor stored = reference.to(dtype);
  return 2 * max_finite_abs_difference((stored + 0.3) - 0.3, stored);
}

Tolerance tolerance_rule(const at::Tensor& reference, const at::Tensor& same_precision,
                         double rounding_atol, double same_precision_factor) {
  Tolerance tolerance;
  tolerance.same_precision_factor = same_precision_factor;
  tolerance.same_precision_err = max_finite_abs_difference(same_precision, reference);
  tolerance.rounding_atol = rounding_atol;
  const at::Tensor finite = reference.masked_select(at::isfinite(reference));
  tolerance.float32_floor =
      finite.numel() == 0 ? 0.0 : 4 * FLT_EPSILON * finite.abs().max().item<double>();
  return tolerance;
}

ForwardTolerance forward_tolerance(const ProblemSpec& spec, const ForwardReference& reference) {
  const ReferenceOutput& exact = reference.reference;
  const ReferenceOutput& same = reference.same_precision;
  return {tolerance_rule(exact.out, same.out, fwd_atol(exact.out, spec.output_dtype())),
          // LSE is stored in float32: its rounding there is the atol.
          tolerance_rule(exact.lse, same.lse,
                         max_finite_abs_difference(exact.lse.to(at::kFloat), exact.lse))};
}

OriginInputs origin_inputs(const ProblemSpec& spec, const ProblemInputs& inputs,
                           const AttentionParams& params, const at::Tensor& dout) {
  OriginInputs origin;
  const auto host = [](const at::Tensor& tensor) {
    return tensor.defined() ? tensor.detach().to(at::kCPU, at::kFloat) : tensor;
  };
  origin.q = host(inputs.q);
  origin.k = host(inputs.k);
  origin.v = host(inputs.v);
  origin.dout = host(dout);
  if (spec.is_varlen()) {
    const auto prefix = [](const at::Tensor& offsets) {
      const at::Tensor values = offsets.to(at::kCPU, at::kInt).contiguous();
      return std::vector<int>(values.data_ptr<int>(), values.data_ptr<int>() + values.numel());
    };
    origin.cu_seqlens_q = prefix(inputs.cu_seqlens_q);
    origin.cu_seqlens_k = prefix(inputs.cu_seqlens_k);
  }
  origin.window_left = params.window_left;
  origin.window_right = params.window_right;
  return origin;
}

void explain_nonfinite(ComparisonReport& report, const at::Tensor& actual, const at::Tensor& expected,
                       const OriginInputs& inputs, RowKind kind) {
  const auto rows = [&](const at::Tensor& values) {
    return (kind == RowKind::lse ? lse_as_rows(values) : as_rows(values)).detach().to(at::kCPU, at::kDouble);
  };
  const at::Tensor got = rows(actual), want = rows(expected);
  const at::Tensor bad = at::isfinite(got).logical_not() & (got == want).logical_not() &
                         (at::isnan(got) & at::isnan(want)).logical_not();
  const at::Tensor where = bad.nonzero();  // row-major: (batch, row, head, col) order
  if (where.size(0) == 0) return;
  const int64_t batch0 = where[0][0].item<int64_t>(), packed_row = where[0][1].item<int64_t>();
  NonFiniteOrigin origin;
  origin.head = where[0][2].item<int64_t>();
  origin.col = where[0][3].item<int64_t>();
  origin.value = got[batch0][packed_row][origin.head][origin.col].item<double>();
  origin.rows_are_keys = kind == RowKind::key;
  origin.varlen = !inputs.cu_seqlens_q.empty();
  const std::vector<int>& own_offsets = origin.rows_are_keys ? inputs.cu_seqlens_k : inputs.cu_seqlens_q;
  origin.batch = batch0;
  origin.row = packed_row;
  if (origin.varlen) {
    const SequenceRow at = sequence_row(own_offsets, packed_row);
    origin.batch = at.sequence, origin.row = at.row;
  }
  const int64_t b = origin.batch;
  const int q_row0 = origin.varlen ? inputs.cu_seqlens_q[b] : 0;
  const int k_row0 = origin.varlen ? inputs.cu_seqlens_k[b] : 0;
  const int seqlen_q = origin.varlen ? inputs.cu_seqlens_q[b + 1] - q_row0 : static_cast<int>(inputs.q.size(1));
  const int seqlen_k = origin.varlen ? inputs.cu_seqlens_k[b + 1] - k_row0 : static_cast<int>(inputs.k.size(1));
  const int64_t heads = inputs.q.size(-2), group = heads / inputs.k.size(-2);
  const bool has_dout = inputs.dout.defined();
  if (!origin.rows_are_keys) {
    const int64_t row = origin.row, head = origin.head, kv_head = head / group;
    origin.own_nonfinite = nonfinite_in_row(inputs.q, b, q_row0 + row, row, head);
    if (has_dout) origin.dout_nonfinite = nonfinite_in_row(inputs.dout, b, q_row0 + row, row, head);
    const KeyRange keys = visible_keys(static_cast<int>(row), seqlen_q, seqlen_k, inputs.window_left,
                                       inputs.window_right);
    if (!keys.empty()) {
      origin.first_seen = keys.first, origin.last_seen = keys.last;
      origin.seen_rows = keys.last - keys.first + 1;
      const at::Tensor bad_keys =
          (nonfinite_rows(row_block(inputs.k, b, k_row0, keys.first, origin.seen_rows, kv_head, 1)) |
           nonfinite_rows(row_block(inputs.v, b, k_row0, keys.first, origin.seen_rows, kv_head, 1)))
              .squeeze(1);
      origin.seen_nonfinite_rows = bad_keys.sum().item<int64_t>();
      if (origin.seen_nonfinite_rows > 0)
        origin.first_nonfinite_seen = keys.first + bad_keys.nonzero()[0][0].item<int64_t>();
    }
  } else {
    const int64_t key = origin.row, kv_head = origin.head;
    origin.own_nonfinite = nonfinite_in_row(inputs.k, b, k_row0 + key, key, kv_head) +
                           nonfinite_in_row(inputs.v, b, k_row0 + key, key, kv_head);
    const KeyRange query_rows = visible_rows_of_keys(static_cast<int>(key), static_cast<int>(key), seqlen_q,
                                                     seqlen_k, inputs.window_left, inputs.window_right);
    if (!query_rows.empty()) {
      const int64_t count = query_rows.last - query_rows.first + 1;
      origin.first_seen = query_rows.first, origin.last_seen = query_rows.last;
      origin.seen_rows = count * group;
      const at::Tensor bad_rows =
          nonfinite_rows(row_block(inputs.q, b, q_row0, query_rows.first, count, kv_head * group, group));
      origin.seen_nonfinite_rows = bad_rows.sum().item<int64_t>();
      if (origin.seen_nonfinite_rows > 0)
        origin.first_nonfinite_seen = query_rows.first + bad_rows.any(1).nonzero()[0][0].item<int64_t>();
      if (has_dout)
        origin.dout_nonfinite =
            at::isfinite(row_block(inputs.dout, b, q_row0, query_rows.first, count, kv_head * group, group))
                .logical_not()
                .sum()
                .item<int64_t>();
    } else if (has_dout) {
      origin.dout_nonfinite = 0;
    }
  }
  report.nonfinite = origin;
}

ComparisonReport compare_rows(const std::string& name, const at::Tensor& actual,
                              const at::Tensor& expected, double tolerance,
                              const TileContext& context) {
  // A packed (total, H, D) tensor is one batch of total rows.
  const auto as_rows = [](const at::Tensor& values) {
    return values.dim() == 3 ? values.unsqueeze(0) : values;
  };
  return compare_elementwise(name, as_rows(actual), as_rows(expected), tolerance, context);
}

ComparisonReport compare_lse_rows(const std::string& name, const at::Tensor& actual,
                                  const at::Tensor& expected, double tolerance,
                                  const TileContext& context) {
  // (B, H, S) as (B, S, H, 1); a packed (H, total) as (1, total, H, 1).
  const auto as_rows = [](const at::Tensor& values) {
    return values.dim() == 2 ? values.t().unsqueeze(0).unsqueeze(-1)
                             : values.permute({0, 2, 1}).unsqueeze(-1);
  };
  return compare_elementwise(name, as_rows(actual), as_rows(expected), tolerance, context);
}

TileContext tile_context(const ProblemSpec& spec, const AttentionParams& params, const TileShape& tiles) {
  TileContext context;
  context.tiles = tiles;
  if (spec.is_varlen()) {  // packed rows: positions and tiles per sequence
    context.cu_seqlens_q = sequence_offsets(spec.seqlens_q);
    context.cu_seqlens_k = sequence_offsets(spec.key_seqlens());
  }
  context.seqlen_q = spec.seqlen_q;
  context.seqlen_k = spec.seqlen_k;
  context.window_left = params.window_left;
  context.window_right = params.window_right;
  return context;
}

ForwardComparison compare_forward(const ProblemSpec& spec, const AttentionParams& params,
                                  const TileShape& tiles, const ForwardOutputs& outputs,
                                  const ForwardReference& reference,
                                  const ForwardTolerance& tolerance) {
  const TileContext context = tile_context(spec, params, tiles);
  return {compare_rows("out", outputs.out, reference.reference.out, tolerance.out.bound(), context),
          compare_lse_rows("lse", outputs.lse, reference.reference.lse, tolerance.lse.bound(), context)};
}

void explain_forward_nonfinite(ComparisonReport& out, ComparisonReport& lse,
                               const ForwardOutputs& outputs, const ForwardReference& reference,
                               const OriginInputs& origin) {
  explain_nonfinite(out, outputs.out, reference.reference.out, origin, RowKind::query);
  if (outputs.lse.defined()) explain_nonfinite(lse, outputs.lse, reference.reference.lse, origin, RowKind::lse);
}

CheckResult forward_check_result(const std::string& name, const TileShape& tiles, const ProblemSpec& spec,
                                 const ProblemInputs& inputs, const ForwardOutputs& outputs,
                                 const ForwardReference& reference) {
  const AttentionParams params = forward_params(spec, inputs);
  const ForwardTolerance tolerance = forward_tolerance(spec, reference);
  CheckResult result;
  result.kernel = name;
  result.problem = spec.describe();
  result.tiles = tiles;
  result.ref_err = tolerance.out.same_precision_err;
  result.storage_err = tolerance.out.rounding_atol;
  result.lse_checked = outputs.lse.defined();
  result.fp8 = spec.is_fp8();
  if (result.lse_checked) {
    ForwardComparison comparison = compare_forward(spec, params, tiles, outputs, reference, tolerance);
    result.out = std::move(comparison.out);
    result.lse = std::move(comparison.lse);
  } else {
    result.out = compare_rows("out", outputs.out, reference.reference.out, tolerance.out.bound(),
                              tile_context(spec, params, tiles));
  }
  if (result.out.nan_count + result.out.inf_count + result.lse.nan_count + result.lse.inf_count > 0)
    explain_forward_nonfinite(result.out, result.lse, outputs, reference, origin_inputs(spec, inputs, params));
  return result;
}

namespace {

// check_kernel's steps (check_pipeline.h).
struct ForwardCheck {
  using Spec = ProblemSpec;
  using Options = CheckOptions;
  using Inputs = ProblemInputs;
  using Run = ForwardOutputs;
  using Reference = ForwardReference;
  using Result = CheckResult;
  static constexpr const char* kCheck = "check_kernel";

  static Inputs inputs(const Spec& spec, at::Device device) { return make_inputs(spec, device); }
  static const KernelVariant& kernel(const Spec& spec, const Inputs& inputs) { return resolve_kernel(spec, inputs); }
  static Run run(const KernelVariant& kernel, const Spec& spec, const Inputs& inputs, const Options&) {
    const ForwardOutputs outputs = poisoned_forward_outputs(spec, inputs);
    run_forward(kernel, spec, inputs, outputs);
    return outputs;
  }
  static Reference reference(const Spec& spec, const Inputs& inputs, const Run&) {
    return reference_forward(spec, inputs, forward_params(spec, inputs));
  }
  static Result compare(const KernelVariant& kernel, const Spec& spec, const Inputs& inputs, const Run& outputs,
                        const Reference& reference, const Options&) {
    return forward_check_result(kernel.name, kernel.tile_shape(forward_params(spec, inputs)), spec, inputs,
                                outputs, reference);
  }
  static void time(Result& result, const KernelVariant& kernel, const Spec& spec, const Inputs& inputs,
                   const Run& outputs, const Options& options) {
    result.kernel_ms =
        EventTimer().median_ms([&] { run_forward(kernel, spec, inputs, outputs); }, options.timed_launches);
  }
  // e4m3: the kernel's output against float32 attention of the unquantized values,
  // with the spec's quantization, then the others on the same values (three more
  // launches). Only in timed checks: untimed ones (--repeat 0, the cuda-gdb recipes,
  // the test matrices) launch the kernel once.
  static void extras(Result& result, const KernelVariant& kernel, const Spec& spec, const Inputs& inputs,
                     const Run& outputs, const Options& check_options) {
    if (!spec.is_fp8() || check_options.timed_launches <= 0) return;
    const ReferenceOptions options = reference_options(spec, inputs, forward_params(spec, inputs));
    const at::Tensor expected = reference_of(spec, inputs, inputs.q_source, inputs.k_source, inputs.v_source, options).out;
    Fp8Accuracy accuracy;
    accuracy.outliers = spec.outliers;
    accuracy.rows.push_back({spec.fp8_scaling, spec.fp8_hadamard, error_summary(outputs.out, expected)});
    const bool power_of_two = (spec.head_dim & (spec.head_dim - 1)) == 0;
    for (const auto& [scaling, hadamard] : {std::pair{Fp8Scaling::per_head, false}, {Fp8Scaling::per_tensor, false},
                                            {Fp8Scaling::none, false}, {Fp8Scaling::per_head, true}}) {
      if ((scaling == spec.fp8_scaling && hadamard == spec.fp8_hadamard) || (hadamard && !power_of_two)) continue;
      Spec rescaled = spec;
      rescaled.fp8_scaling = scaling, rescaled.fp8_hadamard = hadamard;
      Inputs requantized = inputs;
      quantize_inputs(rescaled, requantized, /*random=*/true);  // from q_source, k_source, v_source
      const ForwardOutputs again = poisoned_forward_outputs(rescaled, requantized);
      run_forward(kernel, rescaled, requantized, again);
      accuracy.rows.push_back({scaling, hadamard, error_summary(again.out, expected)});
    }
    result.fp8_accuracy = accuracy;
  }
};

}  // namespace

CheckResult check_kernel(const ProblemSpec& spec, const CheckOptions& check_options) {
  return harness_detail::run_check<ForwardCheck>(spec, check_options);
}

std::string CheckResult::format() const {
  std::ostringstream text;
  text << std::setprecision(4);
  text << "kernel  " << kernel << " (tiles " << tiles.block_q << "x" << tiles.block_k << ")\n"
       << "problem " << problem << "\n"
       << (fp8 ? "FP8 path error (e4m3 tensor-core q k^T, P x 2^8 rounded to e4m3; against float64 attention of "
                 "the dequantized values) "
               : "torch same-precision math error ")
       << ref_err << ", rounding atol " << storage_err << " -> output tolerance " << out.tolerance
       << (fp8 ? " (2 x FP8 path error + fwd_atol in the output dtype + 4 float32 ulps; lse: 2 x the larger error "
                 "of the FP8 path's and torch's math in the output dtype)\n"
               : " (2 x math error + flash-attn's fwd_atol + 4 float32 ulps)\n")
       << out.format() << (lse_checked ? lse.format() : "lse: not returned, not compared\n");
  if (fp8_accuracy) text << fp8_accuracy->format();
  if (kernel_ms >= 0) text << "kernel time " << kernel_ms << " ms (median)\n";
  text << (passed() ? "PASSED" : "FAILED") << "\n";
  return text.str();
}

std::string CheckResult::to_json() const {
  std::ostringstream text;
  text << "{\"passed\": " << (passed() ? "true" : "false") << ", \"kernel\": " << json::string(kernel)
       << ", \"problem\": " << json::string(problem) << ", \"max_abs_err\": "
       << json::number(out.max_abs_error) << ", \"ref_err\": " << json::number(ref_err)
       << ", \"rounding_atol\": " << json::number(storage_err) << ", \"tolerance\": "
       << json::number(out.tolerance) << ", \"over_tolerance\": " << out.over_tolerance
       << ", \"nan_count\": " << out.nan_count << ", \"inf_count\": " << out.inf_count
       << ", \"first_bad\": " << out.first_bad_json() << ", \"lse_passed\": "
       << (!lse_checked ? "null" : lse.passed() ? "true" : "false") << ", \"lse_max_abs_err\": "
       << (lse_checked ? json::number(lse.max_abs_error) : "null")
       << ", \"lse_first_bad\": " << (lse_checked ? lse.first_bad_json() : "null")
       << ", \"block_q\": " << tiles.block_q << ", \"block_k\": " << tiles.block_k
       << ", \"kernel_ms\": " << (kernel_ms >= 0 ? json::number(kernel_ms) : "null")
       << ", \"fp8_accuracy\": " << (fp8_accuracy ? fp8_accuracy->to_json() : "null") << "}";
  return text.str();
}

}  // namespace flashlab
