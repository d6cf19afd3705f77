// fa1_scalar_planted_bug: TEST-ONLY. fa1_scalar with the classic FlashAttention
// bug planted (the running max stored at the wrong row's index), so the tests
// and `flashlab-run --trace-tiles` can show the tile-state diff finding it.
// Listed in test_only_kernels(), never in registered_kernels().
#include "sm80/fa1_scalar/fa1_scalar_kernel.cuh"
#include "sm80/fa1_scalar/fa1_scalar_locate.h"

namespace flashlab {

KernelVariant fa1_scalar_planted_bug_variant() {
  KernelVariant variant;
  variant.name = "fa1_scalar_planted_bug";
  variant.summary = "TEST-ONLY fa1_scalar with a wrong index when the running max is stored";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = true;
  variant.unsupported_reason = fa1_scalar::unsupported_reason;
  variant.tile_shape = fa1_scalar::tile_shape;
  variant.launch = fa1_scalar::launch</*kPlantedRowMaxBug=*/true>;
  variant.locate = fa1_scalar::locate;  // the same layout
  return variant;
}

}  // namespace flashlab
