// Decoding with a KV cache: input validation, kernel selection and the launch
// (attention.h). Checks run in the forward's order: structure and one device
// (no device access), then the kernel, the output buffers, in strict mode the
// values of cache_seqlens and block_table (copied to the host; by default the
// kernels check them), and last that the device is a CUDA one; in strict mode
// nothing is written to the cache unless the whole call is valid.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "flashlab/attention.h"
#include "host_path.h"
#include "validation.h"

namespace flashlab {
namespace {

using detail::shape_text;

bool is_paged(const KvCacheOptions& options) {
  return options.block_table.has_value() && options.block_table->defined();
}
bool has_new_keys(const KvCacheOptions& options) {
  return (options.k_new.has_value() && options.k_new->defined()) ||
         (options.v_new.has_value() && options.v_new->defined());
}
bool has_cache_seqlens(const KvCacheOptions& options) {
  return options.cache_seqlens.has_value() && options.cache_seqlens->defined();
}

// Rows one sequence's cache holds: contiguous, the cache's second dimension;
// paged, the block table's width times the page size.
int64_t cache_capacity(const at::Tensor& k_cache, const KvCacheOptions& options) {
  return is_paged(options) ? options.block_table->size(1) * k_cache.size(1) : k_cache.size(1);
}

// Shapes, dtypes and options; no device access.
void check_kvcache_structure(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                             const KvCacheOptions& options) {
  TORCH_CHECK(q.defined() && k_cache.defined() && v_cache.defined(),
              "q, k_cache and v_cache must all be defined tensors");
  const bool paged = is_paged(options);
  const char* cache_layout = paged ? "(num_pages, page_size, kv_heads, head_dim)"
                                   : "(batch, capacity, kv_heads, head_dim)";
  TORCH_CHECK(q.dim() == 4, "q must be 4-D (batch, seqlen_q, heads, head_dim); got a ", q.dim(),
              "-D tensor of shape ", shape_text(q));
  for (const auto& [name, tensor] : {std::pair{"k_cache", &k_cache}, {"v_cache", &v_cache}})
    TORCH_CHECK(tensor->dim() == 4, name, " must be 4-D ", cache_layout, "; got a ", tensor->dim(),
                "-D tensor of shape ", shape_text(*tensor));
  const auto type = q.scalar_type();
  TORCH_CHECK(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, "q has dtype ", type,
              "; supported dtypes are Float, Half and BFloat16");
  TORCH_CHECK(k_cache.scalar_type() == type && v_cache.scalar_type() == type,
              "q, k_cache and v_cache must share one dtype; got q ", type, ", k_cache ",
              k_cache.scalar_type(), ", v_cache ", v_cache.scalar_type());
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache must have the same shape; got ",
              shape_text(k_cache), " and ", shape_text(v_cache));
  const int64_t batch = q.size(0), seqlen_q = q.size(1), heads = q.size(2), head_dim = q.size(3);
  TORCH_CHECK(batch >= 1 && seqlen_q >= 1 && heads >= 1 && head_dim >= 1,
              "q's batch, seqlen_q, heads and head_dim must all be >= 1; got ", shape_text(q));
  TORCH_CHECK(k_cache.size(3) == head_dim, "k_cache must have q's head_dim ", head_dim, "; got ",
              shape_text(k_cache));
  const int64_t kv_heads = k_cache.size(2);
  TORCH_CHECK(kv_heads >= 1 && heads % kv_heads == 0, "q has ", heads,
              " heads, which is not a multiple of the ", kv_heads,
              " heads of k_cache and v_cache (GQA/MQA need heads % kv_heads == 0)");
  TORCH_CHECK(k_cache.size(1) >= 1, paged ? "page_size" : "the cache capacity",
              " (k_cache's second dimension) must be >= 1; got ", shape_text(k_cache));
  if (paged) {
    const at::Tensor& table = *options.block_table;
    TORCH_CHECK(table.scalar_type() == at::kInt, "block_table must have dtype Int (int32); got ",
                table.scalar_type());
    TORCH_CHECK(table.dim() == 2 && table.size(0) == batch && table.size(1) >= 1,
                "block_table must be (batch, pages per sequence) = (", batch, ", >= 1); got ",
                shape_text(table));
  } else {
    TORCH_CHECK(k_cache.size(0) == batch, "a contiguous k_cache must be (batch, capacity, kv_heads, "
                "head_dim) with q's batch ", batch, "; got ", shape_text(k_cache),
                " (a paged cache needs block_table)");
  }
  if (has_cache_seqlens(options)) {
    const at::Tensor& lengths = *options.cache_seqlens;
    TORCH_CHECK(lengths.scalar_type() == at::kInt, "cache_seqlens must have dtype Int (int32); got ",
                lengths.scalar_type());
    TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == batch, "cache_seqlens must be 1-D (batch) = (",
                batch, "); got ", shape_text(lengths));
  }
  if (has_new_keys(options)) {
    TORCH_CHECK(options.k_new.has_value() && options.k_new->defined() && options.v_new.has_value() &&
                    options.v_new->defined(),
                "new keys and values come together: k and v must both be given or both be absent");
    TORCH_CHECK(has_cache_seqlens(options),
                "appending k and v needs cache_seqlens (where each sequence's new rows go); got none");
    const at::Tensor& k_new = *options.k_new;
    const at::Tensor& v_new = *options.v_new;
    TORCH_CHECK(k_new.dim() == 4 && k_new.size(0) == batch && k_new.size(2) == kv_heads &&
                    k_new.size(3) == head_dim,
                "k must be (batch, seqlen_new, kv_heads, head_dim) = (", batch, ", seqlen_new, ",
                kv_heads, ", ", head_dim, "); got ", shape_text(k_new));
    TORCH_CHECK(v_new.sizes() == k_new.sizes(), "v must have k's shape ", shape_text(k_new), "; got ",
                shape_text(v_new));
    TORCH_CHECK(k_new.scalar_type() == type && v_new.scalar_type() == type,
                "k and v must have q's dtype ", type, "; got ", k_new.scalar_type(), " and ",
                v_new.scalar_type());
    TORCH_CHECK(k_new.stride(3) == 1 && v_new.stride(3) == 1,
                "k and v must have a contiguous last dimension (stride 1); got strides ",
                k_new.strides(), " and ", v_new.strides());
    TORCH_CHECK(k_new.size(1) <= cache_capacity(k_cache, options), "k has ", k_new.size(1),
                " new rows, more than the cache holds (", cache_capacity(k_cache, options), ")");
  }
  for (const auto& [name, tensor] :
       {std::pair{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}})
    TORCH_CHECK(tensor->stride(3) == 1, name,
                " must have a contiguous last dimension (stride 1); got strides ", tensor->strides());
  TORCH_CHECK(options.window_left >= -1 && options.window_right >= -1,
              "window_left and window_right must be >= -1 (-1 = unbounded); got (",
              options.window_left, ", ", options.window_right, ")");
  if (options.softmax_scale)
    TORCH_CHECK(std::isfinite(*options.softmax_scale), "softmax_scale must be finite; got ",
                *options.softmax_scale);
  TORCH_CHECK(options.num_splits >= 0, "num_splits must be 0 (choose) or >= 1; got ",
              options.num_splits);
  detail::check_score_modification(options, q.size(0), q.size(2), q.device());
}

// Every tensor on q's device (before any data_ptr is taken).
void check_kvcache_devices(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const KvCacheOptions& options) {
  const auto on_q_device = [&](const char* name, const at::Tensor& tensor) {
    TORCH_CHECK(tensor.device() == q.device(), name, " must be on q's device ", q.device(), "; got ",
                tensor.device());
  };
  on_q_device("k_cache", k_cache);
  on_q_device("v_cache", v_cache);
  if (has_cache_seqlens(options)) on_q_device("cache_seqlens", *options.cache_seqlens);
  if (is_paged(options)) on_q_device("block_table", *options.block_table);
  if (has_new_keys(options)) {
    on_q_device("k", *options.k_new);
    on_q_device("v", *options.v_new);
  }
}

// The lengths and page entries, read on the host: every sequence's keys (its
// cached rows plus the new ones) within the capacity, every page they use a
// page of the cache.
void check_kvcache_values(const at::Tensor& k_cache, const KvCacheOptions& options, int64_t batch) {
  const int64_t capacity = cache_capacity(k_cache, options);
  const int64_t seqlen_new = has_new_keys(options) ? options.k_new->size(1) : 0;
  std::vector<int64_t> keys(batch, capacity);
  if (has_cache_seqlens(options)) {
    const at::Tensor lengths = options.cache_seqlens->to(at::kCPU).contiguous();
    const int* length = lengths.data_ptr<int>();
    for (int64_t b = 0; b < batch; ++b) {
      TORCH_CHECK(length[b] >= 0, "cache_seqlens[", b, "] must be >= 0; got ", length[b]);
      TORCH_CHECK(length[b] + seqlen_new <= capacity, "sequence ", b, " would hold cache_seqlens[", b,
                  "] + new rows = ", length[b], " + ", seqlen_new, " = ", length[b] + seqlen_new,
                  " keys; its cache holds ", capacity,
                  is_paged(options) ? " (block_table's width " + std::to_string(options.block_table->size(1)) +
                                          " x page_size " + std::to_string(k_cache.size(1)) + ")"
                                    : std::string());
      keys[b] = length[b] + seqlen_new;
    }
  }
  if (is_paged(options)) {
    const at::Tensor table = options.block_table->to(at::kCPU).contiguous();
    const int* page = table.data_ptr<int>();
    const int64_t width = table.size(1), page_size = k_cache.size(1), num_pages = k_cache.size(0);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j * page_size < keys[b]; ++j)
        TORCH_CHECK(page[b * width + j] >= 0 && page[b * width + j] < num_pages, "block_table[", b,
                    "][", j, "] = ", page[b * width + j], " is not a page of the cache (0 to ",
                    num_pages - 1, "); sequence ", b, " uses its first ",
                    (keys[b] + page_size - 1) / page_size, " entries");
  }
}

}  // namespace

KvCacheParams make_kvcache_params(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& out,
                                  const at::Tensor& lse, const KvCacheOptions& options) {
  KvCacheParams params;
  static_cast<AttentionParams&>(params) = make_params(q, k_cache, v_cache, out, lse, options);
  params.seqlen_k = static_cast<int>(cache_capacity(k_cache, options));
  if (has_cache_seqlens(options)) params.cache_seqlens = options.cache_seqlens->data_ptr<int>();
  if (is_paged(options)) {
    const at::Tensor& table = *options.block_table;
    params.block_table = table.data_ptr<int>();
    params.block_table_batch_stride = table.stride(0);
    params.block_table_width = static_cast<int>(table.size(1));
    params.page_size = static_cast<int>(k_cache.size(1));
    params.num_pages = static_cast<int>(k_cache.size(0));
  }
  if (options.k_new.has_value() && options.k_new->defined() && options.v_new.has_value() &&
      options.v_new->defined()) {
    const at::Tensor& k_new = *options.k_new;
    const at::Tensor& v_new = *options.v_new;
    params.k_new = k_new.data_ptr();
    params.v_new = v_new.data_ptr();
    params.seqlen_new = static_cast<int>(k_new.size(1));
    params.k_new_batch_stride = k_new.stride(0);
    params.k_new_row_stride = k_new.stride(1);
    params.k_new_head_stride = k_new.stride(2);
    params.v_new_batch_stride = v_new.stride(0);
    params.v_new_row_stride = v_new.stride(1);
    params.v_new_head_stride = v_new.stride(2);
  }
  params.num_splits = options.num_splits;
  return params;
}

namespace detail {

std::string KernelMode<KvCacheParams>::missing(const KernelVariant& kernel) {
  return kernel.name + " has no KV-cache path; kernels with one: " + kernels_with_mode<KvCacheParams>();
}

// `params` as the kernel would get them with every tensor zero-padded to
// `head_dim` (fresh contiguous copies): for asking whether it takes them.
KvCacheParams KernelMode<KvCacheParams>::at_head_dim(const KvCacheParams& params, int head_dim) {
  KvCacheParams padded = params;
  static_cast<AttentionParams&>(padded) = params_at_head_dim(params, head_dim);
  if (params.is_paged()) {  // the pages: (num_pages, page_size, kv_heads, head_dim)
    padded.k_head_stride = padded.v_head_stride = head_dim;
    padded.k_row_stride = padded.v_row_stride = static_cast<int64_t>(params.kv_heads) * head_dim;
    padded.k_batch_stride = padded.v_batch_stride = padded.k_row_stride * params.page_size;
  }
  if (params.k_new != nullptr) {
    padded.k_new = padded.v_new = nullptr;
    padded.k_new_head_stride = padded.v_new_head_stride = head_dim;
    padded.k_new_row_stride = padded.v_new_row_stride = static_cast<int64_t>(params.kv_heads) * head_dim;
    padded.k_new_batch_stride = padded.v_new_batch_stride = padded.k_new_row_stride * params.seqlen_new;
  }
  return padded;
}

}  // namespace detail

const KernelVariant& select_kvcache_kernel(const KvCacheParams& params, const std::string& kernel_name,
                                           HeadDimPadding padding) {
  return detail::select_mode_kernel(params, kernel_name, padding);
}

int kvcache_splits(const KernelVariant& kernel, const KvCacheParams& params) {
  TORCH_CHECK(kernel.kvcache_launch != nullptr, "kernel ", kernel.name, " has no KV-cache path");
  return params.num_splits > 0 ? params.num_splits : kernel.kvcache_num_splits(params);
}

void run_kvcache_kernel(const KernelVariant& kernel, const KvCacheParams& params) {
  detail::run_mode_kernel(kernel, params);
}

void attention_with_kvcache_into(const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& out,
                                 const at::Tensor& lse, const KvCacheOptions& options) {
  check_kvcache_structure(q, k_cache, v_cache, options);
  check_kvcache_devices(q, k_cache, v_cache, options);
  const KvCacheParams probe = make_kvcache_params(q, k_cache, v_cache, at::Tensor(), at::Tensor(), options);
  const KernelVariant& kernel = select_kvcache_kernel(probe, options.kernel, HeadDimPadding::allowed);
  detail::check_output_buffers(q, out, lse, {q.size(0), q.size(2), q.size(1)},
                               "(batch, heads, seqlen_q)");
  // Strict mode only (host copies; CPU tensors work too): else the kernels check them.
  if (detail::host_value_checks(options.strict_checks, q)) check_kvcache_values(k_cache, options, q.size(0));
  const c10::cuda::CUDAGuard device_guard = detail::cuda_device_guard(q, "q, k_cache and v_cache");
  // A head dim the kernel lacks: zero-padded copies of everything; after an
  // append the caches' first head_dim columns are copied back.
  const bool append = has_new_keys(options);
  detail::LaunchTensors tensors;
  if (append) {
    tensors.inputs = {q, *options.k_new, *options.v_new};
    tensors.caches = {k_cache, v_cache};
  } else {
    tensors.inputs = {q, k_cache, v_cache};
  }
  tensors.outputs = {out};
  detail::run_at_kernel_head_dim(
      kernel, q.size(3), tensors, options, [&](const detail::LaunchTensors& run, const KvCacheOptions& run_options) {
        if (!append) {
          detail::launch_mode_kernel(
              kernel, make_kvcache_params(run.inputs[0], run.inputs[1], run.inputs[2], run.outputs[0], lse, run_options));
          return;
        }
        KvCacheOptions launched = run_options;
        launched.k_new = run.inputs[1], launched.v_new = run.inputs[2];
        detail::launch_mode_kernel(
            kernel, make_kvcache_params(run.inputs[0], run.caches[0], run.caches[1], run.outputs[0], lse, launched));
      });
}

AttentionOutput attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const KvCacheOptions& options) {
  check_kvcache_structure(q, k_cache, v_cache, options);
  AttentionOutput result;
  result.out = at::empty(q.sizes(), q.options());
  result.lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  attention_with_kvcache_into(q, k_cache, v_cache, result.out, result.lse, options);
  return result;
}

}  // namespace flashlab
