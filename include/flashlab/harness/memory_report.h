// Peak device memory of one attention call, fused kernel against naive
// attention that materializes the (seqlen_q x seqlen_k) score matrix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashlab/harness/kvcache_check.h"
#include "flashlab/harness/problem.h"

namespace flashlab {

struct MemoryMeasurement {
  int seqlen = 0;
  std::string kernel;           // the kernel that ran ("auto" resolved)
  int64_t kernel_bytes = 0;     // peak bytes allocated by one fused call (out + lse + workspace)
  int64_t workspace_bytes = 0;  // the kernel's workspace query (KernelVariant::workspace_bytes)
  int64_t naive_bytes = 0;   // the same for matmul -> softmax -> matmul in the input dtype
  double saving() const { return naive_bytes > 0 ? 1.0 - double(kernel_bytes) / naive_bytes : 0; }

  // With MemoryOptions::backward: forward then backward (dq, dk, dv and the
  // backward's workspace on top of out and lse), against the naive forward
  // and torch autograd's backward through it (saved scores included). -1: not measured.
  int64_t training_bytes = -1;
  int64_t backward_workspace_bytes = -1;  // KernelVariant::backward_workspace_bytes
  int64_t naive_training_bytes = -1;
  double training_saving() const {
    return naive_training_bytes > 0 ? 1.0 - double(training_bytes) / naive_training_bytes : 0;
  }
};

struct MemoryOptions {
  bool backward = false;       // also measure forward + backward (the kernel must have a backward)
  bool deterministic = false;  // the backward's mode (its workspace may differ)
};

// Peak allocated bytes above the inputs while `call` runs (torch's caching allocator statistics).
int64_t peak_bytes_during(const std::function<void()>& call);

// spec with seqlen_q = seqlen_k = each of `seqlens`.
std::vector<MemoryMeasurement> measure_memory(ProblemSpec spec, const std::vector<int>& seqlens,
                                              const MemoryOptions& options = {});
// The forward table; rows measured with MemoryOptions::backward add a second
// table for forward + backward.
std::string format_memory_table(const ProblemSpec& spec, const std::vector<MemoryMeasurement>& rows);

// Decoding with a KV cache: what the inputs hold (the caches, the block table,
// the lengths, the new rows) and what one attention_with_kvcache call adds on
// top of them (out, lse and the kernel's split-KV workspace).
struct KvCacheMemory {
  std::string kernel;  // the kernel that ran ("auto" resolved)
  int num_splits = 0;  // kvcache_splits: what the call used
  int64_t k_cache_bytes = 0, v_cache_bytes = 0;
  int64_t valid_key_bytes = 0;  // k and v rows the sequences attend to (after the append)
  int64_t block_table_bytes = 0, cache_seqlens_bytes = 0;
  int64_t new_rows_bytes = 0;   // k_new + v_new
  int64_t workspace_bytes = 0;  // KernelVariant::kvcache_workspace_bytes at those splits
  int64_t call_bytes = 0;       // peak allocated by one call above its inputs
};
KvCacheMemory measure_kvcache_memory(const KvCacheSpec& spec);
std::string format_kvcache_memory(const KvCacheSpec& spec, const KvCacheMemory& memory);

}  // namespace flashlab
