// The developer kernels: test-only kernels with planted bugs and the tuning
// configurations of registered kernels. Linked by the tools and tests only.
#include <vector>

#include "flashlab/kernel_registry.h"

namespace flashlab {

KernelVariant fa1_scalar_planted_bug_variant();
std::vector<KernelVariant> fa2_mma_sm80_tuning_variants();

const std::vector<KernelVariant>& test_only_kernels() {
  static const std::vector<KernelVariant> kernels = {
      fa1_scalar_planted_bug_variant(),
  };
  return kernels;
}

const std::vector<KernelVariant>& tuning_kernels() {
  // Alternative tilings of registered kernels, for flashlab-bench --sweep.
  static const std::vector<KernelVariant> kernels = fa2_mma_sm80_tuning_variants();
  return kernels;
}

}  // namespace flashlab
