// The persistent tile scheduler every persistent kernel shares (fa3_wgmma_sm90's
// forward today): the host's schedule (query blocks, work tiles, the heads of a
// scheduling section sized to the L2, the grid, static or dynamic hand-out) and
// the work-tile order (sections of (batch, head) pairs, query blocks longest
// first), host and device. fa3_wgmma_sm90_locate.cpp inverts the order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "flashlab/kernel_params.h"

namespace flashlab {

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
  multiprocessors = std::max(1, multiprocessors - params.sm_margin);  // the SMs the grid may take
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

}  // namespace flashlab
