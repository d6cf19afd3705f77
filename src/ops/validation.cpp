// The op library's shared input checks and launch helpers (validation.h),
// moved here from attention.cpp unchanged so the backward says the same thing
// about the same mistake.
#include "validation.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <tuple>
#include <vector>

#include "flashlab/cuda_check.h"

namespace flashlab::detail {
namespace {

// cu_seqlens_q/k: int32, 1-D, one length, on q's device (checked before any
// value is read, so a tensor on another device is never copied).
void check_cu_seqlens_tensors(const at::Tensor& q, const at::Tensor& cu_seqlens_q,
                              const at::Tensor& cu_seqlens_k) {
  for (const auto& [name, tensor] :
       {std::pair{"cu_seqlens_q", &cu_seqlens_q}, {"cu_seqlens_k", &cu_seqlens_k}}) {
    TORCH_CHECK(tensor->defined(), name, " must be a defined tensor");
    TORCH_CHECK(tensor->scalar_type() == at::kInt, name, " must have dtype Int (int32); got ",
                tensor->scalar_type());
    TORCH_CHECK(tensor->dim() == 1, name, " must be 1-D (batch + 1); got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
  }
  TORCH_CHECK(cu_seqlens_q.size(0) == cu_seqlens_k.size(0),
              "cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1); got ",
              cu_seqlens_q.size(0), " and ", cu_seqlens_k.size(0));
  TORCH_CHECK(cu_seqlens_q.size(0) >= 2,
              "cu_seqlens_q and cu_seqlens_k need at least 2 elements (batch + 1 with batch >= 1); got ",
              cu_seqlens_q.size(0));
  TORCH_CHECK(cu_seqlens_q.device() == q.device() && cu_seqlens_k.device() == q.device(),
              "cu_seqlens_q and cu_seqlens_k must be on q's device ", q.device(), "; got ",
              cu_seqlens_q.device(), " and ", cu_seqlens_k.device());
}

// The values of one cu_seqlens array, read on the host: a prefix sum from 0 to
// the total token count whose lengths all fit under max_seqlen.
void check_cu_seqlens_values(const char* name, const at::Tensor& cu_seqlens, int64_t total_tokens,
                             const char* tensor_name, const char* max_name, int max_seqlen) {
  const at::Tensor host = cu_seqlens.to(at::kCPU).contiguous();
  const int* offsets = host.data_ptr<int>();
  const int64_t count = host.size(0);
  TORCH_CHECK(offsets[0] == 0, name, " must start at 0; got ", offsets[0]);
  int longest = 0;
  for (int64_t index = 1; index < count; ++index) {
    TORCH_CHECK(offsets[index] >= offsets[index - 1], name,
                " must be non-decreasing (sequence lengths >= 0); got ", name, "[", index - 1,
                "] = ", offsets[index - 1], " followed by ", offsets[index]);
    longest = std::max(longest, offsets[index] - offsets[index - 1]);
  }
  TORCH_CHECK(offsets[count - 1] == total_tokens, "the last element of ", name,
              " must equal the number of tokens in ", tensor_name, " (", total_tokens, "); got ",
              offsets[count - 1]);
  TORCH_CHECK(max_seqlen >= longest, max_name, " must be at least the longest sequence (",
              longest, " tokens in ", name, "); got ", max_seqlen);
}

}  // namespace

std::string shape_text(const at::Tensor& tensor) {
  std::ostringstream text;
  text << tensor.sizes();
  return text.str();
}

DataType to_data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DataType::float32;
    case at::kHalf: return DataType::float16;
    case at::kBFloat16: return DataType::bfloat16;
    case at::kFloat8_e4m3fn: return DataType::e4m3;
    default: TORCH_CHECK(false, "unsupported dtype ", type);
  }
}

// packed_tokens: q, k, v are (1, total_tokens, heads, head_dim) views of a
// variable-length batch, where a total of 0 tokens is legal.
void check_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionOptions& options, bool packed_tokens) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "q, k and v must all be defined tensors");
  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(tensor->dim() == 4, name,
                " must be 4-D (batch, seqlen, heads, head_dim); got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
    const auto type = tensor->scalar_type();
    TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16 || type == at::kFloat8_e4m3fn, name,
                " has dtype ", type, "; supported dtypes are Float, Half, BFloat16 and Float8_e4m3fn (forward only)");
  }
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must share one dtype; got q ", q.scalar_type(), ", k ", k.scalar_type(),
              ", v ", v.scalar_type());
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape; got k ", shape_text(k),
              " and v ", shape_text(v));
  TORCH_CHECK(q.size(0) == k.size(0), "q and k must have the same batch size; got q ",
              shape_text(q), " and k ", shape_text(k));
  TORCH_CHECK(q.size(3) == k.size(3), "q and k must have the same head_dim; got q ",
              shape_text(q), " and k ", shape_text(k));
  TORCH_CHECK(q.size(0) >= 1 && (packed_tokens || (q.size(1) >= 1 && k.size(1) >= 1)) &&
                  q.size(2) >= 1 && k.size(2) >= 1 && q.size(3) >= 1,
              "batch, seqlens, heads and head_dim must all be >= 1; got q ", shape_text(q),
              " and k ", shape_text(k));
  TORCH_CHECK(q.size(2) % k.size(2) == 0, "q has ", q.size(2),
              " heads, which is not a multiple of the ", k.size(2),
              " heads of k and v (GQA/MQA need heads % kv_heads == 0)");
  for (const auto& [name, tensor] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    TORCH_CHECK(tensor->stride(3) == 1, name,
                " must have a contiguous last dimension (stride 1); got strides ",
                tensor->strides());
  }
  TORCH_CHECK(options.window_left >= -1 && options.window_right >= -1,
              "window_left and window_right must be >= -1 (-1 = unbounded); got (",
              options.window_left, ", ", options.window_right, ")");
  if (options.softmax_scale)
    TORCH_CHECK(std::isfinite(*options.softmax_scale), "softmax_scale must be finite; got ",
                *options.softmax_scale);
  TORCH_CHECK(options.sm_margin >= 0, "sm_margin (SMs a persistent kernel leaves free) must be >= 0; got ",
              options.sm_margin);
  if (!packed_tokens) check_score_modification(options, q.size(0), q.size(2), q.device());
  // Packed tokens: check_varlen_inputs checks them against the sequence count.
  if (!packed_tokens) check_fp8_options(options, q.scalar_type() == at::kFloat8_e4m3fn, q.size(0), k.size(2), q.device());
}

void check_fp8_options(const AttentionOptions& options, bool fp8, int64_t batch, int64_t kv_heads,
                       const at::Device& device) {
  for (const auto& [name, tensor] :
       {std::pair{"q_descale", &options.q_descale}, {"k_descale", &options.k_descale}, {"v_descale", &options.v_descale}}) {
    if (!tensor->defined()) continue;
    TORCH_CHECK(fp8, name, " is for e4m3 (Float8_e4m3fn) inputs; got it with 16- or 32-bit q, k, v");
    TORCH_CHECK(tensor->dim() == 2 && tensor->size(0) == batch && tensor->size(1) == kv_heads, name,
                " must be float32 of shape (batch, kv_heads) = (", batch, ", ", kv_heads, "); got ", shape_text(*tensor));
    TORCH_CHECK(tensor->scalar_type() == at::kFloat, name, " must be float32; got ", tensor->scalar_type());
    TORCH_CHECK(tensor->is_contiguous(), name, " must be contiguous; got strides ", tensor->strides());
    TORCH_CHECK(tensor->device() == device, name, " must be on q's device ", device, "; got ", tensor->device());
  }
  if (options.output_dtype) {
    TORCH_CHECK(fp8, "output_dtype is for e4m3 (Float8_e4m3fn) inputs (others write q's dtype); got it with 16- or "
                     "32-bit q, k, v");
    TORCH_CHECK(*options.output_dtype == at::kBFloat16 || *options.output_dtype == at::kHalf,
                "output_dtype of an e4m3 forward must be BFloat16 or Half; got ", *options.output_dtype);
  }
}

at::ScalarType output_scalar_type(const at::Tensor& q, const AttentionOptions& options) {
  if (q.scalar_type() != at::kFloat8_e4m3fn) return q.scalar_type();
  return options.output_dtype.value_or(at::kBFloat16);
}

void check_score_modification(const AttentionOptions& options, int64_t batch, int64_t heads,
                              const at::Device& device) {
  TORCH_CHECK(std::isfinite(options.softcap) && options.softcap >= 0.0,
              "softcap must be finite and >= 0 (0 = off); got ", options.softcap);
  const auto check_float_vector = [&](const char* name, const at::Tensor& tensor, bool per_batch_allowed) {
    if (!tensor.defined()) return;
    const bool per_head = tensor.dim() == 1 && tensor.size(0) == heads;
    const bool per_batch = per_batch_allowed && tensor.dim() == 2 && tensor.size(0) == batch && tensor.size(1) == heads;
    TORCH_CHECK(per_head || per_batch, name, " must be float32 of shape (heads) = (", heads, ")",
                per_batch_allowed ? " or (batch, heads) = (" + std::to_string(batch) + ", " + std::to_string(heads) + ")"
                                  : std::string(),
                "; got ", shape_text(tensor));
    TORCH_CHECK(tensor.scalar_type() == at::kFloat, name, " must be float32; got ", tensor.scalar_type());
    TORCH_CHECK(tensor.is_contiguous(), name, " must be contiguous; got strides ", tensor.strides());
    TORCH_CHECK(tensor.device() == device, name, " must be on q's device ", device, "; got ", tensor.device());
  };
  check_float_vector("alibi_slopes", options.alibi_slopes, /*per_batch_allowed=*/true);
  check_float_vector("sinks", options.sinks, /*per_batch_allowed=*/false);
}

void check_same_device(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "q, k and v must be on one device; got q on ", q.device(), ", k on ", k.device(),
              ", v on ", v.device());
}

// out like q (dtype, shape, contiguous last dimension); lse a contiguous
// float32 tensor of lse_shape, which lse_layout names for the message; both on
// q's device.
void check_output_buffers(const at::Tensor& q, const at::Tensor& out, const at::Tensor& lse,
                          const std::vector<int64_t>& lse_shape, const char* lse_layout,
                          std::optional<at::ScalarType> out_type) {
  TORCH_CHECK(out.defined() && lse.defined(), "out and lse must be defined tensors");
  const at::ScalarType expected = out_type.value_or(q.scalar_type());
  const std::string what = expected == q.scalar_type()
                               ? std::string("out must match q in shape and dtype")
                               : std::string("out must have q's shape and dtype ") + c10::toString(expected) +
                                     " (the e4m3 forward's output)";
  TORCH_CHECK(out.sizes() == q.sizes() && out.scalar_type() == expected, what, "; got out ", shape_text(out), " ",
              out.scalar_type(), ", q ", shape_text(q), " ", q.scalar_type());
  TORCH_CHECK(out.stride(-1) == 1, "out must have a contiguous last dimension; got strides ",
              out.strides());
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(lse_shape) && lse.scalar_type() == at::kFloat &&
                  lse.is_contiguous(),
              "lse must be a contiguous float32 tensor of shape ", lse_layout, " = ",
              at::IntArrayRef(lse_shape), "; got ", shape_text(lse), " ", lse.scalar_type());
  TORCH_CHECK(out.device() == q.device() && lse.device() == q.device(),
              "out and lse must be on q's device ", q.device(), "; got ", out.device(), " and ",
              lse.device());
}

void check_like(const char* name, const at::Tensor& tensor, const char* like_name,
                const at::Tensor& like) {
  TORCH_CHECK(tensor.defined(), name, " must be a defined tensor");
  TORCH_CHECK(tensor.sizes() == like.sizes() && tensor.scalar_type() == like.scalar_type(), name,
              " must match ", like_name, " in shape and dtype; got ", name, " ", shape_text(tensor),
              " ", tensor.scalar_type(), ", ", like_name, " ", shape_text(like), " ",
              like.scalar_type());
  TORCH_CHECK(tensor.dim() == 0 || tensor.stride(-1) == 1, name,
              " must have a contiguous last dimension; got strides ", tensor.strides());
  TORCH_CHECK(tensor.device() == like.device(), name, " must be on ", like_name, "'s device ",
              like.device(), "; got ", tensor.device());
}

// Variable-length inputs, structure only: 3-D packed tensors, then every check
// of the fixed-length path on (1, total_tokens, heads, head_dim) views.
void check_varlen_structure(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionOptions& options) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "q, k and v must all be defined tensors");
  for (const auto& [name, tensor, rows] :
       {std::tuple{"q", &q, "total_q"}, {"k", &k, "total_k"}, {"v", &v, "total_k"}}) {
    TORCH_CHECK(tensor->dim() == 3, name, " must be 3-D (", rows,
                ", heads, head_dim) for a variable-length batch; got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
  }
  TORCH_CHECK(k.sizes() == v.sizes(), "k and v must have the same shape; got k ", shape_text(k),
              " and v ", shape_text(v));
  TORCH_CHECK(q.size(2) == k.size(2), "q and k must have the same head_dim; got q ",
              shape_text(q), " and k ", shape_text(k));
  check_structure(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), options, /*packed_tokens=*/true);
}

void check_varlen_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                         int max_seqlen_q, int max_seqlen_k, const AttentionOptions& options) {
  check_varlen_structure(q, k, v, options);
  check_same_device(q, k, v);
  check_cu_seqlens_tensors(q, cu_seqlens_q, cu_seqlens_k);
  check_score_modification(options, cu_seqlens_q.size(0) - 1, q.size(1), q.device());
  check_fp8_options(options, q.scalar_type() == at::kFloat8_e4m3fn, cu_seqlens_q.size(0) - 1, k.size(1), q.device());
  TORCH_CHECK(max_seqlen_q >= 0 && max_seqlen_k >= 0, "max_seqlen_q and max_seqlen_k must be >= 0; got ",
              max_seqlen_q, " and ", max_seqlen_k);
  if (!host_value_checks(options.strict_checks, q)) return;  // the kernels check them (value_guard.h)
  check_cu_seqlens_values("cu_seqlens_q", cu_seqlens_q, q.size(0), "q", "max_seqlen_q",
                          max_seqlen_q);
  check_cu_seqlens_values("cu_seqlens_k", cu_seqlens_k, k.size(0), "k", "max_seqlen_k",
                          max_seqlen_k);
}

at::Tensor pad_head_dim(const at::Tensor& tensor, int64_t padded_head_dim) {
  const int64_t head_dim = tensor.size(-1);
  std::vector<int64_t> sizes = tensor.sizes().vec();
  sizes.back() = padded_head_dim;
  at::Tensor padded =
      at::empty(sizes, tensor.options().memory_format(at::MemoryFormat::Contiguous));
  padded.narrow(-1, 0, head_dim).copy_(tensor);
  padded.narrow(-1, head_dim, padded_head_dim - head_dim).zero_();
  return padded;
}

namespace {

// Strides of a contiguous (batch, seqlen, heads, head_dim) tensor shaped like
// q (keys = false: seqlen_q rows of `heads` heads) or like k and v (keys = true:
// seqlen_k rows of kv_heads heads) of `params` at `head_dim`, or of a packed
// (total, heads, head_dim) one (batch stride 0) for a varlen batch.
void contiguous_strides(int64_t& batch_stride, int64_t& row_stride, int64_t& head_stride,
                        const AttentionParams& params, bool keys, int head_dim) {
  const int seqlen = keys ? params.seqlen_k : params.seqlen_q;
  const int heads = keys ? params.kv_heads : params.heads;
  head_stride = head_dim;
  row_stride = static_cast<int64_t>(heads) * head_dim;
  batch_stride = params.is_varlen() ? 0 : seqlen * row_stride;
}

}  // namespace

AttentionParams params_at_head_dim(const AttentionParams& params, int head_dim) {
  AttentionParams padded = params;
  padded.head_dim = head_dim;
  padded.q = padded.k = padded.v = padded.out = nullptr;
  contiguous_strides(padded.q_batch_stride, padded.q_row_stride, padded.q_head_stride, params,
                     /*keys=*/false, head_dim);
  contiguous_strides(padded.k_batch_stride, padded.k_row_stride, padded.k_head_stride, params,
                     /*keys=*/true, head_dim);
  contiguous_strides(padded.v_batch_stride, padded.v_row_stride, padded.v_head_stride, params,
                     /*keys=*/true, head_dim);
  contiguous_strides(padded.out_batch_stride, padded.out_row_stride, padded.out_head_stride, params,
                     /*keys=*/false, head_dim);
  return padded;
}

AttentionBackwardParams params_at_head_dim(const AttentionBackwardParams& params, int head_dim) {
  AttentionBackwardParams padded = params;
  static_cast<AttentionParams&>(padded) = params_at_head_dim(static_cast<const AttentionParams&>(params), head_dim);
  padded.dout = nullptr;
  padded.dq = padded.dk = padded.dv = nullptr;
  contiguous_strides(padded.dout_batch_stride, padded.dout_row_stride, padded.dout_head_stride,
                     params, /*keys=*/false, head_dim);
  contiguous_strides(padded.dq_batch_stride, padded.dq_row_stride, padded.dq_head_stride, params,
                     /*keys=*/false, head_dim);
  contiguous_strides(padded.dk_batch_stride, padded.dk_row_stride, padded.dk_head_stride, params,
                     /*keys=*/true, head_dim);
  contiguous_strides(padded.dv_batch_stride, padded.dv_row_stride, padded.dv_head_stride, params,
                     /*keys=*/true, head_dim);
  return padded;
}

int device_compute_capability(const at::Tensor& q) {
  if (!q.is_cuda()) return 0;
  // Asked once per device (every call makes a parameter block or two).
  constexpr int kCachedDevices = 64;
  static std::atomic<int> known[kCachedDevices] = {};
  const int device = q.get_device();
  if (device < kCachedDevices && known[device].load(std::memory_order_relaxed) > 0)
    return known[device].load(std::memory_order_relaxed);
  int major = 0, minor = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (device < kCachedDevices) known[device].store(major * 10 + minor, std::memory_order_relaxed);
  return major * 10 + minor;
}


at::Tensor allocate_workspace(size_t bytes, void* stream) {
  if (bytes == 0) return {};
  const c10::DeviceIndex device = c10::cuda::current_device();
  at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)},
                                   at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  // Freed when the caller drops it: the caching allocator keeps it for the stream's later work.
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  // FLASHLAB_POISON_WORKSPACE=1 (the GPU tests set it): every byte 0xFF (NaN floats, -1 ints),
  // so a kernel that reads workspace it never wrote fails its check instead of passing on
  // whatever the allocator left there (often zeros).
  static const bool poison = [] {
    const char* value = std::getenv("FLASHLAB_POISON_WORKSPACE");
    return value != nullptr && *value != '\0' && std::string(value) != "0";
  }();
  if (poison) FLASHLAB_CUDA_CHECK(cudaMemsetAsync(workspace.data_ptr(), 0xFF, bytes, cuda_stream));
  if (cuda_stream != c10::cuda::getCurrentCUDAStream(device).stream())
    c10::cuda::CUDACachingAllocator::recordStream(
        workspace.storage().data_ptr(), c10::cuda::getStreamFromExternal(cuda_stream, device));
  return workspace;
}

void* stream_or_current(void* stream) {
  if (stream != nullptr) return stream;
  return c10::cuda::getCurrentCUDAStream(c10::cuda::current_device()).stream();
}

}  // namespace flashlab::detail
