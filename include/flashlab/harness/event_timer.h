// CUDA-event timing on the current torch stream: the one timer that
// flashlab-run, flashlab-bench and flashlab-info share.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <functional>
#include <vector>

namespace flashlab {

// Holds a stream until the host opens it: what is enqueued behind a closed
// gate starts only once the host is done enqueueing it, so a host that falls
// behind (descheduled, slow to dispatch) cannot leave the device idle inside
// a timed window. The hold also lasts at least kMinHoldNs, so what runs
// behind it starts as long after the work before it (the benchmark's L2
// flush) whether its host is fast or slow: on the H100 a call that started
// right behind the flush, as a fast host's did, took 0.2-1 us longer than
// the same call behind a 20-300 us hold (flashlab-bench --decode, session
// 16), while torch's calls, 100 us or more of host dispatch, never started
// sooner than that. A held stream waits at most kTimeoutNs: a call that
// blocks on the device while the gate is closed (a synchronizing
// allocation, a copy to the host) is let through then, and expired() says
// so. For calls that only enqueue work (the benchmark's timed calls).
class LaunchGate {
 public:
  static constexpr unsigned long long kMinHoldNs = 50'000;       // 50 us
  static constexpr unsigned long long kTimeoutNs = 200'000'000;  // 0.2 s
  LaunchGate();
  ~LaunchGate();
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;
  void close(cudaStream_t stream);  // enqueues the hold on `stream`
  void open();
  // The last hold gave up waiting (after the stream has passed it).
  bool expired() const;

 private:
  int* flags_ = nullptr;         // mapped pinned memory: [0] open, [1] the hold expired
  int* device_flags_ = nullptr;  // the same, as the device sees it
};

// Reads a buffer 4x the L2 size (at least 256 MiB, allocated once on the
// current device) into one float on the current stream: afterwards L2 holds
// clean lines of that buffer and nothing of the next call's inputs, so a
// decode step's K/V come from DRAM, as after a model's other layers.
class L2Flush {
 public:
  L2Flush();
  void operator()();

 private:
  at::Tensor buffer_, sum_;
};

// Enqueues on `stream` one read of every 16-byte word of the device buffers a
// and b (16-byte aligned, sizes multiples of 16 bytes) by blocks_per_sm x SMs
// blocks of 256 threads with streaming loads and nothing else: what reading
// those bytes alone costs (flashlab-bench --decode's plain_read row). A
// reference, not a bound: on the H100 the decode kernel, whose copies carry a
// 256-byte L2 prefetch hint, reads up to 1.7% faster on the largest caches.
// Launch errors throw.
void enqueue_stream_read(const void* a, size_t a_bytes, const void* b, size_t b_bytes, int blocks_per_sm,
                         cudaStream_t stream);

class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Device time of what `call` enqueues, in milliseconds (waits for it). With
  // a gate, the device starts the timed window only once the start event,
  // the call's work and the stop event are all enqueued.
  float time_ms(const std::function<void()>& call, LaunchGate* gate = nullptr);
  // Median of `repeats` timed calls after `warmups` untimed ones.
  float median_ms(const std::function<void()>& call, int repeats, int warmups = 3);

 private:
  cudaEvent_t start_{}, stop_{};
};

float median(std::vector<float> values);

}  // namespace flashlab
