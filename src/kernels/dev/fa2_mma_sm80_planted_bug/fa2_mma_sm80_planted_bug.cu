// fa2_mma_sm80_planted_bug: TEST-ONLY. fa2_mma_sm80 (the tensor-core forward)
// with a planted bug: on key tile 1 the rescale is skipped, so the row's l and
// its O accumulator keep the old max's scale while m moves on (the factor
// exp(m_old - m_new) is taken as 1). m stays right; l goes wrong from key tile
// 1 on, for every row whose max grows there, so `flashlab-run --trace-tiles`
// names key tile 1 and statistic l (O is wrong too, but the trace records m and
// l only). Head dim 64 only (its default tiling: block_q 128, block_k 128), fp16
// and bf16, traced and untraced: four instantiations. Listed in
// test_only_kernels(), never in registered_kernels().
#include <string>

#include "flashlab/kernel_registry.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_kernel.cuh"

namespace flashlab {
namespace {

namespace fa2 = fa2_mma_sm80;
using PlantedTraits = fa2::DefaultTraits<64>::type;
constexpr int kPlantedTile = 1;  // tests/gpu/test_tile_trace.cpp expects this tile

std::string planted_unsupported_reason(const AttentionParams& params) {
  if (params.head_dim != PlantedTraits::kHeadDim)
    return "fa2_mma_sm80_planted_bug is built for head_dim 64 only; got head_dim " +
           std::to_string(params.head_dim);
  return fa2::unsupported_reason(params);
}

TileShape planted_tile_shape(const AttentionParams&) {
  return {PlantedTraits::kBlockQ, PlantedTraits::kBlockK};
}

void planted_launch(const AttentionParams& params) {
  FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] {
    fa2::launch_forward<PlantedTraits, Element, kPlantedTile>(params);
  });
}

}  // namespace

KernelVariant fa2_mma_sm80_planted_bug_variant() {
  KernelVariant variant;
  variant.name = "fa2_mma_sm80_planted_bug";
  variant.summary =
      "TEST-ONLY fa2_mma_sm80 (head_dim 64) with the rescale of l and O skipped on key tile 1";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = true;
  variant.key_tiles_descending = false;
  variant.unsupported_reason = planted_unsupported_reason;
  variant.tile_shape = planted_tile_shape;
  variant.launch = planted_launch;
  return variant;
}

}  // namespace flashlab
