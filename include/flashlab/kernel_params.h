// The plain parameter block handed from the torch-facing C++ to every kernel.
// It holds no torch types on purpose: kernel .cu files include only this and
// the registry header, so they compile in seconds instead of minutes.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHLAB_HOST_DEVICE __host__ __device__
#else
#define FLASHLAB_HOST_DEVICE
#endif

namespace flashlab {

// e4m3: 8-bit floats (FP8, 4 exponent and 3 mantissa bits), forward inputs only
// (fa3_wgmma_sm90's FP8 path); the output is 16-bit (output_dtype).
enum class DataType : int { float32 = 0, float16 = 1, bfloat16 = 2, e4m3 = 3 };

const char* data_type_name(DataType dtype);

// Per-(row, key tile) online-softmax state recorded by kernels that support
// tile tracing. Layout: [batch][head][row][key_tile], row-major, float32.
struct TileTrace {
  float* row_max = nullptr;  // running max m after the tile (natural-log units)
  float* row_sum = nullptr;  // running sum l after the tile, relative to row_max
  int num_key_tiles = 0;     // ceil(max_seqlen_k / block_k) of the traced kernel
  FLASHLAB_HOST_DEVICE bool enabled() const { return row_max != nullptr; }
};

// Values that live on the device (cu_seqlens, cache_seqlens, block_table) are
// never read on the host on the default path, so a kernel may meet a bad one:
// it then clamps it to what is in bounds (no read or write outside the tensors,
// no cache row outside the sequence's own) and records the first bad value it
// met here, in host-mapped memory the op library reads at its next call without
// a sync (src/ops/device_errors.cpp). Writers: common/value_guard.h.
enum class DeviceErrorCode : int {
  none = 0,
  cu_seqlens_q = 1,   // index0 = i: cu_seqlens_q[i] outside [low, high]
  cu_seqlens_k = 2,
  seqlen_q_over_max = 3,  // index0 = b: cu_seqlens_q[b + 1] - cu_seqlens_q[b] > max_seqlen_q (high)
  seqlen_k_over_max = 4,
  cache_seqlens = 5,  // index0 = b, index1 = capacity: cache_seqlens[b] outside [0, capacity - seqlen_new]
  block_table = 6,    // index0 = b, index1 = j: block_table[b][j] not a page of the cache
  cache_seqlens_paged = 7,  // as cache_seqlens, the capacity being block_table's width x page_size
};

struct DeviceErrorLog {
  int claimed = 0;  // 0 until a thread claims the record (atomicCAS)
  int ready = 0;    // 1 once the fields below are written (stored last, after a fence)
  int code = 0;     // DeviceErrorCode
  int index0 = 0, index1 = 0;
  int value = 0;
  int low = 0, high = 0;  // the values that were expected: low <= value <= high
};

// Score modifications (issue 33; common/score_modification.h applies them):
// flash-attn's softcap, ALiBi slopes and attention sinks. All off by default;
// KernelVariant's *_score_modifications say which kernel applies which, in
// which mode.
struct ScoreModificationParams {
  float softcap = 0.f;                   // > 0: scaled scores s -> softcap * tanh(s / softcap)
  const float* alibi_slopes = nullptr;   // float32, (heads) or (batch, heads), on the device
  int64_t alibi_batch_stride = 0;        // 0 for (heads): one slope per head for every batch entry
  const float* sinks = nullptr;          // float32 (heads), on the device: a logit in every row's denominator
  FLASHLAB_HOST_DEVICE bool any() const { return softcap != 0.f || alibi_slopes != nullptr || sinks != nullptr; }
  // The ones that change each score (the backward's per-element work): sinks
  // alone only enter the LSE, which the backward reads as the forward wrote it.
  FLASHLAB_HOST_DEVICE bool per_element() const { return softcap != 0.f || alibi_slopes != nullptr; }
};

// Strides are in elements. Tensors are logically (batch, seqlen, heads, head_dim)
// with head_dim contiguous, exactly like flash_attn_func.
struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // log-sum-exp, float32

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  // lse index = b * lse_batch_stride + h * lse_head_stride + (row offset) + row,
  // where the row offset is cu_seqlens_q[b] for variable-length batches, else 0.
  int64_t lse_batch_stride = 0, lse_head_stride = 0;

  int batch = 0;
  int heads = 0;     // query heads
  int kv_heads = 0;  // key/value heads; heads % kv_heads == 0 (GQA/MQA)
  int seqlen_q = 0;  // for variable length: the maximum over the batch
  int seqlen_k = 0;
  int head_dim = 0;
  DataType dtype = DataType::float16;

  float softmax_scale = 1.0f;
  // flash-attn semantics, bottom-right aligned: key j is visible from query i iff
  //   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right
  // with -1 meaning unbounded on that side. Causal is window_right = 0.
  int window_left = -1;
  int window_right = -1;
  FLASHLAB_HOST_DEVICE bool causal() const { return window_right == 0; }
  ScoreModificationParams modification;

  // Variable-length batches (packed tokens): int32 prefix sums of length batch+1,
  // on the device. When set, the batch strides are ignored and row offsets come
  // from these arrays.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  FLASHLAB_HOST_DEVICE bool is_varlen() const { return cu_seqlens_q != nullptr; }
  // Packed rows of q and k/v in a variable-length batch (cu_seqlens_*[batch]);
  // kernels whose copy engine needs the tensor's extent (TMA) read these.
  int64_t total_rows_q = 0, total_rows_k = 0;

  TileTrace trace;

  // Device scratch of KernelVariant::workspace_bytes(params) bytes, allocated by
  // the op library (torch's caching allocator) before the launch: kernels never
  // allocate. Uninitialized; nullptr / 0 when the kernel asks for none.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  int device_compute_capability = 0;  // e.g. 90 for sm_90; 0 when unknown
  void* stream = nullptr;             // cudaStream_t
  // FP8 (dtype e4m3): the output's 16-bit type, and the descale factors, float32
  // (batch, kv_heads) each with batch stride descale_batch_stride (nullptr: 1),
  // that turn the stored e4m3 values back into the values they stand for:
  // S = (q * q_descale) (k * k_descale)^T, O = P (v * v_descale).
  DataType output_dtype = DataType::bfloat16;
  const float* q_descale = nullptr;
  const float* k_descale = nullptr;
  const float* v_descale = nullptr;
  int64_t descale_batch_stride = 0;
  // SMs a persistent grid leaves free (FA3's sm_margin): a kernel running
  // beside it (NCCL's transfers in the ring of flashlab.distributed) then
  // finds SMs instead of waiting for the whole grid to finish. 0: every SM.
  int sm_margin = 0;

  // Where a kernel records a bad device-side value (DeviceErrorLog, host-mapped);
  // nullptr: it clamps the value and records nothing.
  DeviceErrorLog* error_log = nullptr;
};

// The backward pass: the forward block (q, k, v, out, lse and the problem as
// the forward saw it) plus the gradients. Same conventions: strides in
// elements, (batch, seqlen, heads, head_dim) with head_dim contiguous; batch
// strides ignored for variable-length batches.
struct AttentionBackwardParams : AttentionParams {
  const void* dout = nullptr;  // dL/dout, like out
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;

  void* dq = nullptr;  // like q
  void* dk = nullptr;  // like k (kv_heads)
  void* dv = nullptr;  // like v (kv_heads)
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  // softmax_d and dq_accum live in params.workspace: the kernel's backward
  // launch sets these two on its own copy of the block (the op library leaves
  // them null).
  // rowsum(dout * out) per (batch, head, row), float32, laid out like lse
  // (lse_batch_stride, lse_head_stride and the varlen row offset).
  float* softmax_d = nullptr;

  // float32 accumulator for dq, zeroed before the launch: kernels that walk
  // query tiles per key tile add partial dq here and convert at the end. Its
  // layout is the kernel's: a sequence starts batch * dq_accum_batch_stride
  // elements in (varlen: plus its first packed row * dq_accum_row_stride).
  float* dq_accum = nullptr;
  int64_t dq_accum_batch_stride = 0, dq_accum_row_stride = 0, dq_accum_head_stride = 0;

  // Bitwise reproducible dq (no float atomics in a run-dependent order).
  bool deterministic = false;

  // With attention sinks (modification.sinks): float32 (heads), written with
  // dL/dsink = -sum over rows of exp(sink - lse) * D (not accumulated).
  float* dsinks = nullptr;
};

// Decoding with a KV cache (flash_attn_with_kvcache). The base block
// describes the attention as the kernel sees it: q is (batch, seqlen_q, heads,
// head_dim); k/v are the caches, either contiguous (batch, capacity, kv_heads,
// head_dim), where k_batch_stride steps from one sequence's cache to the next,
// or paged (num_pages, page_size, kv_heads, head_dim), where k_batch_stride
// steps from one page to the next and block_table maps a sequence's logical
// page to a physical one. seqlen_k is the capacity of one sequence's cache
// (contiguous: its rows; paged: block_table_width * page_size); sequence b
// attends to its first cache_seqlens[b] + seqlen_new keys, aligned
// bottom-right with its seqlen_q queries as in the forward.
struct KvCacheParams : AttentionParams {
  // int32 per sequence, on the device: cached keys before the append; nullptr:
  // every sequence holds seqlen_k keys (a full cache, nothing appended).
  const int* cache_seqlens = nullptr;

  // Paged cache: block_table is int32 (batch, block_table_width) on the
  // device, entry [b][j] the physical page of sequence b's keys
  // j*page_size .. (j+1)*page_size-1. nullptr: a contiguous cache.
  const int* block_table = nullptr;
  int64_t block_table_batch_stride = 0;
  int block_table_width = 0;
  int page_size = 0;  // rows per page (paged), 0 otherwise
  int num_pages = 0;  // pages in the cache tensors (paged)
  FLASHLAB_HOST_DEVICE bool is_paged() const { return block_table != nullptr; }

  // New keys/values (batch, seqlen_new, kv_heads, head_dim) written into the
  // cache at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before
  // attending (the cache is modified in place); nullptr / 0: no append.
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int seqlen_new = 0;
  int64_t k_new_batch_stride = 0, k_new_row_stride = 0, k_new_head_stride = 0;
  int64_t v_new_batch_stride = 0, v_new_row_stride = 0, v_new_head_stride = 0;

  // Splits of each sequence's keys (split-KV): 0 = the kernel chooses
  // (KernelVariant::kvcache_num_splits), else used as given (>= 1). With more
  // than one split, partial outputs and LSEs go to float32 buffers carved from
  // params.workspace and a combine kernel writes out and lse.
  int num_splits = 0;

  // The split kernel's block timeline (flashlab-run --kvcache --timeline):
  // nullptr, or kBlockTimelineSlots uint64 per block (linear block index x +
  // y * X + z * X * Y), zeroed by the caller: %globaltimer ns when the block
  // starts, when its warps have merged (before its stores), and the SM it ran
  // on. Blocks at or past block_timeline_blocks write nothing.
  uint64_t* block_timeline = nullptr;
  int64_t block_timeline_blocks = 0;
};
inline constexpr int kBlockTimelineSlots = 3;  // uint64 per block: start ns, end ns, SM

}  // namespace flashlab

#include <string>

namespace flashlab {
// "batch 2, heads 8/2, seqlen 113x1023, head_dim 64, fp16, causal" for error messages.
std::string describe_problem(const AttentionParams& params);
// describe_problem plus the cache: "..., kv cache paged 16 x 256 rows, append 1".
std::string describe_kvcache_problem(const KvCacheParams& params);
}  // namespace flashlab
