// Values the host never reads on the default path (cu_seqlens, cache_seqlens,
// block_table: they live on the device, and reading them would cost a sync per
// call), written once for every kernel that reads one: a value is clamped into
// what keeps the kernel in bounds, and the first one out of range is recorded
// in the launch's DeviceErrorLog (kernel_params.h), which the op library raises
// at its next call or at check_device_errors(). Users: the decode kernels
// (cache_seqlens, block_table: clamped in the split kernel, reported by the
// kernel beside it) and the offsets guard that every variable-length launch
// runs first (sm80/varlen_offsets_guard/).
#pragma once

#include "flashlab/kernel_params.h"

namespace flashlab {

// Records (code, indices, value, [low, high]) unless an earlier bad value of
// this or another launch already holds the record. record_bad_value is the
// code inline; report_bad_value the same out of line, so a kernel that checks
// in a hot loop only branches to it there.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ void record_bad_value(DeviceErrorLog* log, DeviceErrorCode code, int index0, int index1,
                                                 int value, int low, int high) {
  if (log == nullptr || atomicCAS(&log->claimed, 0, 1) != 0) return;
  log->code = static_cast<int>(code);
  log->index0 = index0;
  log->index1 = index1;
  log->value = value;
  log->low = low;
  log->high = high;
  __threadfence_system();  // the fields reach the host before `ready` does
  *reinterpret_cast<volatile int*>(&log->ready) = 1;
}
static __device__ __noinline__ void report_bad_value(DeviceErrorLog* log, DeviceErrorCode code, int index0,
                                                     int index1, int value, int low, int high) {
  record_bad_value(log, code, index0, index1, value, low, high);
}
#else
inline void record_bad_value(DeviceErrorLog*, DeviceErrorCode, int, int, int, int, int) {}
inline void report_bad_value(DeviceErrorLog*, DeviceErrorCode, int, int, int, int, int) {}
#endif

// value within [low, high] (low <= high), or the nearer end of it.
FLASHLAB_HOST_DEVICE inline int clamped_value(int value, int low, int high) {
  return value < low ? low : value > high ? high : value;
}

// As clamped_value, a value outside [low, high] reported.
FLASHLAB_HOST_DEVICE inline int guarded_value(int value, int low, int high, DeviceErrorLog* log,
                                              DeviceErrorCode code, int index0, int index1 = -1) {
  if (value >= low && value <= high) return value;
  report_bad_value(log, code, index0, index1, value, low, high);
  return value < low ? low : high;
}

}  // namespace flashlab
