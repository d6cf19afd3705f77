// The reference of a KV-cache call: the caches after the append, and attention
// of each sequence over its valid keys through the varlen reference (one
// sequence at a time, bottom-right aligned), so no second softmax is written.
#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "flashlab/harness/kvcache_check.h"

namespace flashlab {
namespace {

// A cache as one (dim0 * dim1, kv_heads, head_dim) array of rows: contiguous
// (batch * capacity) or paged (num_pages * page_size).
at::Tensor flat_rows(const at::Tensor& cache) {
  return cache.reshape({cache.size(0) * cache.size(1), cache.size(2), cache.size(3)});
}

// The block table on the host (int64), or an undefined tensor.
at::Tensor host_table(const at::Tensor& block_table) {
  return block_table.defined() ? block_table.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
}

// Flat row indices (see flat_rows) of logical rows first .. first + count - 1
// of sequence `batch`, on `device`.
at::Tensor flat_indices(const at::Tensor& cache, const at::Tensor& table, int64_t batch, int64_t first,
                        int64_t count, at::Device device) {
  std::vector<int64_t> indices(count);
  const int64_t rows = cache.size(1);  // capacity (contiguous) or page_size (paged)
  const int64_t* pages = table.defined() ? table.data_ptr<int64_t>() + batch * table.size(1) : nullptr;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = first + i;
    indices[i] = pages != nullptr ? pages[row / rows] * rows + row % rows : batch * rows + row;
  }
  return at::tensor(indices, at::TensorOptions().dtype(at::kLong)).to(device);
}

}  // namespace

int64_t KvCacheTensors::capacity() const {
  return paged() ? block_table.size(1) * k_cache.size(1) : k_cache.size(1);
}

int64_t KvCacheTensors::seqlen_new() const { return k_new.defined() ? k_new.size(1) : 0; }

std::vector<int64_t> KvCacheTensors::cached_lengths() const {
  if (!cache_seqlens.defined()) return std::vector<int64_t>(batch(), capacity());
  const at::Tensor lengths = cache_seqlens.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
}

std::vector<int64_t> KvCacheTensors::key_lengths() const {
  std::vector<int64_t> lengths = cached_lengths();
  for (int64_t& length : lengths) length += seqlen_new();
  return lengths;
}

KvCacheOptions KvCacheTensors::options(const AttentionOptions& base, int num_splits) const {
  KvCacheOptions options;
  static_cast<AttentionOptions&>(options) = base;
  if (cache_seqlens.defined()) options.cache_seqlens = cache_seqlens;
  if (block_table.defined()) options.block_table = block_table;
  if (k_new.defined()) options.k_new = k_new;
  if (v_new.defined()) options.v_new = v_new;
  if (alibi_slopes.defined()) options.alibi_slopes = alibi_slopes;
  if (sinks.defined()) options.sinks = sinks;
  options.num_splits = num_splits;
  return options;
}

at::Tensor cache_rows(const at::Tensor& cache, const at::Tensor& block_table, int64_t batch,
                      int64_t rows) {
  if (!block_table.defined()) return cache[batch].narrow(0, 0, rows);
  return flat_rows(cache).index_select(
      0, flat_indices(cache, host_table(block_table), batch, 0, rows, cache.device()));
}

KvCacheReference reference_attention_kvcache(const KvCacheTensors& before,
                                             const ReferenceOptions& options) {
  const at::Tensor table = host_table(before.block_table);
  const std::vector<int64_t> cached = before.cached_lengths();
  const int64_t batch = before.batch(), seqlen_new = before.seqlen_new();
  const at::Device device = before.k_cache.device();

  // The append: k_new/v_new rows of sequence b go to its logical rows cached[b] ...
  KvCacheReference reference;
  reference.k_cache = before.k_cache.clone(at::MemoryFormat::Contiguous);
  reference.v_cache = before.v_cache.clone(at::MemoryFormat::Contiguous);
  at::Tensor appended = at::zeros({before.k_cache.size(0) * before.k_cache.size(1)},
                                  at::TensorOptions().dtype(at::kBool).device(device));
  at::Tensor k_rows = flat_rows(reference.k_cache), v_rows = flat_rows(reference.v_cache);
  for (int64_t b = 0; b < batch && seqlen_new > 0; ++b) {
    const at::Tensor where = flat_indices(reference.k_cache, table, b, cached[b], seqlen_new, device);
    k_rows.index_copy_(0, where, before.k_new[b].to(reference.k_cache.scalar_type()));
    v_rows.index_copy_(0, where, before.v_new[b].to(reference.v_cache.scalar_type()));
    appended.index_fill_(0, where, true);
  }
  reference.appended = appended.view({before.k_cache.size(0), before.k_cache.size(1)});

  // Attention: sequence b's queries over its first cached[b] + seqlen_new keys,
  // as a variable-length batch (an empty key sequence gives 0 and -inf).
  const int64_t seqlen_q = before.q.size(1), heads = before.q.size(2), head_dim = before.q.size(3);
  std::vector<at::Tensor> keys, values;
  std::vector<int> cu_seqlens_q(batch + 1, 0), cu_seqlens_k(batch + 1, 0);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = cached[b] + seqlen_new;
    keys.push_back(cache_rows(reference.k_cache, before.block_table, b, length));
    values.push_back(cache_rows(reference.v_cache, before.block_table, b, length));
    cu_seqlens_q[b + 1] = cu_seqlens_q[b] + static_cast<int>(seqlen_q);
    cu_seqlens_k[b + 1] = cu_seqlens_k[b] + static_cast<int>(length);
  }
  const auto offsets = [](const std::vector<int>& values) {
    return at::tensor(values, at::TensorOptions().dtype(at::kInt));
  };
  const ReferenceOutput packed = reference_attention_varlen(
      before.q.reshape({batch * seqlen_q, heads, head_dim}), at::cat(keys), at::cat(values),
      offsets(cu_seqlens_q), offsets(cu_seqlens_k), options);
  reference.output.out = packed.out.view({batch, seqlen_q, heads, head_dim});
  reference.output.lse = packed.lse.view({heads, batch, seqlen_q}).permute({1, 0, 2}).contiguous();
  return reference;
}

}  // namespace flashlab
