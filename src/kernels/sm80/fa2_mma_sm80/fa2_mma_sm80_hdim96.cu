// fa2_mma_sm80, head_dim 96: the FlashAttention-2 forward on tensor cores
// (mma.sync m16n8k16), one instantiation (fp16 and bf16) of the shared kernel
// template with this head dim's default tiling, DefaultTraits<96> in
// fa2_mma_sm80_kernel.cuh. Kept in its own file so each compiles quickly.
#include "fa2_mma_sm80_kernel.cuh"

namespace flashlab::fa2_mma_sm80 {

template <>
void run_head_dim<96>(const AttentionParams& params) {
  launch_for_dtype<DefaultTraits<96>::type>(params);
}

}  // namespace flashlab::fa2_mma_sm80
