// The one list of kernel variants. Adding a kernel: write its folder under
// src/kernels/, declare its variant function here and append it to the list.
#include <algorithm>

#include "flashlab/kernel_registry.h"

namespace flashlab {

KernelVariant fa1_scalar_variant();
KernelVariant fa2_mma_sm80_variant();

const std::vector<KernelVariant>& registered_kernels() {
  // "auto" picks the first kernel that supports a problem: fastest first.
  static const std::vector<KernelVariant> kernels = {
      fa2_mma_sm80_variant(),
      fa1_scalar_variant(),
  };
  return kernels;
}

const KernelVariant* find_kernel(std::string_view name, bool include_test_only) {
  auto named = [&](const KernelVariant& kernel) { return kernel.name == name; };
  const auto& kernels = registered_kernels();
  if (auto found = std::find_if(kernels.begin(), kernels.end(), named); found != kernels.end())
    return &*found;
  if (!include_test_only) return nullptr;
  for (const auto* list : {&test_only_kernels(), &tuning_kernels()})
    if (auto found = std::find_if(list->begin(), list->end(), named); found != list->end())
      return &*found;
  return nullptr;
}

std::string registered_kernel_names() {
  std::string names;
  for (const auto& kernel : registered_kernels()) names += (names.empty() ? "" : ", ") + kernel.name;
  return names;
}

}  // namespace flashlab
