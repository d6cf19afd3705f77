// fa2_mma_sm80 tuning configurations, head_dim 128 (part 1 of 2): explicit
// instantiations (fp16 and bf16) of the FlashAttention-2 forward kernel
// template (fa2_mma_sm80_kernel.cuh) for these tilings, defined in
// fa2_mma_sm80_tuning.h:
//   D128_Q128_K32_W4_S2_QRegs
//   D128_Q128_K32_W4_S3_QRegs
//   D128_Q128_K32_W4_S2
// Tuning only (flashlab-bench --sweep); three configurations per file keep
// each file's compile time near half a minute.
#include "dev/fa2_mma_sm80_tuning/fa2_mma_sm80_tuning.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_kernel.cuh"

namespace flashlab::fa2_mma_sm80 {

template void launch<tuning::D128_Q128_K32_W4_S2_QRegs>(const AttentionParams& params);
template void launch<tuning::D128_Q128_K32_W4_S3_QRegs>(const AttentionParams& params);
template void launch<tuning::D128_Q128_K32_W4_S2>(const AttentionParams& params);

}  // namespace flashlab::fa2_mma_sm80
