// fa3_wgmma_sm90 for head_dim 64 (both 16-bit dtypes). One head dim per file
// keeps each nvcc job small.
#include "fa3_wgmma_sm90_kernel.cuh"

namespace flashlab::fa3_wgmma_sm90 {
template <>
void run_head_dim<64>(const AttentionParams& params) {
  launch_for_dtype<DefaultTraits<64>::type>(params);
}
}  // namespace flashlab::fa3_wgmma_sm90
