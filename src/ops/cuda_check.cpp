#include "flashlab/cuda_check.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string_view>

namespace flashlab {

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line,
                      const std::string& context) {
  std::ostringstream message;
  message << "CUDA error " << cudaGetErrorName(status) << " (" << cudaGetErrorString(status)
          << ") from " << expression << " at " << file << ":" << line;
  if (!context.empty()) message << " [" << context << "]";
  throw std::runtime_error(message.str());
}

bool synchronous_launch_checks() {
  static const bool enabled = [] {
    const char* value = std::getenv("FLASHLAB_SYNC_LAUNCH");
    return value != nullptr && std::string_view(value) != "" && std::string_view(value) != "0";
  }();
  return enabled;
}

void check_kernel_launch(const char* kernel_name, const AttentionParams& params, const char* file,
                         int line) {
  auto context = [&] { return std::string("kernel ") + kernel_name + ", " + describe_problem(params); };
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw_cuda_error(status, "kernel launch", file, line, context());
  if (synchronous_launch_checks()) {
    status = cudaDeviceSynchronize();
    if (status != cudaSuccess)
      throw_cuda_error(status, "kernel execution (FLASHLAB_SYNC_LAUNCH=1)", file, line, context());
  }
}

void allow_dynamic_shared_memory(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> set_bytes;  // (kernel, device) -> bytes
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = set_bytes.find({kernel, device});
  if (found != set_bytes.end() && found->second == bytes) return;
  FLASHLAB_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  set_bytes[{kernel, device}] = bytes;
}

}  // namespace flashlab
