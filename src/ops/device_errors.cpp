// Values that live on the device, checked without a sync (attention.h,
// "Values on the device"): one DeviceErrorLog per device in host-mapped pinned
// memory, which kernels write when they meet a bad value (common/value_guard.h)
// and the host reads at the next launch on that device, or in
// check_device_errors after a sync; and the strict mode's switch.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "validation.h"

namespace flashlab {
namespace {

constexpr int kMaxDevices = 64;

// Host and device addresses of one device's log (the same under UVA).
struct MappedLog {
  DeviceErrorLog* host = nullptr;
  DeviceErrorLog* device = nullptr;
};
std::array<std::atomic<MappedLog*>, kMaxDevices> logs{};
std::mutex logs_mutex;

MappedLog* make_log() {
  // A capture in progress (global mode) forbids allocations: this one is not
  // part of the captured work, so it is made in relaxed mode.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FLASHLAB_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* host = nullptr;
  const cudaError_t status =
      cudaHostAlloc(&host, sizeof(DeviceErrorLog), cudaHostAllocMapped | cudaHostAllocPortable);
  FLASHLAB_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  FLASHLAB_CUDA_CHECK(status);
  std::memset(host, 0, sizeof(DeviceErrorLog));
  void* device = nullptr;
  FLASHLAB_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
  return new MappedLog{static_cast<DeviceErrorLog*>(host), static_cast<DeviceErrorLog*>(device)};
}

MappedLog* log_of(int device, bool create) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "flashlab keeps device error logs for devices 0 to ",
              kMaxDevices - 1, "; got device ", device);
  MappedLog* log = logs[device].load(std::memory_order_acquire);
  if (log != nullptr || !create) return log;
  const std::lock_guard<std::mutex> lock(logs_mutex);
  log = logs[device].load(std::memory_order_relaxed);
  if (log == nullptr) {
    log = make_log();  // kept for the process's life: kernels in flight may write it
    logs[device].store(log, std::memory_order_release);
  }
  return log;
}

// The sentence for one record.
std::string describe(const DeviceErrorLog& record) {
  const std::string value = std::to_string(record.value);
  const std::string range = "[" + std::to_string(record.low) + ", " + std::to_string(record.high) + "]";
  switch (static_cast<DeviceErrorCode>(record.code)) {
    case DeviceErrorCode::cu_seqlens_q:
    case DeviceErrorCode::cu_seqlens_k: {
      const char* name = record.code == static_cast<int>(DeviceErrorCode::cu_seqlens_q) ? "cu_seqlens_q"
                                                                                        : "cu_seqlens_k";
      return std::string(name) + "[" + std::to_string(record.index0) + "] = " + value + " is outside " + range +
             " (offsets must be non-decreasing, from 0 to the number of packed rows)";
    }
    case DeviceErrorCode::seqlen_q_over_max:
    case DeviceErrorCode::seqlen_k_over_max: {
      const bool q = record.code == static_cast<int>(DeviceErrorCode::seqlen_q_over_max);
      return std::string("sequence ") + std::to_string(record.index0) + " has " + value + (q ? " query" : " key") +
             " rows (" + (q ? "cu_seqlens_q" : "cu_seqlens_k") + "[" + std::to_string(record.index0 + 1) +
             "] - [" + std::to_string(record.index0) + "]), more than " + (q ? "max_seqlen_q" : "max_seqlen_k") +
             " = " + std::to_string(record.high);
    }
    case DeviceErrorCode::cache_seqlens:
    case DeviceErrorCode::cache_seqlens_paged: {
      const int capacity = record.index1, appended = record.index1 - record.high;
      return "cache_seqlens[" + std::to_string(record.index0) + "] = " + value + " is outside " + range +
             ": the sequence's cache holds " + std::to_string(capacity) + " rows" +
             (record.code == static_cast<int>(DeviceErrorCode::cache_seqlens_paged)
                  ? " (block_table's width x page_size)"
                  : "") +
             (appended > 0 ? " and this call appends " + std::to_string(appended) : std::string());
    }
    case DeviceErrorCode::block_table:
      return "block_table[" + std::to_string(record.index0) + "][" + std::to_string(record.index1) + "] = " + value +
             " is not a page of the cache (0 to " + std::to_string(record.high) + ")";
    case DeviceErrorCode::none: break;
  }
  return "an unknown device error (code " + std::to_string(record.code) + ")";
}

// Raises (and clears) the record of `device` when a kernel completed one.
void raise_recorded(int device, const char* when) {
  MappedLog* log = log_of(device, /*create=*/false);
  if (log == nullptr) return;
  volatile DeviceErrorLog* record = log->host;
  if (record->ready == 0) return;
  DeviceErrorLog copy;
  copy.code = record->code;
  copy.index0 = record->index0;
  copy.index1 = record->index1;
  copy.value = record->value;
  copy.low = record->low;
  copy.high = record->high;
  record->ready = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  record->claimed = 0;
  // Only strings in the message: an int streamed into it crashed in the Python
  // extension on the H100 machine (torch 2.11; session 19, call 3, cuda-gdb).
  TORCH_CHECK(false, "flashlab: ", when, " on cuda:", std::to_string(device), " met a bad value on the device: ",
              describe(copy),
              ". The kernel kept in bounds by clamping it, so that call's output is not the attention that was "
              "asked for. (Values on the device are checked before the launch only in strict mode: "
              "FLASHLAB_STRICT_CHECKS=1, set_strict_checks(true) or options.strict_checks.)");
}

std::atomic<int> strict_setting{-1};  // -1: not read from the environment yet

}  // namespace

void set_strict_checks(bool on) { strict_setting.store(on ? 1 : 0); }

bool strict_checks() {
  int setting = strict_setting.load();
  if (setting < 0) {
    const char* value = std::getenv("FLASHLAB_STRICT_CHECKS");
    setting = value != nullptr && std::string_view(value) != "" && std::string_view(value) != "0" ? 1 : 0;
    int expected = -1;
    if (!strict_setting.compare_exchange_strong(expected, setting)) setting = expected;
  }
  return setting == 1;
}

void check_device_errors(std::optional<int> device) {
  if (device) {
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(*device));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    raise_recorded(*device, "a call");
    return;
  }
  for (int index = 0; index < kMaxDevices; ++index) {
    if (log_of(index, /*create=*/false) == nullptr) continue;
    const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    raise_recorded(index, "a call");
  }
}

namespace detail {

bool host_value_checks(const std::optional<bool>& option, const at::Tensor& like) {
  if (!option.value_or(strict_checks())) return false;
  // A capture records work for later replays: values read now say nothing of
  // theirs (and reading them would break the capture). The kernels check them.
  if (like.is_cuda()) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const auto stream = c10::cuda::getCurrentCUDAStream(like.get_device()).stream();
    FLASHLAB_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
    if (status != cudaStreamCaptureStatusNone) return false;
  }
  return true;
}

DeviceErrorLog* device_error_log_for_launch() {
  const int device = c10::cuda::current_device();
  raise_recorded(device, "an earlier call");
  return log_of(device, /*create=*/true)->device;
}

}  // namespace detail
}  // namespace flashlab
