// LaunchGate (event_timer.h): a one-block kernel holds the stream until the
// host opens a flag in mapped pinned memory and a minimum hold has passed, or
// until a timeout.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/global_timer.h"
#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"

namespace flashlab {
namespace {

// Spins (sleeping between polls) until *open is set and min_hold_ns have
// passed, or for timeout_ns; then says in *expired whether it gave up.
__global__ void hold_until_open(const volatile int* open, int* expired, uint64_t min_hold_ns, uint64_t timeout_ns) {
  const uint64_t start = global_timer_ns();
  while (*open == 0 || global_timer_ns() - start < min_hold_ns) {
    if (global_timer_ns() - start > timeout_ns) {
      *expired = 1;
      return;
    }
    __nanosleep(500);
  }
  *expired = 0;
}

}  // namespace

LaunchGate::LaunchGate() {
  FLASHLAB_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flags_), 2 * sizeof(int), cudaHostAllocMapped));
  flags_[0] = 1, flags_[1] = 0;  // open, not expired
  FLASHLAB_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_flags_), flags_, 0));
}

LaunchGate::~LaunchGate() { cudaFreeHost(flags_); }

void LaunchGate::close(cudaStream_t stream) {
  reinterpret_cast<volatile int*>(flags_)[0] = 0;
  hold_until_open<<<1, 1, 0, stream>>>(device_flags_, device_flags_ + 1, kMinHoldNs, kTimeoutNs);
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
}

void LaunchGate::open() { reinterpret_cast<volatile int*>(flags_)[0] = 1; }

bool LaunchGate::expired() const { return reinterpret_cast<const volatile int*>(flags_)[1] != 0; }

}  // namespace flashlab
