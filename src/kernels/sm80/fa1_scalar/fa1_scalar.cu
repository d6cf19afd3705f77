// fa1_scalar: FlashAttention-1 forward, one thread per query row, float32 scalar
// math, 64x32 tiles; softcap, ALiBi and sinks in both passes. The kernel and
// its limits: fa1_scalar_kernel.cuh. Its backward (FlashAttention-2's
// algorithm in scalar code, deterministic): fa1_scalar_backward_kernel.cuh,
// hooks in fa1_scalar_backward.cu.
#include "fa1_scalar_backward_kernel.cuh"
#include "fa1_scalar_kernel.cuh"
#include "fa1_scalar_locate.h"

namespace flashlab {

TileShape fa1_scalar::launch_tiles() { return {kBlockQ, kBlockK}; }

KernelVariant fa1_scalar_variant() {
  KernelVariant variant;
  variant.name = "fa1_scalar";
  variant.summary =
      "FlashAttention-1 forward, one thread per query row, float32 scalar math, "
      "64x32 tiles, head_dim <= " + std::to_string(fa1_scalar::kMaxHeadDim) + ", fp32/fp16/bf16; "
      "backward: FlashAttention-2's, one thread per key row (dK, dV) and per query row (dQ), "
      "deterministic";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = true;
  variant.forward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.backward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.unsupported_reason = fa1_scalar::unsupported_reason;
  variant.tile_shape = fa1_scalar::tile_shape;
  variant.launch = fa1_scalar::launch</*kPlantedRowMaxBug=*/false>;
  variant.backward_unsupported_reason = fa1_scalar::backward_unsupported_reason;
  variant.backward_workspace_bytes = fa1_scalar::backward_workspace_bytes;
  variant.backward_launch = fa1_scalar::backward_launch;
  variant.backward_tile_shape = fa1_scalar::backward_tile_shape;
  variant.locate = fa1_scalar::locate;
  return variant;
}

}  // namespace flashlab
