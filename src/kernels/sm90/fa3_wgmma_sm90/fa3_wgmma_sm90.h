// fa3_wgmma_sm90: what the host side needs to know about the Hopper forward
// kernel (TMA, wgmma, warp specialization): its head-dim list, its tile
// configurations and the launch entry. No device code: the kernel template is
// fa3_wgmma_sm90_kernel.cuh.
//
// Instantiations: CMake generates one fa3_wgmma_sm90_hdim<D>.cu per entry of
// HeadDims from fa3_wgmma_sm90_hdim.cu.in (the default tiling of that head dim,
// fp16 and bf16, plain and traced); the dispatch, the support check, the tile
// shape and the messages read the same list. Adding a head dim (a multiple of
// 64: whole 128-byte swizzle rows): add it to HeadDims.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing links libcuda)

#include <string>

#include "common/static_switch.h"
#include "flashlab/kernel_params.h"

namespace flashlab::fa3_wgmma_sm90 {

using HeadDims = HeadDimList<64, 128, 256>;

template <int HeadDim, int BlockN, int Stages, bool Pingpong = true, int Consumers = 2>
struct Traits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kConsumers = Consumers;  // consumer warpgroups, 64 query rows each
  static constexpr int kBlockM = 64 * Consumers;
  static constexpr int kBlockN = BlockN;
  static constexpr int kStages = Stages;
  static constexpr bool kPingpong = Pingpong;  // consumers take turns issuing GEMMs
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kPanels = HeadDim / 64;  // 64-element (128-byte) column panels
  static constexpr int kQTileBytes = kBlockM * HeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * HeadDim * 2;
  // setmaxnreg moves registers within the CTA's launch allocation (65536 /
  // threads, in steps of 8): what the producer gives up, the consumers share.
  // Asking for more than that makes setmaxnreg.inc wait forever.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      (kLaunchRegisters * kThreads - kProducerRegisters * 128) / (128 * Consumers) / 8 * 8;
  // Tiles, then the barriers; +1024 so the base can be aligned for the swizzle.
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages);
  static constexpr int kSmemBytes =
      kQTileBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + 1024;

  static_assert(HeadDim % 64 == 0, "head_dim must be whole 128-byte panels");
  static_assert(BlockN % 16 == 0 && BlockN <= 256, "key tile is whole k16 steps, one TMA box");
};

template <int HeadDim> struct DefaultTraits;
// The default tiling of a head dim, a rule so every entry of HeadDims has one
// (H100 smoke, bf16, 16k tokens): three consumers (192-row blocks) at head_dim
// 64 beat two by 17-36%; key tiles of 80 beat 64 above 128 by 2-11%; 176 beat
// 128 at head_dim 128 only at 16k non-causal, so 128 up to head_dim 128.
template <int HeadDim>
struct DefaultTraits {
  using type = Traits<HeadDim, (HeadDim <= 128 ? 128 : 80), 2, true, (HeadDim <= 64 ? 3 : 2)>;
};

// Empty when the kernel can run the problem (dtype, head_dim in HeadDims, GQA
// ratio, TMA alignment), else the reason. Host only.
std::string unsupported_reason(const AttentionParams& params);

// Host helpers of the launch, defined in fa3_wgmma_sm90.cu.
// A 4-D tensor map (head_dim, rows, heads, batch) over q, k or v with a box of
// 64 elements x box_rows rows, 128-byte swizzle. Defined in fa3_wgmma_sm90.cu.
enum class Operand { q, k, v };
CUtensorMap make_tensor_map(const AttentionParams& params, Operand operand, int box_rows);
// Per device, asked once: the launch path stays short because the benchmark's
// events time it too.
struct DeviceLimits {
  int multiprocessors = 0;
  int l2_bytes = 0;
};
DeviceLimits device_limits();
void allow_shared_memory(const void* kernel, int bytes);

// Launches configuration Tr for params.dtype (fp16 or bf16), the traced
// instantiation when params.trace is on. Defined in fa3_wgmma_sm90_kernel.cuh
// and explicitly instantiated per head dim (the generated files).
template <class Tr>
void launch(const AttentionParams& params);

}  // namespace flashlab::fa3_wgmma_sm90
