// The offsets guard every variable-length launch runs first (validation.h,
// prepare_launch): cu_seqlens live on the device and are not read on the host
// by default, so before a kernel sees them one block checks them and writes
// the copy the kernel reads. Valid offsets (0 <= cu[b] <= cu[b+1] <= total,
// every length at most max_seqlen) are copied as they are; otherwise the first
// bad value found is reported (common/value_guard.h) and the copy is clamped
// into a valid prefix sum, each offset into [previous, min(total, previous +
// max_seqlen)], so whatever the tensor holds no kernel reads or writes outside
// the packed tensors or past its grid's rows. The attention kernels keep their
// code: sequence_view reads the copy.
//
// One block of 256 threads: a thread checks (and copies) the pairs b, b + 1
// of its stride; only when one is bad does thread 0 clamp the whole array in
// order (a serial pass over batch + 1 values, never on valid input).
#include <cuda_runtime.h>

#include "common/value_guard.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"

namespace flashlab {
namespace {

constexpr int kGuardThreads = 256;

struct OffsetsToGuard {
  const int* offsets = nullptr;
  int* guarded = nullptr;
  int total = 0, max_length = 0;
  DeviceErrorCode code{}, over_max{};
};

__device__ bool check_and_copy(const OffsetsToGuard& o, int batch, DeviceErrorLog* log) {
  bool bad = false;
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    const int first = o.offsets[b], end = o.offsets[b + 1];
    if (first < 0 || first > o.total) {
      report_bad_value(log, o.code, b, -1, first, 0, o.total);
      bad = true;
    } else if (end < first || end > o.total) {
      report_bad_value(log, o.code, b + 1, -1, end, first, o.total);
      bad = true;
    } else if (end - first > o.max_length) {
      report_bad_value(log, o.over_max, b, -1, end - first, 0, o.max_length);
      bad = true;
    }
    o.guarded[b] = first;
    if (b == batch - 1) o.guarded[batch] = end;
  }
  return bad;
}

__device__ void clamp_in_order(const OffsetsToGuard& o, int batch) {
  int previous = min(max(o.offsets[0], 0), o.total);
  o.guarded[0] = previous;
  for (int b = 1; b <= batch; ++b) {
    const int high = min(o.total, previous + o.max_length);
    previous = min(max(o.offsets[b], previous), high);
    o.guarded[b] = previous;
  }
}

__global__ void __launch_bounds__(kGuardThreads)
    varlen_offsets_guard_kernel(OffsetsToGuard q, OffsetsToGuard k, int batch, DeviceErrorLog* log) {
  const bool bad_q = check_and_copy(q, batch, log);
  const bool bad_k = check_and_copy(k, batch, log);
  const int any_q = __syncthreads_or(bad_q);
  const int any_k = __syncthreads_or(bad_k);
  if (threadIdx.x != 0) return;
  if (any_q) clamp_in_order(q, batch);
  if (any_k) clamp_in_order(k, batch);
}

}  // namespace

namespace detail {
void launch_varlen_offsets_guard(AttentionParams& params, int* guarded) {
  const auto clamp_total = [](int64_t rows) { return rows < 0x7fffffff ? static_cast<int>(rows) : 0x7fffffff; };
  OffsetsToGuard q{params.cu_seqlens_q, guarded, clamp_total(params.total_rows_q), params.seqlen_q,
                   DeviceErrorCode::cu_seqlens_q, DeviceErrorCode::seqlen_q_over_max};
  OffsetsToGuard k{params.cu_seqlens_k, guarded + params.batch + 1, clamp_total(params.total_rows_k),
                   params.seqlen_k, DeviceErrorCode::cu_seqlens_k, DeviceErrorCode::seqlen_k_over_max};
  varlen_offsets_guard_kernel<<<1, kGuardThreads, 0, static_cast<cudaStream_t>(params.stream)>>>(
      q, k, params.batch, params.error_log);
  FLASHLAB_CHECK_LAUNCH("varlen offsets guard", params);
  params.cu_seqlens_q = q.guarded;
  params.cu_seqlens_k = k.guarded;
}
}  // namespace detail

}  // namespace flashlab
