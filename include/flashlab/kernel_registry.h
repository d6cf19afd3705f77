// The list of kernel variants. A kernel file defines one function returning its
// KernelVariant; src/kernels/registry.cpp lists those functions. The harness,
// the tests and the benchmark iterate over registered_kernels() and never name
// a kernel themselves.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "flashlab/kernel_params.h"

namespace flashlab {

struct TileShape {
  int block_q = 0;  // query rows per thread block
  int block_k = 0;  // key rows per inner-loop step
};

struct KernelVariant {
  std::string name;
  std::string summary;  // one line: algorithm and limits
  int min_compute_capability = 0;  // 80 means sm_80 or newer
  bool supports_tile_trace = false;

  // Empty string when the kernel can run the problem, else a sentence naming
  // what was given and what the kernel accepts. Must not touch the device.
  std::string (*unsupported_reason)(const AttentionParams& params) = nullptr;
  TileShape (*tile_shape)(const AttentionParams& params) = nullptr;
  // Enqueues the kernel on params.stream. Checks its own launch error.
  void (*launch)(const AttentionParams& params) = nullptr;
};

const std::vector<KernelVariant>& registered_kernels();
// Kernels with planted bugs that exist to prove the debugging tools work. Never
// iterated by the tests' kernel matrix or the benchmark, never picked by "auto".
const std::vector<KernelVariant>& test_only_kernels();
// Tile configurations for the benchmark's --sweep; never in the tests' matrix or "auto".
const std::vector<KernelVariant>& tuning_kernels();
// nullptr when no kernel has that name; test-only and tuning kernels only when asked for.
const KernelVariant* find_kernel(std::string_view name, bool include_test_only = false);
std::string registered_kernel_names();  // "fa1_scalar, fa2_mma_sm80"

}  // namespace flashlab
