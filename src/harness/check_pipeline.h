// Internal to the harness: the one check pipeline. check_kernel (the forward),
// check_backward and check_kvcache are the same steps in the same order; a
// mode fills each in (problem.cpp, backward_check.cpp, kvcache_check.cpp):
//   1. device   a usable GPU (else an error naming the check), the current
//               CUDA device, made current for the whole check: the inputs,
//               the kernel's launches and the syncs all use it;
//   2. inputs   the spec's tensors from its seed, on that device;
//   3. kernel   the spec's kernel for those inputs, at its own head dims (the
//               lower-level run_*_kernel entries; no padding);
//   4. run      outputs poisoned with NaN (an element the kernel does not
//               write fails), the kernel's launch(es), then a sync;
//   5. reference  float32 (float64 for fp32) and same-precision math on the
//               same inputs;
//   6. compare  tolerances, element by element, the first bad element's
//               place (batch, head, row, column, tile), NaN/inf traced to
//               their inputs: the mode's Result;
//   7. time     with options.timed_launches > 0, medians of that many
//               launches (CUDA events);
//   8. extras   what only the mode records (the KV cache's block timeline).
// A mode is a struct with the types Spec, Options, Inputs, Run, Reference and
// Result, the name kCheck, and static functions inputs, kernel, run,
// reference, compare, time and extras. A new mode is a new struct, not a copy
// of these steps.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "flashlab/cuda_check.h"
#include "flashlab/harness/problem.h"
#include "flashlab/kernel_registry.h"

namespace flashlab::harness_detail {

// Step 1: the device a check (named `check` in the error) runs on.
inline at::Device check_device(const char* check) {
  const std::string unavailable = cuda_unavailable_reason();
  TORCH_CHECK(unavailable.empty(), check, " needs a GPU: ", unavailable);
  return current_cuda_device();
}

template <class Mode>
typename Mode::Result run_check(const typename Mode::Spec& spec, const typename Mode::Options& options) {
  const at::Device device = check_device(Mode::kCheck);
  const c10::cuda::CUDAGuard device_guard(device);
  const typename Mode::Inputs inputs = Mode::inputs(spec, device);
  const KernelVariant& kernel = Mode::kernel(spec, inputs);
  const typename Mode::Run run = Mode::run(kernel, spec, inputs, options);
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device.index()).stream()));
  const typename Mode::Reference reference = Mode::reference(spec, inputs, run);
  typename Mode::Result result = Mode::compare(kernel, spec, inputs, run, reference, options);
  if (options.timed_launches > 0) Mode::time(result, kernel, spec, inputs, run, options);
  Mode::extras(result, kernel, spec, inputs, run, options);
  return result;
}

}  // namespace flashlab::harness_detail
