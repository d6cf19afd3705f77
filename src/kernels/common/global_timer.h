// The device's clocks, as kernels and the harness's device code read them:
// %globaltimer (nanoseconds, one clock for every SM) and the SM a thread runs on.
#pragma once

#include <cstdint>

namespace flashlab {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  return sm;
}

}  // namespace flashlab
