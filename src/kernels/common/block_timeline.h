// The block timeline, device side: when each block of a grid starts and ends
// and on which SM (KvCacheParams::block_timeline; the harness's summary is
// src/harness/block_timeline.cpp). A memory-bound grid that gives every SM
// the same bytes still ends unevenly (on the H100 some SMs stream faster than
// others); the timeline shows how long SMs sit idle before the last block ends.
// Thread 0 of a block writes. A kernel calls these only in an instantiation
// made for a timeline (splitkv_kernel's kTimeline): even never taken, a null
// check in the common path slowed a latency-bound ring by 6%.
#pragma once

#include <cstdint>

#include "common/global_timer.h"
#include "flashlab/kernel_params.h"

namespace flashlab {

// This block's slots, or nullptr (no timeline, or a block past its capacity).
__device__ __forceinline__ uint64_t* block_timeline_slots(uint64_t* timeline, int64_t capacity) {
  if (timeline == nullptr || threadIdx.x != 0) return nullptr;
  const int64_t block =
      blockIdx.x + static_cast<int64_t>(gridDim.x) * (blockIdx.y + static_cast<int64_t>(gridDim.y) * blockIdx.z);
  return block < capacity ? timeline + block * kBlockTimelineSlots : nullptr;
}

__device__ __forceinline__ void record_block_start(uint64_t* timeline, int64_t capacity) {
  uint64_t* slots = block_timeline_slots(timeline, capacity);
  if (slots == nullptr) return;
  slots[0] = global_timer_ns();
  slots[2] = sm_id();
}

__device__ __forceinline__ void record_block_end(uint64_t* timeline, int64_t capacity) {
  uint64_t* slots = block_timeline_slots(timeline, capacity);
  if (slots != nullptr) slots[1] = global_timer_ns();
}

}  // namespace flashlab
