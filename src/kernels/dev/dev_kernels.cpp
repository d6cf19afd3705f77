// The developer kernels: test-only kernels with planted bugs and the tuning
// configurations of registered kernels (flashlab/harness/dev_kernels.h).
// Adding one: a folder under src/kernels/dev/, its variant function declared
// and listed here.
#include "flashlab/harness/dev_kernels.h"

#include <algorithm>

namespace flashlab {

KernelVariant fa1_scalar_planted_bug_variant();
KernelVariant fa2_mma_sm80_planted_bug_variant();
std::vector<KernelVariant> fa2_mma_sm80_tuning_variants();
KernelVariant fa3_wgmma_sm90_static_schedule_variant();  // fa3_wgmma_sm90.cu

const std::vector<KernelVariant>& test_only_kernels() {
  static const std::vector<KernelVariant> kernels = {
      fa1_scalar_planted_bug_variant(),
      fa2_mma_sm80_planted_bug_variant(),
  };
  return kernels;
}

const std::vector<KernelVariant>& tuning_kernels() {
  static const std::vector<KernelVariant> kernels = [] {
    std::vector<KernelVariant> list = fa2_mma_sm80_tuning_variants();
    list.push_back(fa3_wgmma_sm90_static_schedule_variant());
    return list;
  }();
  return kernels;
}

const KernelVariant* find_any_kernel(std::string_view name) {
  if (const KernelVariant* registered = find_kernel(name)) return registered;
  for (const auto* list : {&test_only_kernels(), &tuning_kernels()}) {
    const auto found = std::find_if(list->begin(), list->end(),
                                    [&](const KernelVariant& kernel) { return kernel.name == name; });
    if (found != list->end()) return &*found;
  }
  return nullptr;
}

std::string dev_kernel_names() {
  std::string names;
  for (const auto* list : {&test_only_kernels(), &tuning_kernels()})
    for (const auto& kernel : *list) names += (names.empty() ? "" : ", ") + kernel.name;
  return names;
}

}  // namespace flashlab
