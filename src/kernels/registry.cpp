// The one list of kernel variants. Adding a kernel: write its folder under
// src/kernels/, declare its variant function here and append it to the list.
#include <algorithm>

#include "flashlab/kernel_registry.h"

namespace flashlab {

KernelVariant fa1_scalar_variant();
KernelVariant fa2_mma_sm80_variant();
KernelVariant fa1_scalar_planted_bug_variant();

const std::vector<KernelVariant>& registered_kernels() {
  // "auto" picks the first kernel that supports a problem: fastest first.
  static const std::vector<KernelVariant> kernels = {
      fa2_mma_sm80_variant(),
      fa1_scalar_variant(),
  };
  return kernels;
}

const std::vector<KernelVariant>& test_only_kernels() {
  static const std::vector<KernelVariant> kernels = {
      fa1_scalar_planted_bug_variant(),
  };
  return kernels;
}

const KernelVariant* find_kernel(std::string_view name, bool include_test_only) {
  auto named = [&](const KernelVariant& kernel) { return kernel.name == name; };
  const auto& kernels = registered_kernels();
  if (auto found = std::find_if(kernels.begin(), kernels.end(), named); found != kernels.end())
    return &*found;
  if (!include_test_only) return nullptr;
  const auto& test_only = test_only_kernels();
  auto found = std::find_if(test_only.begin(), test_only.end(), named);
  return found == test_only.end() ? nullptr : &*found;
}

std::string registered_kernel_names() {
  std::string names;
  for (const auto& kernel : registered_kernels()) names += (names.empty() ? "" : ", ") + kernel.name;
  return names;
}

}  // namespace flashlab
