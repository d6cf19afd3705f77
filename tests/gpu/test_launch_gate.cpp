// LaunchGate and EventTimer (the benchmark's timing): work behind a closed
// gate waits for open() and at least the gate's minimum hold; a gate nobody
// opens lets the stream through after its timeout and says so; with the gate,
// a host that stalls while enqueueing a timed call no longer stretches the
// timed window.
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"
#include "test_support.h"

namespace flashlab {
namespace {

cudaStream_t current_stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

TEST(LaunchGate, HoldsTheStreamUntilOpened) {
  FLASHLAB_REQUIRE_GPU();
  LaunchGate gate;
  cudaEvent_t passed;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&passed));
  gate.close(current_stream());
  FLASHLAB_CUDA_CHECK(cudaEventRecord(passed, current_stream()));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(cudaEventQuery(passed), cudaErrorNotReady) << "the stream went past a closed gate";
  gate.open();
  FLASHLAB_CUDA_CHECK(cudaEventSynchronize(passed));
  EXPECT_FALSE(gate.expired());
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(passed));
}

TEST(LaunchGate, HoldsTheStreamForItsMinimumEvenWhenOpenedAtOnce) {
  FLASHLAB_REQUIRE_GPU();
  LaunchGate gate;
  cudaEvent_t before, after;
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&before));
  FLASHLAB_CUDA_CHECK(cudaEventCreate(&after));
  FLASHLAB_CUDA_CHECK(cudaEventRecord(before, current_stream()));
  gate.close(current_stream());
  gate.open();
  FLASHLAB_CUDA_CHECK(cudaEventRecord(after, current_stream()));
  FLASHLAB_CUDA_CHECK(cudaEventSynchronize(after));
  float held_ms = 0;
  FLASHLAB_CUDA_CHECK(cudaEventElapsedTime(&held_ms, before, after));
  EXPECT_GE(held_ms, 0.95f * LaunchGate::kMinHoldNs * 1e-6f) << "an open gate let the stream through at once";
  EXPECT_FALSE(gate.expired());
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(before));
  FLASHLAB_CUDA_CHECK(cudaEventDestroy(after));
}

TEST(LaunchGate, LetsTheStreamThroughAfterItsTimeoutAndSaysSo) {
  FLASHLAB_REQUIRE_GPU();
  LaunchGate gate;
  const auto start = std::chrono::steady_clock::now();
  gate.close(current_stream());
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(gate.expired());
  EXPECT_GE(waited_s, 0.9 * LaunchGate::kTimeoutNs * 1e-9);
  // The next hold, opened, reports no expiry.
  gate.close(current_stream());
  gate.open();
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  EXPECT_FALSE(gate.expired());
}

TEST(EventTimer, WithTheGateAHostStallWhileEnqueueingStaysOutOfTheWindow) {
  FLASHLAB_REQUIRE_GPU();
  void* buffer = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMalloc(&buffer, 4096));
  // The host stalls 30 ms between the start event and its one small copy.
  const auto stalled_call = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(buffer, 0, 4096, current_stream()));
  };
  EventTimer timer;
  LaunchGate gate;
  const float ungated_ms = timer.time_ms(stalled_call);
  const float gated_ms = timer.time_ms(stalled_call, &gate);
  EXPECT_GE(ungated_ms, 25.f) << "without the gate the window holds the stall";
  EXPECT_LT(gated_ms, 5.f) << "with the gate it should hold the copy alone";
  EXPECT_FALSE(gate.expired());
  FLASHLAB_CUDA_CHECK(cudaFree(buffer));
}

}  // namespace
}  // namespace flashlab
