// Puts every wrapper of common/wgmma_sm90_generated.h (the 16-bit m64nNk16
// and the e4m3 m64nNk32 shapes, those no kernel uses yet too) into kernels'
// PTX, which ptxas assembles: a wrong operand list in
// scripts/generate_wgmma.py fails the build of flashlab_cpu_tests here, not
// the first FP8 kernel's ("Arguments mismatch for instruction
// 'wgmma.mma_async'"). One kernel per element type and width, never launched.
// Only the sm_90a pass has wgmma; other architectures compile empty bodies.
#include <cstdint>
#include <utility>

#include "common/ptx_sm90.h"
#include "common/wgmma_sm90_generated.h"

namespace {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// One wgmma the way the kernels issue it: fence, the instruction, commit, wait.
template <class Wgmma, int kRegisters>
__device__ __forceinline__ void issue(Wgmma&& wgmma, float (&d)[kRegisters]) {
  flashlab::sm90::fence_registers(d);
  flashlab::sm90::wgmma_fence();
  wgmma();
  flashlab::sm90::wgmma_commit();
  flashlab::sm90::wgmma_wait<0>();
  flashlab::sm90::fence_registers(d);
}
#endif

// kMajors: 0 the K-major forms (ss and rs), 1 both MN-major, 2 A alone MN-major.
template <typename Element, int N, int kMajors>
__global__ void assemble_wgmma(uint64_t desc, uint32_t a_value, float* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float d[N / 2] = {};
  if constexpr (kMajors == 1) {
    issue([&] { flashlab::sm90::wgmma_ss_mn_major<N, Element>(d, desc, desc, 1); }, d);
  } else if constexpr (kMajors == 2) {
    issue([&] { flashlab::sm90::wgmma_ss_a_mn_major<N, Element>(d, desc, desc, 1); }, d);
  } else {
    const uint32_t a[4] = {a_value, a_value + 1, a_value + 2, a_value + 3};
    issue([&] { flashlab::sm90::wgmma_ss<N, Element>(d, desc, desc, 1); }, d);
    issue([&] { flashlab::sm90::wgmma_rs<N, Element>(d, a, desc, 1); }, d);
  }
  out[threadIdx.x] = d[0] + d[N / 2 - 1];
#else
  (void)desc, (void)a_value, (void)out;
#endif
}

template <typename Element, int kMajors, int... N>
void instantiate(std::integer_sequence<int, N...>) {
  (static_cast<void>(&assemble_wgmma<Element, N, kMajors>), ...);
}

}  // namespace

// Never called: taking the kernels' addresses instantiates them.
void instantiate_every_wgmma_wrapper() {
  using flashlab::sm90::WgmmaAMnMajorWidths;
  using flashlab::sm90::WgmmaMnMajorWidths;
  using flashlab::sm90::WgmmaWidths;
  instantiate<__half, 0>(WgmmaWidths{});
  instantiate<__nv_bfloat16, 0>(WgmmaWidths{});
  instantiate<__nv_fp8_e4m3, 0>(WgmmaWidths{});
  instantiate<__half, 1>(WgmmaMnMajorWidths{});
  instantiate<__nv_bfloat16, 1>(WgmmaMnMajorWidths{});
  instantiate<__half, 2>(WgmmaAMnMajorWidths{});
  instantiate<__nv_bfloat16, 2>(WgmmaAMnMajorWidths{});
}
