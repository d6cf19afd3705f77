// One macro for every CUDA runtime call, one for every kernel launch.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "flashlab/kernel_params.h"

namespace flashlab {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file,
                                   int line, const std::string& context = {});

// True when FLASHLAB_SYNC_LAUNCH=1 is set: every launch then synchronizes and
// reports its own error, the harness's answer to CUDA_LAUNCH_BLOCKING=1.
bool synchronous_launch_checks();

// Called right after a launch: checks the launch error and, when synchronous
// checks are on, waits for the kernel and checks its execution error too.
// The problem is described only when there is an error to report.
void check_kernel_launch(const char* kernel_name, const AttentionParams& params, const char* file,
                         int line);

// Lets `kernel` launch with `bytes` of dynamic shared memory on the current
// device (above 48 KB a kernel must opt in: cudaFuncSetAttribute). The
// attribute is set only when it differs from the last value set for that
// kernel and device: a call costs about 2 us of host time on the H100 machine.
void allow_dynamic_shared_memory(const void* kernel, int bytes);

// Launches `kernel` as a programmatic dependent of the kernel before it on
// `stream` when `programmatic` (sm_90 and newer): it may start once every block
// of that kernel has called griddepcontrol.launch_dependents (or exited), and
// it calls griddepcontrol.wait before it reads that kernel's results, so its
// launch and its work before the wait overlap that kernel's tail. Otherwise
// (or before sm_90, where the attribute must stay off) a plain launch; the
// kernel's wait is then a no-op. Errors as a <<<>>> launch's: left for
// FLASHLAB_CHECK_LAUNCH after it (cudaGetLastError), which names the kernel.
template <typename... Parameters, typename... Arguments>
void launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                   bool programmatic, Arguments&&... arguments);

}  // namespace flashlab

#define FLASHLAB_CUDA_CHECK(expr)                                                     \
  do {                                                                                \
    cudaError_t flashlab_status_ = (expr);                                            \
    if (flashlab_status_ != cudaSuccess)                                              \
      ::flashlab::throw_cuda_error(flashlab_status_, #expr, __FILE__, __LINE__);      \
  } while (0)

#define FLASHLAB_CHECK_LAUNCH(kernel_name, params) \
  ::flashlab::check_kernel_launch(kernel_name, params, __FILE__, __LINE__)

template <typename... Parameters, typename... Arguments>
void flashlab::launch_kernel(void (*kernel)(Parameters...), dim3 grid, dim3 block, size_t shared_bytes,
                             cudaStream_t stream, bool programmatic, Arguments&&... arguments) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = programmatic ? 1 : 0;
  static_cast<void>(cudaLaunchKernelEx(&config, kernel, static_cast<Arguments&&>(arguments)...));
}
