// The torch-facing entry points. Tensors are (batch, seqlen, heads, head_dim),
// like flash_attn_func; every input is validated before anything is launched.
//
// Any head_dim up to 256 (fp16/bf16; float32 up to 128, fa1_scalar's), as in
// flash-attn: a kernel has code for some head dims (KernelVariant::
// padded_head_dim; fa3_wgmma_sm90 64/128/256, fa2_mma_sm80 32/64/96/128/256,
// fa1_scalar any up to 128), and the public entries below zero-pad q, k, v
// (backward: dout and out too) on the last dimension to the next head dim the
// chosen kernel has, run it, and return out (dq, dk, dv) sliced back to
// head_dim. The softmax scale stays 1/sqrt(head_dim) of the head_dim given
// (an explicit softmax_scale is used as is); the LSE is unchanged. Zero
// columns add nothing to Q K^T, give zero output columns and zero gradient
// columns, and leave D = rowsum(dout * out) as it was, so the result is the
// unpadded attention's. "auto" takes the first registered kernel (fastest
// first: fa3_wgmma_sm90, fa2_mma_sm80, fa1_scalar) that can run the problem on
// the device at the head dim it would pad it to: head_dim 40 in fp16 runs
// fa3_wgmma_sm90 at 64 on an H100 and fa2_mma_sm80 at 64 on an A100, not
// fa1_scalar at 40. A named kernel pads to its own head dims. A head_dim no
// kernel reaches (above 256; float32 above 128) is an error naming the head
// dims each kernel takes. The lower-level entries (run_kernel,
// run_backward_kernel, make_params, the parameter-block selections) never pad:
// they run a kernel at its own head dims, as the harness and flashlab-run do.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "flashlab/kernel_registry.h"

namespace flashlab {

struct AttentionOptions {
  bool causal = false;
  std::optional<double> softmax_scale;  // default 1/sqrt(head_dim)
  std::string kernel = "auto";          // a registered kernel name, or "auto"
  int window_left = -1;                 // -1: unbounded
  int window_right = -1;                // -1: unbounded; causal forces 0
  // Check values that live on the device (cu_seqlens, cache_seqlens,
  // block_table) on the host before the launch, at the cost of a sync; unset:
  // strict_checks() (see "Values on the device" below).
  std::optional<bool> strict_checks;
  // Score modifications, flash-attn's definitions (harness/reference.h says
  // them): softcap > 0 caps the scaled scores at softcap * tanh(s / softcap);
  // alibi_slopes, float32 (heads) or (batch, heads), subtracts slope * |i +
  // seqlen_k - seqlen_q - j|; sinks, float32 (heads), adds one logit per head
  // to every row's softmax denominator (the LSE counts it; a row that sees no
  // key gives 0 and LSE = sink). Checked here; a kernel that does not apply
  // one (KernelVariant's *_score_modifications) is refused by the kernel
  // choice, naming what is missing.
  double softcap = 0.0;
  at::Tensor alibi_slopes;
  at::Tensor sinks;
  // FP8 (q, k, v of dtype Float8_e4m3fn; forward only, fa3_wgmma_sm90 on
  // sm_90a): FA3's descale factors, float32 (batch, kv_heads) each (undefined:
  // 1), that turn the stored values into what they stand for: attention of
  // q * q_descale, k * k_descale, v * v_descale. The output is output_dtype
  // (BFloat16 or Half; default BFloat16), the LSE float32.
  at::Tensor q_descale, k_descale, v_descale;
  std::optional<at::ScalarType> output_dtype;
  // SMs a persistent forward (fa3_wgmma_sm90) leaves to kernels that run
  // beside it, as FA3's sm_margin: the ring of flashlab.distributed leaves
  // them to NCCL's transfers. >= 0; other kernels ignore it.
  int sm_margin = 0;
};

// ---------------------------------------------------------------------------
// Values on the device. No entry point reads cu_seqlens, cache_seqlens or
// block_table on the host by default (a read is a device sync per call, and
// breaks CUDA graph capture). The kernels keep in bounds whatever those tensors
// hold: a length or offset out of range is clamped into it, a page entry that
// is not a page of the cache is read as page 0 (in bounds) and never written
// through, no cache row outside a sequence's own is written; and the first bad
// value is recorded on the
// device. The next launch on that device (any entry point) or
// check_device_errors() raises it as a c10::Error naming the tensor, the index
// and the value. In strict mode the values are copied to the host and checked
// before anything is launched or written, with the same kind of message, at
// once (except while the stream is being captured into a CUDA graph, when the
// kernels' check stands).
//
// The process's default: off, or on when FLASHLAB_STRICT_CHECKS=1 is set;
// set_strict_checks changes it, options.strict_checks overrides it per call.
void set_strict_checks(bool on);
bool strict_checks();

// Waits for `device` (every device flashlab launched on, when none is named)
// and throws c10::Error describing the first bad device-side value a kernel
// met since the last report, clearing it; returns when there is none.
void check_device_errors(std::optional<int> device = std::nullopt);

// Merges a partial attention result into an accumulated one, in place: the
// split-KV combine's LSE rule for two parts over disjoint key sets (the ring
// step of flashlab.distributed). out float32 (batch, rows, heads, head_dim)
// with lse float32 (batch, heads, rows), or packed (rows, heads, head_dim) with
// (heads, rows); block_out (float32, float16 or bfloat16) and block_lse of the
// same shapes.
// CUDA tensors on one device, any strides with contiguous columns; enqueued
// on the current stream.
void merge_attention_states_(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& block_out,
                             const at::Tensor& block_lse);

struct AttentionOutput {
  // (batch, seqlen_q, heads, head_dim), input dtype. When the kernel ran a
  // padded head dim, a view of the first head_dim columns of its padded output
  // (last dimension contiguous, rows padded_head_dim apart), like flash-attn's.
  at::Tensor out;
  at::Tensor lse;  // (batch, heads, seqlen_q), float32
};

AttentionOutput attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionOptions& options = {});

// Writes into caller-provided buffers (the tests poison them first).
void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options = {});

// Whether a kernel may run a problem at a larger head dim than it has
// (padded_head_dim): the public entries allow it, the lower-level ones not.
enum class HeadDimPadding { none, allowed };

// The kernel that would run this problem: options.kernel when it is a known name
// that supports the problem, else (for "auto") the first registered kernel that
// does; with padding allowed (attention_forward's choice), each kernel is asked
// at padded_head_dim(kernel, head_dim). Throws c10::Error with the reason otherwise.
const KernelVariant& select_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const AttentionOptions& options,
                                   HeadDimPadding padding = HeadDimPadding::allowed);

// The same for a parameter block as it is (no validation, no device access:
// params.device_compute_capability is the device's); kernel_name a registered
// name or "auto". Padding none: what run_kernel can take.
const KernelVariant& select_kernel(const AttentionParams& params, const std::string& kernel_name,
                                   HeadDimPadding padding = HeadDimPadding::none);

// The lower-level entry: runs `kernel` on a parameter block from make_params /
// make_varlen_params, which the caller may extend (a tile trace, say). Checks
// that the kernel can run it (cannot_run_reason: the problem, the device's
// compute capability, tracing; throws c10::Error with the reason), allocates the
// kernel's workspace (KernelVariant::workspace_bytes) with torch's caching
// allocator, and launches on params.stream, or on the current stream of the
// current device when that is null. Nothing to launch when seqlen_q or batch is
// 0. The tensors behind the pointers are not checked: attention_forward does that.
void run_kernel(const KernelVariant& kernel, const AttentionParams& params);

// The parameter block for these tensors (no launch, no device access).
AttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& lse,
                            const AttentionOptions& options);

// Variable-length batches, like flash_attn_varlen_func: q is (total_q, heads,
// head_dim) and k, v are (total_k, kv_heads, head_dim), the sequences packed one
// after another. cu_seqlens_q/k are int32 prefix sums of length batch + 1 on q's
// device (sequence b is rows cu_seqlens[b] .. cu_seqlens[b+1]-1); max_seqlen_q/k
// bound every length. Sequences align bottom-right, each on its own. Returns out
// (total_q, heads, head_dim) and lse (heads, total_q), float32. The offsets are
// validated on the host (copied to the CPU) in strict mode only; otherwise the
// kernels keep them in bounds and report a bad one ("Values on the device").
AttentionOutput attention_varlen_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                         const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                         int max_seqlen_k, const AttentionOptions& options = {});

// Writes into caller-provided out (total_q, heads, head_dim) and lse (heads, total_q).
void attention_varlen_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                                   const at::Tensor& lse, const AttentionOptions& options = {});

// select_kernel for a variable-length batch (validates the lengths too).
const KernelVariant& select_varlen_kernel(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& cu_seqlens_q,
                                          const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                          int max_seqlen_k, const AttentionOptions& options,
                                          HeadDimPadding padding = HeadDimPadding::allowed);

// make_params for a variable-length batch: batch strides 0, seqlens the maxima,
// lse laid out as (heads, total_q). No launch, no device access.
AttentionParams make_varlen_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                   int max_seqlen_q, int max_seqlen_k, const at::Tensor& out,
                                   const at::Tensor& lse, const AttentionOptions& options);

// ---------------------------------------------------------------------------
// The backward pass. dout, q, k, v, out and lse as the forward saw and returned
// them (out, lse from attention_forward with the same options); returns dq, dk,
// dv in the input dtype with the shapes of q, k, v. GQA/MQA: dk and dv sum over
// each kv head's query heads. The kernel's workspace (the float32 dq
// accumulator, rowsum(dout * out)) comes from its backward_workspace_bytes and
// torch's caching allocator. options.kernel "auto": the first registered kernel
// with a backward that takes the problem, at the head dim it pads it to (see
// the top of this file; dq, dk, dv then are views of the padded gradients'
// first head_dim columns, the _into forms copy them into the caller's).
struct BackwardOptions : AttentionOptions {
  // dq, dk, dv bitwise equal run to run (no float atomics in a run-dependent order).
  bool deterministic = false;
  // With sinks, the _into forms write dL/dsinks here (float32 (heads),
  // contiguous, sinks' device) when it is defined.
  at::Tensor dsinks;
};

struct AttentionGradients {
  at::Tensor dq, dk, dv;  // like q, k, v
  at::Tensor dsinks;      // with options.sinks: float32 (heads), -sum over rows of exp(sink - lse) * D
};

AttentionGradients attention_backward(const at::Tensor& dout, const at::Tensor& q,
                                      const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& out, const at::Tensor& lse,
                                      const BackwardOptions& options = {});

// Writes into caller-provided dq, dk, dv (shapes and dtype of q, k, v; last
// dimension contiguous; the tests poison them first).
void attention_backward_into(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                             const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dv,
                             const BackwardOptions& options = {});

// Variable-length twin: packed (total, heads, head_dim) tensors and lse
// (heads, total_q), as attention_varlen_forward takes and returns them.
AttentionGradients attention_varlen_backward(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& cu_seqlens_q,
                                             const at::Tensor& cu_seqlens_k, int max_seqlen_q,
                                             int max_seqlen_k, const BackwardOptions& options = {});
void attention_varlen_backward_into(const at::Tensor& dout, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& out, const at::Tensor& lse,
                                    const at::Tensor& cu_seqlens_q, const at::Tensor& cu_seqlens_k,
                                    int max_seqlen_q, int max_seqlen_k, const at::Tensor& dq,
                                    const at::Tensor& dk, const at::Tensor& dv,
                                    const BackwardOptions& options = {});

// The kernel whose backward would run this problem (options.kernel, or "auto":
// the first registered kernel with a backward that takes it). Throws c10::Error
// with the reason otherwise. Padding none (the default): the block as it is,
// what run_backward_kernel can take; allowed: attention_backward's choice, each
// kernel asked at padded_head_dim(kernel, params.head_dim).
const KernelVariant& select_backward_kernel(const AttentionBackwardParams& params,
                                            const std::string& kernel_name,
                                            HeadDimPadding padding = HeadDimPadding::none);

// The parameter blocks (no launch, no device access). dq/dk/dv may be undefined
// (no gradient pointers: enough to ask a kernel whether it takes the problem).
AttentionBackwardParams make_backward_params(const at::Tensor& dout, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse,
                                             const at::Tensor& dq, const at::Tensor& dk,
                                             const at::Tensor& dv, const BackwardOptions& options);
AttentionBackwardParams make_varlen_backward_params(
    const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& cu_seqlens_q,
    const at::Tensor& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, const at::Tensor& dq,
    const at::Tensor& dk, const at::Tensor& dv, const BackwardOptions& options);

// run_kernel's twin: checks kernel.backward_unsupported_reason and the device,
// allocates kernel.backward_workspace_bytes(params) into params.workspace, and
// calls kernel.backward_launch on params.stream (or the current stream).
// Throws c10::Error for a kernel without a backward (naming those with one),
// a problem it does not take, another device, a tile trace, or a null tensor
// pointer. Nothing is launched when batch, seqlen_q or seqlen_k is 0; the
// gradients that have rows are zeroed instead (no query rows: dk, dv; no keys:
// dq), so the result is always what the math says.
void run_backward_kernel(const KernelVariant& kernel, const AttentionBackwardParams& params);

// ---------------------------------------------------------------------------
// Decoding with a KV cache, flash_attn_with_kvcache's semantics. q is (batch,
// seqlen_q, heads, head_dim), seqlen_q 1 for decoding or a few (speculative
// decoding). k_cache/v_cache are either contiguous (batch, capacity, kv_heads,
// head_dim) or, with block_table, paged (num_pages, page_size, kv_heads,
// head_dim). When k_new/v_new (batch, seqlen_new, kv_heads, head_dim) are
// given they are written into the cache in place at rows cache_seqlens[b] ..
// cache_seqlens[b] + seqlen_new - 1 before attending; sequence b then attends
// to its first cache_seqlens[b] + seqlen_new keys, bottom-right aligned (causal
// and window as in the forward). GQA/MQA: heads a multiple of kv_heads.
// Returns out (batch, seqlen_q, heads, head_dim) and lse (batch, heads,
// seqlen_q), float32. Shapes, dtypes and devices are validated before anything
// is written; the values of cache_seqlens and block_table (lengths beyond the
// capacity, page entries out of range) too in strict mode, where they are copied
// to the host; by default the kernels check them ("Values on the device").
struct KvCacheOptions : AttentionOptions {
  std::optional<at::Tensor> cache_seqlens;  // int32 (batch); absent: every cache is full
  std::optional<at::Tensor> k_new, v_new;   // (batch, seqlen_new, kv_heads, head_dim), both or neither
  std::optional<at::Tensor> block_table;    // int32 (batch, pages per sequence): a paged cache
  int num_splits = 0;                       // 0: the kernel's heuristic; else 1..its maximum
};

AttentionOutput attention_with_kvcache(const at::Tensor& q, const at::Tensor& k_cache,
                                       const at::Tensor& v_cache, const KvCacheOptions& options = {});
void attention_with_kvcache_into(const at::Tensor& q, const at::Tensor& k_cache,
                                 const at::Tensor& v_cache, const at::Tensor& out,
                                 const at::Tensor& lse, const KvCacheOptions& options = {});

// The parameter block for these tensors (no launch, no device access; the
// lengths are not checked). out/lse may be undefined.
KvCacheParams make_kvcache_params(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& out,
                                  const at::Tensor& lse, const KvCacheOptions& options);

// The kernel that would run it (options.kernel, or "auto": the first registered
// kernel with a KV-cache path that takes it; with padding allowed, at the head
// dim it pads head_dim to, as attention_with_kvcache does: there a padded run
// works on zero-padded copies of q and the caches and copies the appended rows
// back, O(cache size) extra). Throws c10::Error otherwise.
const KernelVariant& select_kvcache_kernel(const KvCacheParams& params,
                                           const std::string& kernel_name,
                                           HeadDimPadding padding = HeadDimPadding::none);

// run_kernel's twin: checks kernel.kvcache_unsupported_reason and the device,
// allocates kernel.kvcache_workspace_bytes(params) into params.workspace and
// calls kernel.kvcache_launch on params.stream (or the current stream). The
// lengths and page entries behind the pointers are not checked here
// (attention_with_kvcache does that).
void run_kvcache_kernel(const KernelVariant& kernel, const KvCacheParams& params);

// The splits a launch of `kernel` would use for params (params.num_splits, or
// the heuristic for 0).
int kvcache_splits(const KernelVariant& kernel, const KvCacheParams& params);

}  // namespace flashlab
