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

#include <algorithm>
#include <cstdint>
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
  // Steady-state steps with the mask decided at compile time (masked and
  // unmasked runs of key tiles), so no branch separates issuing P V from
  // waiting for it and the softmax overlaps P V: 2-5% at head_dim 128 on the
  // H100. With three consumers (160 registers) the overlap spills 232 bytes and
  // measured 1-8% slower at head_dim 64, so the mask stays a branch there.
  static constexpr bool kMaskFreeSteps = kConsumerRegisters >= 200;
  // Work tiles handed out at run time under masks and varlen (Schedule::dynamic)
  // by the two-consumer tilings (head_dim 128 and 256): their static
  // round-robin gives the same CTAs the longest tiles. ptxas -v: no new spills
  // there (d128 none, d256 64 bytes with either schedule); with three
  // consumers (160 registers, head_dim 64) the published tile's coordinates
  // spill 40 bytes, so head_dim 64 keeps the static order.
  static constexpr bool kDynamicSchedule = kConsumerRegisters >= 200;
  // Work tiles overlapped: a tile's last P V is issued together with the next
  // tile's first S, and its output is written while that S runs, so the
  // tensor cores do not idle over the epilogue, Q's arrival and the first
  // softmax. The next Q must have landed by then: two Q buffers, which fit
  // where shared memory allows it (head_dim 128 at 128 x 128: 192 KB), and the
  // extra live state needs the two-consumer register budget.
  static constexpr int kMaxSmemBytes = 227 * 1024;
  static constexpr int kBarrierBytes = 8 * (2 * 2 + 4 * kStages) + 8 * 2;
  static constexpr bool kOverlapWorkTiles =
      kConsumerRegisters >= 200 &&
      2 * kQTileBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + 1024 <= kMaxSmemBytes;
  static constexpr int kQBuffers = kOverlapWorkTiles ? 2 : 1;
  // Tiles, then the barriers (q_full/q_empty per Q buffer, four per K/V stage,
  // and a published work-tile index per Q buffer); +1024 so the base can be
  // aligned for the swizzle.
  static constexpr int kSmemBytes =
      kQBuffers * kQTileBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + 1024;
  static_assert(kSmemBytes <= kMaxSmemBytes, "tiles exceed the shared memory of a block");

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
// The workspace a launch needs: the dynamic schedule's tile counter. Host only.
size_t workspace_bytes(const AttentionParams& params);

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

// Work tiles of unequal length: causal / window masks, varlen batches.
inline bool unequal_work_tiles(const AttentionParams& params) {
  return params.window_left >= 0 || params.window_right >= 0 || params.is_varlen();
}

// The persistent grid's schedule (host): how many query blocks and work tiles,
// how many (batch, head) pairs a scheduling section holds, and the grid. The
// launch and the locate hook (fa3_wgmma_sm90_locate.cpp) both use it.
struct Schedule {
  int num_q_blocks = 0;
  int num_work_tiles = 0;
  int section_heads = 1;
  int grid = 0;
  // Work tiles of unequal length: handed out at run time from a counter in the
  // workspace (greedy, longest first) by tilings with Traits::kDynamicSchedule,
  // since the static round-robin gives the same CTAs the longest tiles (a host
  // model of the H100 grid under causal masks, 1k-16k: 12-15% above the
  // balanced time, 1-6% dynamic).
  bool dynamic = false;
};
inline Schedule schedule(const AttentionParams& params, int block_m, int element_bytes,
                         int multiprocessors, int l2_bytes) {
  Schedule result;
  result.num_q_blocks = (params.seqlen_q + block_m - 1) / block_m;
  result.num_work_tiles = result.num_q_blocks * params.heads * params.batch;
  if (result.num_work_tiles == 0) return result;
  // Sections whose K and V take about a quarter of the L2 (a query head's
  // share of its kv head counts 1 / group), half under masks and varlen.
  // H100, head_dim 128, 4 x 16 x 4096, no mask: with half the L2 the CTAs
  // read 525 MB from DRAM (K/V about three times over) and the SM clock sagged
  // to 1.64 GHz; with a quarter 297 MB, 1.67 GHz, 2-4% faster at 1k-16k (an
  // eighth: no better). Tiles of unequal length balance better over bigger
  // sections (head_dim 64's static schedule, 4k causal: 0.71 ms with half,
  // 0.80 ms with a quarter).
  const int64_t kv_head_bytes = std::max<int64_t>(
      1, 2 * static_cast<int64_t>(params.seqlen_k) * params.head_dim * element_bytes);  // seqlen_k may be 0
  const int group = params.heads / params.kv_heads;
  const int l2_share = unequal_work_tiles(params) ? 2 : 4;
  const int64_t kv_heads_in_l2 = std::max<int64_t>(1, l2_bytes / l2_share / kv_head_bytes);
  int64_t section_heads = kv_heads_in_l2 * group;
  // Under a causal or sliding-window mask the tiles of a section differ in
  // length, and CTA i takes tiles i, i + grid, ...: a section of fewer tiles
  // than about four grids would hand the same CTAs the longest tiles of every
  // section (H100, head_dim 256, 16k causal: 0.71x cuDNN with one head per
  // section, 0.91x with all). Such sections grow to four grids' worth.
  if (params.window_left >= 0 || params.window_right >= 0)
    section_heads = std::max<int64_t>(
        section_heads, (4 * multiprocessors + result.num_q_blocks - 1) / result.num_q_blocks);
  result.section_heads = static_cast<int>(
      std::min<int64_t>(section_heads, static_cast<int64_t>(params.heads) * params.batch));
  result.grid = std::min(result.num_work_tiles, multiprocessors);
  result.dynamic = unequal_work_tiles(params);
  return result;
}

// One work tile: a query block of one (batch, head). The (batch, head) pairs
// are cut into sections of section_heads consecutive pairs (heads fastest, so
// a GQA group's query heads sit together) whose K and V fit in a quarter of the
// L2 (half under masks); a section's tiles run before the next one's; inside one
// query blocks run from the last one down (the longest causal rows first), all
// of the section's heads at each step. So the CTAs running at any moment share
// a few heads' K/V in L2 instead of streaming every head's from DRAM. CTA i
// takes work tiles i, i + grid, i + 2 grid, ... Host and device.
struct WorkTile {
  int q_block, head, batch;
};
FLASHLAB_HOST_DEVICE inline WorkTile work_tile_at(int index, int num_q_blocks, int section_heads,
                                                  int heads, int batch) {
  const int section_tiles = section_heads * num_q_blocks;
  const int section = index / section_tiles;
  const int within = index - section * section_tiles;
  const int first_pair = section * section_heads;
  const int left = heads * batch - first_pair;
  const int pairs_here = section_heads < left ? section_heads : left;
  const int pair = first_pair + within % pairs_here;
  WorkTile tile;
  tile.q_block = num_q_blocks - 1 - within / pairs_here;
  tile.head = pair % heads;
  tile.batch = pair / heads;
  return tile;
}

// Launches configuration Tr for params.dtype (fp16 or bf16), the traced
// instantiation when params.trace is on. Defined in fa3_wgmma_sm90_kernel.cuh
// and explicitly instantiated per head dim (the generated files).
template <class Tr>
void launch(const AttentionParams& params);

}  // namespace flashlab::fa3_wgmma_sm90
