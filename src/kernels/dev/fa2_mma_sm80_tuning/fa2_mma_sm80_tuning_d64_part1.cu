// fa2_mma_sm80 tuning configurations, head_dim 64 (part 1 of 2): explicit
// instantiations (fp16 and bf16) of the FlashAttention-2 forward kernel
// template (fa2_mma_sm80_kernel.cuh) for these tilings, defined in
// fa2_mma_sm80_tuning.h:
//   D64_Q128_K64_W4_S2_QRegs
//   D64_Q128_K64_W4_S2
//   D64_Q128_K128_W4_S2_QRegs
// Tuning only (flashlab-bench --sweep); three configurations per file keep
// each file's compile time near half a minute.
#include "dev/fa2_mma_sm80_tuning/fa2_mma_sm80_tuning.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_kernel.cuh"

namespace flashlab::fa2_mma_sm80 {

template void launch<tuning::D64_Q128_K64_W4_S2_QRegs>(const AttentionParams& params);
template void launch<tuning::D64_Q128_K64_W4_S2>(const AttentionParams& params);
template void launch<tuning::D64_Q128_K128_W4_S2_QRegs>(const AttentionParams& params);

}  // namespace flashlab::fa2_mma_sm80
