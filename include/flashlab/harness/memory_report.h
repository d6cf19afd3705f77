// Peak device memory of one attention call, fused kernel against naive
// attention that materializes the (seqlen_q x seqlen_k) score matrix.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashlab/harness/problem.h"

namespace flashlab {

struct MemoryMeasurement {
  int seqlen = 0;
  std::string kernel;           // the kernel that ran ("auto" resolved)
  int64_t kernel_bytes = 0;     // peak bytes allocated by one fused call (out + lse + workspace)
  int64_t workspace_bytes = 0;  // the kernel's workspace query (KernelVariant::workspace_bytes)
  int64_t naive_bytes = 0;   // the same for matmul -> softmax -> matmul in the input dtype
  double saving() const { return naive_bytes > 0 ? 1.0 - double(kernel_bytes) / naive_bytes : 0; }
};

// Peak allocated bytes above the inputs while `call` runs (torch's caching allocator statistics).
int64_t peak_bytes_during(const std::function<void()>& call);

// spec with seqlen_q = seqlen_k = each of `seqlens`.
std::vector<MemoryMeasurement> measure_memory(ProblemSpec spec, const std::vector<int>& seqlens);
std::string format_memory_table(const ProblemSpec& spec, const std::vector<MemoryMeasurement>& rows);

}  // namespace flashlab
