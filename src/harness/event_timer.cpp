#include "flashlab/harness/event_timer.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "flashlab/cuda_check.h"

namespace flashlab {

L2Flush::L2Flush() {
  int device = 0, l2_bytes = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  const int64_t bytes = std::max<int64_t>(int64_t(256) << 20, int64_t(4) * l2_bytes);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device);
  buffer_ = at::zeros({bytes / 4}, options);
  sum_ = at::empty({}, options);
}

void L2Flush::operator()() { at::sum_out(sum_, buffer_); }

EventTimer::EventTimer() {
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&start_));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&stop_));
}

EventTimer::~EventTimer() {
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
}

float EventTimer::time_ms(const std::function<void()>& call, LaunchGate* gate) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (gate != nullptr) gate->close(stream);
  FLASHLAB_CUDA_CHECK(cudaEventRecord(start_, stream));
  call();
  FLASHLAB_CUDA_CHECK(cudaEventRecord(stop_, stream));
  if (gate != nullptr) gate->open();
  FLASHLAB_CUDA_CHECK(cudaEventSynchronize(stop_));
  float ms = 0;
  FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
  return ms;
}

float EventTimer::median_ms(const std::function<void()>& call, int repeats, int warmups) {
  for (int warmup = 0; warmup < warmups; ++warmup) call();
  std::vector<float> times;
  for (int repeat = 0; repeat < repeats; ++repeat) times.push_back(time_ms(call));
  return median(times);
}

float median(std::vector<float> values) {
  if (values.empty()) return 0;
  std::nth_element(values.begin(), values.begin() + values.size() / 2, values.end());
  return values[values.size() / 2];
}

}  // namespace flashlab
