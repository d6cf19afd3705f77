// flashlab-info: what this GPU is, what it can do, what it measures, and which
// registered kernels can run on it.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"
#include "flashlab/kernel_registry.h"
#include "flashlab/harness/problem.h"

namespace {

std::string version_text(int version) {  // 13000 -> "13.0"
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

// Device-to-device copy of 1 GiB, counting bytes read plus bytes written.
double measure_copy_bandwidth_gbs() {
  const size_t bytes = size_t(1) << 30;
  void *source = nullptr, *target = nullptr;
  FLASHLAB_CUDA_CHECK(cudaMalloc(&source, bytes));
  FLASHLAB_CUDA_CHECK(cudaMalloc(&target, bytes));
  FLASHLAB_CUDA_CHECK(cudaMemset(source, 1, bytes));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  flashlab::EventTimer timer;
  const float ms = timer.median_ms(
      [&] { FLASHLAB_CUDA_CHECK(cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, stream)); },
      10, /*warmups=*/2);
  FLASHLAB_CUDA_CHECK(cudaFree(source));
  FLASHLAB_CUDA_CHECK(cudaFree(target));
  return 2.0 * bytes / (ms * 1e-3) / 1e9;
}

const char* yes_no(bool value) { return value ? "yes" : "no"; }

}  // namespace

int main() {
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("torch %s, CUDA runtime %s, driver supports CUDA %s\n", TORCH_VERSION,
              version_text(runtime).c_str(), driver ? version_text(driver).c_str() : "none");
  const std::string unavailable = flashlab::cuda_unavailable_reason();
  if (!unavailable.empty()) {
    std::fprintf(stderr, "flashlab-info: %s\n", unavailable.c_str());
    return 3;
  }
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  FLASHLAB_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
  const int capability = properties.major * 10 + properties.minor;
  std::printf("GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", device, properties.name,
              properties.major, properties.minor, properties.multiProcessorCount,
              properties.totalGlobalMem / double(1 << 30));
  std::printf("shared memory per block: %zu KB by default, %zu KB opt-in (cudaFuncSetAttribute); per SM %zu KB\n",
              properties.sharedMemPerBlock / 1024, properties.sharedMemPerBlockOptin / 1024,
              properties.sharedMemPerMultiprocessor / 1024);
  std::printf("L2 cache: %.1f MB; registers per SM: %d\n", properties.l2CacheSize / 1e6,
              properties.regsPerMultiprocessor);
  std::printf("TMA (bulk tensor copies): %s; wgmma / setmaxnreg (sm_90a builds): %s; FP8 tensor cores: %s\n",
              yes_no(capability >= 90), yes_no(capability == 90), yes_no(capability >= 89));
  std::printf("measured device-to-device copy: %.0f GB/s (read + write, 1 GiB, median of 10)\n",
              measure_copy_bandwidth_gbs());
  std::printf("registered kernels on this GPU (compute capability %s):\n",
              flashlab::compute_capability_text(capability).c_str());
  for (const auto& kernel : flashlab::registered_kernels()) {
    const bool runs = kernel.architectures.runs_on(capability);
    std::printf("  %-16s %s  %s\n", kernel.name.c_str(), runs ? "runs" : "no  ", kernel.summary.c_str());
    std::printf("  %-16s       runs on %s\n", "", kernel.architectures.description);
  }
  return 0;
}
