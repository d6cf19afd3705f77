// Decoding with a KV cache (attention_with_kvcache): one seeded problem, the
// reference and the check, composed of named steps like the forward's
// (problem.h):
//
//   inputs    make_kvcache_inputs(spec, device): q, the caches (contiguous or
//             paged through a shuffled block table), cache_seqlens, k_new/v_new;
//             every cache row past a sequence's valid keys is NaN
//   kernel    resolve_kvcache_kernel(spec, inputs), kvcache_params(spec, inputs)
//   snapshot  copy_caches(inputs): the caches before the call
//   poison    poisoned_kvcache_outputs(spec, inputs)
//   run       run_kvcache(spec, inputs, outputs): attention_with_kvcache_into
//   reference reference_kvcache(spec, before, params): the caches after the
//             append and out/lse in float32 (float64 for fp32 inputs)
//   tolerance kvcache_tolerance(spec, reference): the forward's rule
//   compare   compare_kvcache(...): out and lse element by element, the
//             appended cache rows bitwise equal to k_new/v_new and every other
//             cache element bitwise unchanged
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/block_timeline.h"
#include "flashlab/harness/compare.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/reference.h"

namespace flashlab {

// The tensors of one attention_with_kvcache call.
struct KvCacheTensors {
  at::Tensor q;                 // (batch, seqlen_q, heads, head_dim)
  at::Tensor k_cache, v_cache;  // contiguous (batch, capacity, kv_heads, head_dim) or
                                // paged (num_pages, page_size, kv_heads, head_dim)
  at::Tensor cache_seqlens;     // int32 (batch): rows cached before the append; undefined: every cache full
  at::Tensor block_table;       // int32 (batch, pages per sequence); undefined: a contiguous cache
  at::Tensor k_new, v_new;      // (batch, seqlen_new, kv_heads, head_dim); undefined: no append
  at::Tensor alibi_slopes, sinks;  // score modifications (KvCacheSpec's), float32; undefined when off

  bool paged() const { return block_table.defined(); }
  int64_t batch() const { return q.size(0); }
  int64_t capacity() const;    // rows one sequence's cache holds (paged: pages per sequence x page_size)
  int64_t seqlen_new() const;  // 0 without an append
  // Rows cached before the append, per sequence, on the host (capacity each
  // without cache_seqlens), and the keys each sequence attends to after it.
  std::vector<int64_t> cached_lengths() const;
  std::vector<int64_t> key_lengths() const;
  // attention_with_kvcache's options for these tensors on top of `base`
  // (the ALiBi slopes and sinks too, when defined).
  KvCacheOptions options(const AttentionOptions& base, int num_splits = 0) const;
};

// Rows 0..rows-1 of sequence `batch`'s cache in logical order,
// (rows, kv_heads, head_dim): cache[batch, :rows] for a contiguous cache,
// through block_table for a paged one.
at::Tensor cache_rows(const at::Tensor& cache, const at::Tensor& block_table, int64_t batch,
                      int64_t rows);

struct KvCacheReference {
  at::Tensor k_cache, v_cache;  // the caches after the append (input dtype, the inputs' layout)
  // bool (cache dim 0, cache dim 1): true on the rows the append writes
  // (contiguous: (batch, capacity); paged: (num_pages, page_size)).
  at::Tensor appended;
  ReferenceOutput output;  // out (batch, seqlen_q, heads, head_dim), lse (batch, heads, seqlen_q)
};

// The reference of one call, given its tensors as they were before it: the
// caches with k_new/v_new written at rows cache_seqlens[b] .. + seqlen_new - 1,
// and attention of each sequence's q over its first cache_seqlens[b] +
// seqlen_new keys, bottom-right aligned, GQA (reference_attention_varlen, one
// sequence at a time). A sequence without keys gives out 0 and lse -inf. Rows
// past the valid keys are never read (the inputs hold NaN there).
KvCacheReference reference_attention_kvcache(const KvCacheTensors& before,
                                             const ReferenceOptions& options);

// One seeded KV-cache problem.
struct KvCacheSpec {
  std::string kernel = "auto";
  int batch = 2, heads = 8, kv_heads = 8;
  int seqlen_q = 1, head_dim = 64;
  at::ScalarType dtype = at::kHalf;
  bool causal = false;
  std::optional<double> softmax_scale;
  int window_left = -1, window_right = -1;
  uint64_t seed = 0;
  bool float64_reference = false;  // always on for float32 inputs
  // Both references (float32 and the same-precision one) computed on the CPU:
  // compute-sanitizer's racecheck fails cuBLAS's own fp16 GEMM (CUDA 13.0), so
  // the racecheck runs of the KV-cache path leave the GPU to flashlab's kernels.
  bool cpu_reference = false;
  // Rows cached before the append, one per sequence (0 allowed). Empty: no
  // cache_seqlens tensor, every cache full (then seqlen_new must be 0).
  std::vector<int> cache_seqlens;
  // Rows a sequence's cache holds; 0: the least that fits every length plus
  // seqlen_new (at least 1). Paged caches round it up to whole pages.
  int capacity = 0;
  int page_size = 0;   // > 0: a paged cache of pages of page_size rows
  int seqlen_new = 0;  // rows appended from k_new/v_new
  int num_splits = 0;  // 0: the kernel's heuristic
  // Score modifications, ProblemSpec's (softcap, ALiBi slopes per head or per
  // sequence, sinks from their own stream), drawn with the inputs.
  double softcap = 0.0;
  ProblemSpec::Alibi alibi = ProblemSpec::Alibi::none;
  bool sinks = false;

  bool paged() const { return page_size > 0; }
  int pages_per_sequence() const;  // paged: capacity in pages
  int resolved_capacity() const;   // capacity as laid out (rows)
  // What is wrong with the spec itself (lengths vs capacity, counts), or empty.
  std::string invalid_reason() const;
  std::string describe() const;
  // The options without the modification tensors (softcap included: a value);
  // KvCacheTensors::options adds the slopes and sinks.
  AttentionOptions attention_options() const;
  // The forward spec of the same shapes (seqlen_k the capacity) and
  // modifications: for the tolerance rule (dtype, reference precision) and
  // the slopes' and sinks' draw.
  ProblemSpec problem_spec() const;
};

// Q, the caches, the lengths, the block table and the new rows, from MT19937
// normal(0, 1) values seeded by spec.seed (make_inputs' generator): q, then
// the logical caches (batch, capacity, kv_heads, head_dim), then k_new and
// v_new, so a paged and a contiguous spec with the same seed hold the same
// keys. Cache rows past a sequence's cached length are NaN (the rows the
// append writes too), so a kernel that reads a row it should not, or misses
// the append, shows NaN. Paged: the sequences' pages are a seeded shuffle of
// the cache's pages, plus one NaN page that no sequence uses, which the
// block-table entries past a sequence's keys point at. random = false: shapes
// only, no values (enough to ask a kernel whether it takes the problem).
KvCacheTensors make_kvcache_inputs(const KvCacheSpec& spec, at::Device device, bool random = true);

// The cache lengths `random` stands for: seeded, uniform in 0 .. capacity - seqlen_new.
std::vector<int> random_cache_seqlens(int batch, int capacity, int seqlen_new, uint64_t seed);

// Empty when `kernel` can run the spec on a device of this compute capability
// (0: any), else the reason: the spec's own (invalid_reason), "<kernel> has no
// KV-cache path", num_splits above the kernel's maximum, or its
// kvcache_unsupported_reason. Touches no device.
std::string kvcache_unsupported_reason(const KernelVariant& kernel, const KvCacheSpec& spec,
                                       int compute_capability = 0);

// The kernel that runs the spec (select_kvcache_kernel on these tensors).
const KernelVariant& resolve_kvcache_kernel(const KvCacheSpec& spec, const KvCacheTensors& inputs);
KvCacheParams kvcache_params(const KvCacheSpec& spec, const KvCacheTensors& inputs,
                             const at::Tensor& out = at::Tensor(), const at::Tensor& lse = at::Tensor());

// The same tensors with their own copies of k_cache and v_cache (the snapshot
// the reference and the cache comparison start from).
KvCacheTensors copy_caches(const KvCacheTensors& inputs);

// out NaN like q, lse NaN (batch, heads, seqlen_q) float32.
ForwardOutputs poisoned_kvcache_outputs(const KvCacheSpec& spec, const KvCacheTensors& inputs);

// Enqueues the call through attention_with_kvcache_into (which validates the
// lengths and pages on the host first). Writes the caches and `outputs`.
void run_kvcache(const KvCacheSpec& spec, const KvCacheTensors& inputs, const ForwardOutputs& outputs);

struct KvCacheExpected {
  KvCacheReference reference;      // float32 (float64 for fp32 inputs / float64_reference)
  ReferenceOutput same_precision;  // the same attention in the input dtype (torch's math path)
};
// Softmax scale and window as the kernel sees them (from `params`).
KvCacheExpected reference_kvcache(const KvCacheSpec& spec, const KvCacheTensors& before,
                                  const KvCacheParams& params);
// The forward's pass rule (forward_tolerance) on these references.
ForwardTolerance kvcache_tolerance(const KvCacheSpec& spec, const KvCacheExpected& expected);

// One call against the reference, as check_kvcache makes it: the parameter
// block (kvcache_params), a snapshot of the caches (copy_caches), poisoned
// outputs, the call (run_kvcache, then a device sync) and the reference from
// the snapshot (reference_kvcache).
struct KvCacheCall {
  KvCacheParams params;
  ForwardOutputs outputs;
  KvCacheExpected expected;
};
KvCacheCall call_against_reference(const KvCacheSpec& spec, const KvCacheTensors& inputs);

// The first cache element that differs bitwise from the expected cache.
struct CacheDifference {
  int64_t index0 = 0;  // batch (contiguous) or page (paged)
  int64_t row = 0;     // row within the sequence's cache or the page
  int64_t head = 0, col = 0;
  double actual = 0, expected = 0;
  uint32_t actual_bits = 0, expected_bits = 0;
  bool appended = false;  // one of the rows the append writes
  // The (sequence, logical row) this element holds; -1: none (a page no
  // sequence's keys reach).
  int64_t sequence = -1, logical_row = -1;
  int64_t sequence_keys = 0;  // the keys that sequence attends to
};

struct CacheComparison {
  std::string name;  // "k_cache", "v_cache"
  bool paged = false;
  int64_t total = 0;
  int64_t appended_elements = 0;   // elements the append writes
  int64_t appended_differing = 0;  // of those, not bitwise equal to k_new/v_new
  int64_t other_differing = 0;     // elements outside the append that changed
  std::optional<CacheDifference> first_difference;
  bool passed() const { return appended_differing == 0 && other_differing == 0; }
  std::string format() const;
  std::string to_json() const;
};

// actual against expected bitwise (NaN poison included); appended as in
// KvCacheReference. block_table and key_lengths name the sequence row of the
// first difference (block_table undefined: contiguous).
CacheComparison compare_cache(const std::string& name, const at::Tensor& actual,
                              const at::Tensor& expected, const at::Tensor& appended,
                              const at::Tensor& block_table, const std::vector<int64_t>& key_lengths);

struct KvCacheComparison {
  ComparisonReport out, lse;
  CacheComparison k_cache, v_cache;
};
KvCacheComparison compare_kvcache(const KvCacheSpec& spec, const KvCacheTensors& inputs,
                                  const ForwardOutputs& outputs, const KvCacheExpected& expected,
                                  const ForwardTolerance& tolerance);

// Where a row of out/lse lives in a split-KV kernel that packs a kv head's
// query heads as rows: the sequence's keys, the keys the row sees, its packed
// row (row x group + head % group) and that row's block of tiles.block_q
// packed rows, and the key blocks of tiles.block_k keys it visits.
std::string kvcache_row_context(const KvCacheSpec& spec, const std::vector<int64_t>& cached_lengths,
                                const TileShape& tiles, const ElementPosition& at);

struct KvCacheCheckResult {
  std::string kernel;  // the kernel that ran (resolves "auto")
  std::string problem;
  TileShape tiles;         // kvcache_tile_shape
  int num_splits = 0;      // kvcache_splits: what the launch used
  bool num_splits_chosen = false;  // by the kernel's heuristic (spec.num_splits 0)
  int max_splits = 0;      // kvcache_max_splits
  int64_t workspace_bytes = 0;
  std::string launch;      // kvcache_launch_summary (empty: the kernel does not say)
  std::vector<int64_t> cached_lengths;  // per sequence, before the append
  ForwardTolerance tolerance;
  ComparisonReport out, lse;
  std::string out_context, lse_context;  // kvcache_row_context of the first bad element
  CacheComparison k_cache, v_cache;
  double kernel_ms = -1;  // median over the timed launches, when timed
  std::optional<BlockTimeline> block_timeline;  // CheckOptions::block_timeline
  bool passed() const {
    return out.passed() && lse.passed() && k_cache.passed() && v_cache.passed();
  }
  std::string format() const;
  std::string to_json() const;
};

// The whole check (src/harness/check_pipeline.h's steps) on
// current_cuda_device(). Timing (check_options.timed_launches: launches
// through run_kvcache_kernel, without the host checks) comes after the
// comparison: a timed launch appends the same rows again.
KvCacheCheckResult check_kvcache(const KvCacheSpec& spec, const CheckOptions& check_options = {});

// One launch of the kernel's KV-cache path after an L2 flush, with
// params.block_timeline pointing at zeroed slots for grid_blocks blocks (the
// split kernel's grid: KernelVariant::supports_block_timeline); on the current device.
BlockTimeline record_block_timeline(const KernelVariant& kernel, KvCacheParams params, int64_t grid_blocks);
// The split kernel's blocks: splits x packed-row tiles x batch x kv_heads.
int64_t kvcache_grid_blocks(const KvCacheSpec& spec, int num_splits, const TileShape& tiles);

}  // namespace flashlab
