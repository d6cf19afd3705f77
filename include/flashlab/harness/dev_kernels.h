// Developer kernels (library flashlab_dev_kernels, linked by the tools and tests
// only): kernels with planted bugs that prove the debugging tools work, and the
// alternative tile configurations flashlab-bench --sweep times. Never in
// registered_kernels(): not in the tests' kernel matrix, the benchmark or "auto".
// The harness runs them through run_kernel (flashlab/attention.h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "flashlab/kernel_registry.h"

namespace flashlab {

// Kernels with planted bugs (fa1_scalar_planted_bug, fa2_mma_sm80_planted_bug).
const std::vector<KernelVariant>& test_only_kernels();
// Tile configurations of registered kernels, for flashlab-bench --sweep.
const std::vector<KernelVariant>& tuning_kernels();
// Registered kernels first, then test-only, then tuning; nullptr when none has that name.
const KernelVariant* find_any_kernel(std::string_view name);
// "fa1_scalar_planted_bug, fa2_mma_sm80_d64_q128_k128_w4_s2, ..." (not the registered ones).
std::string dev_kernel_names();

}  // namespace flashlab
