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

template <typename Element, int N, bool kMnMajor>
__global__ void assemble_wgmma(uint64_t desc, uint32_t a_value, float* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  float d[N / 2] = {};
  if constexpr (kMnMajor) {
    issue([&] { flashlab::sm90::wgmma_ss_mn_major<N, Element>(d, desc, desc, 1); }, d);
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

template <typename Element, bool kMnMajor, int... N>
void instantiate(std::integer_sequence<int, N...>) {
  (static_cast<void>(&assemble_wgmma<Element, N, kMnMajor>), ...);
}

}  // namespace

// Never called: taking the kernels' addresses instantiates them.
void instantiate_every_wgmma_wrapper() {
  using flashlab::sm90::WgmmaMnMajorWidths;
  using flashlab::sm90::WgmmaWidths;
  instantiate<__half, false>(WgmmaWidths{});
  instantiate<__nv_bfloat16, false>(WgmmaWidths{});
  instantiate<__nv_fp8_e4m3, false>(WgmmaWidths{});
  instantiate<__half, true>(WgmmaMnMajorWidths{});
  instantiate<__nv_bfloat16, true>(WgmmaMnMajorWidths{});
}
