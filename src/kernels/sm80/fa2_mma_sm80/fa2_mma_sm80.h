// fa2_mma_sm80: what the host side needs to know about the FlashAttention-2
// forward kernel on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async): its
// head-dim list, its tile configurations and the launch entry. No device code:
// the kernel template is fa2_mma_sm80_kernel.cuh.
//
// Instantiations: CMake generates one fa2_mma_sm80_hdim<D>.cu per entry of
// HeadDims from fa2_mma_sm80_hdim.cu.in (the default tiling of that head dim,
// fp16 and bf16); the dispatch, the support check, the tile shape and the
// messages all read the same list. Adding a head dim (a multiple of 32): add it
// to HeadDims.
#pragma once

#include <string>

#include "common/static_switch.h"
#include "flashlab/kernel_params.h"

namespace flashlab::fa2_mma_sm80 {

using HeadDims = HeadDimList<32, 64, 96, 128, 256>;

template <int HeadDim, int BlockQ, int BlockK, int Warps, int Stages, bool QInRegs>
struct Traits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockQ = BlockQ;
  static constexpr int kBlockK = BlockK;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kStages = Stages;
  static constexpr bool kQInRegs = QInRegs;
  static constexpr int kRowsPerWarp = BlockQ / Warps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 slabs per warp
  // Elements per shared-memory row: head_dim plus 16 bytes of padding.
  static constexpr int kSmemStride = HeadDim + 8;
  static constexpr int kQTileElems = BlockQ * kSmemStride;
  static constexpr int kKVTileElems = BlockK * kSmemStride;
  static constexpr int kSmemBytes = (kQTileElems + 2 * Stages * kKVTileElems) * 2;

  static_assert(HeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static_assert(BlockQ % (16 * Warps) == 0, "each warp owns whole m16 slabs");
  static_assert(BlockK % 16 == 0, "key tile must be a multiple of 16");
  static_assert(Stages >= 2, "need at least double buffering");
};

// The default tile configuration of a head dim (what launches run), a rule so
// that every entry of HeadDims has one:
// - block_q 128 with 4 warps up to head_dim 128: two m16 slabs per warp let each
//   K/V fragment read from shared memory feed two MMAs (on H100, bf16, 8x16
//   heads, seqlen 4096, 20-50% faster than one slab per warp); above 128, block_q
//   64 (one slab per warp) so that O fits in registers;
// - block_k 128 at head_dim 64, 64 up to 128, 32 above (flashlab-bench --sweep);
// - Q in registers only at head_dim 32 (larger head dims spill);
// - K/V double-buffered with cp.async.
template <int HeadDim>
struct DefaultTraits {
  using type = Traits<HeadDim, (HeadDim <= 128 ? 128 : 64),
                      (HeadDim == 64 ? 128 : HeadDim <= 128 ? 64 : 32), 4, 2, (HeadDim <= 32)>;
};

// Empty when the kernel can run the problem (dtype, head_dim in HeadDims, GQA
// ratio, grid limits, 16-byte alignment), else the reason. Shared by every tile
// configuration, the tuning ones included. Host only.
std::string unsupported_reason(const AttentionParams& params);

// Launches configuration Tr for params.dtype (fp16 or bf16). Defined in
// fa2_mma_sm80_kernel.cuh and explicitly instantiated, one configuration per
// file: the generated fa2_mma_sm80_hdim<D>.cu for DefaultTraits<D>, the dev
// tuning files for the alternatives. This header declares it only, so the
// files that dispatch compile no kernel.
template <class Tr>
void launch(const AttentionParams& params);

}  // namespace flashlab::fa2_mma_sm80
