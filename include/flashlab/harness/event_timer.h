// CUDA-event timing on the current torch stream: the one timer that
// flashlab-run, flashlab-bench and flashlab-info share.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace flashlab {

class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Device time of what `call` enqueues, in milliseconds (waits for it).
  float time_ms(const std::function<void()>& call);
  // Median of `repeats` timed calls after `warmups` untimed ones.
  float median_ms(const std::function<void()>& call, int repeats, int warmups = 3);

 private:
  cudaEvent_t start_{}, stop_{};
};

float median(std::vector<float> values);

}  // namespace flashlab
