// fa1_scalar: FlashAttention-1 forward, one thread per query row, float32 scalar
// math, 64x32 tiles. The kernel and its limits: fa1_scalar_kernel.cuh.
#include "fa1_scalar_kernel.cuh"

namespace flashlab {

KernelVariant fa1_scalar_variant() {
  KernelVariant variant;
  variant.name = "fa1_scalar";
  variant.summary =
      "FlashAttention-1 forward, one thread per query row, float32 scalar math, "
      "64x32 tiles, head_dim <= " + std::to_string(fa1_scalar::kMaxHeadDim) + ", fp32/fp16/bf16";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = true;
  variant.unsupported_reason = fa1_scalar::unsupported_reason;
  variant.tile_shape = fa1_scalar::tile_shape;
  variant.launch = fa1_scalar::launch</*kPlantedRowMaxBug=*/false>;
  return variant;
}

}  // namespace flashlab
