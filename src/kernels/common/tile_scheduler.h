// The persistent tile scheduler every persistent kernel shares (fa3_wgmma_sm90's
// forward today): the host's schedule (query blocks, work tiles, the heads of a
// scheduling section sized to the L2, the grid, static or dynamic hand-out) and
// the work-tile order (sections of (batch, head) pairs, query blocks longest
// first), host and device. fa3_wgmma_sm90_locate.cpp inverts the order. Then
// the backward's CTA order (KeyBlockOrder), cut into sections the same way.
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

// The backward's CTA order (fa3_wgmma_sm90's backward: not persistent, one CTA
// a key block of a (batch, kv head) pair, pair = batch * kv_heads + kv_head).
// CTAs start in the order of their linear index, x fastest. The grid's own
// order runs a pair's key blocks one after another. Under a right-bounded
// mask (causal) a key block's walk over the query blocks shortens as the key
// block grows, so the grid ends with the last pairs' long walks started late:
// a host model of a 132-SM grid, one CTA an SM, 1k-8k causal at head_dim
// 64-256 (scripts/backward_order_model.py), puts the end 3-8% above the
// balanced time. There (from kSectionedKeyBlocks key blocks a pair) the
// pairs are cut into sections of about two grids' worth of CTAs, as equal as
// they divide, and a section's key blocks run first to last, all of its pairs
// at each step (the model: 0-2% above). At any moment the CTAs running then
// share a section's Q, dO and dQ sums, capped at three quarters of the L2.
// With one pair a section the order is the grid's own. Host and device;
// fa3_wgmma_sm90_bwd_locate.cpp inverts it.
//
// Fewer key blocks a pair than this keep the grid's order. Measured on the
// H200 (session 35, causal, 16k tokens): at 8 key blocks (1k, head_dim 64/128)
// sections took 0-3% longer; from 16 they ran 2-3% faster at head_dim 128
// (2k-8k) and 256 (2k-4k), about 1% at 64, and within 1% at 16k.
constexpr int kSectionedKeyBlocks = 16;
struct KeyBlockOrder {
  int key_blocks = 0;  // gridDim.x
  int pairs = 0;       // gridDim.y * gridDim.z
  int sections = 0;    // 1..pairs; pairs: the grid's own order
};
inline KeyBlockOrder key_block_order(int key_blocks, int pairs, bool walks_shorten, int64_t pair_bytes,
                                     int multiprocessors, int l2_bytes) {
  KeyBlockOrder order{key_blocks, pairs, pairs};
  if (!walks_shorten || key_blocks < kSectionedKeyBlocks || pairs <= 1) return order;
  int64_t section_pairs = (2 * static_cast<int64_t>(multiprocessors) + key_blocks - 1) / key_blocks;
  section_pairs = std::min<int64_t>(section_pairs, std::max<int64_t>(1, int64_t{l2_bytes} * 3 / 4 /
                                                                            std::max<int64_t>(1, pair_bytes)));
  const int64_t sections = (pairs + section_pairs / 2) / section_pairs;  // the nearest count
  order.sections = static_cast<int>(std::clamp<int64_t>(sections, 1, pairs));
  return order;
}
// Sections of pairs / sections pairs, the first pairs % sections of them one more.
struct KeyBlockCta {
  int key_block, pair;
};
FLASHLAB_HOST_DEVICE inline KeyBlockCta key_block_cta_at(int index, const KeyBlockOrder& order) {
  const int small = order.pairs / order.sections, big_sections = order.pairs % order.sections;
  const int big_ctas = (small + 1) * order.key_blocks;  // CTAs of a section of small + 1 pairs
  int section_pairs = small + 1, first_pair = 0, within = index;
  if (index < big_sections * big_ctas) {
    first_pair = index / big_ctas * section_pairs;
    within = index % big_ctas;
  } else {
    const int rest = index - big_sections * big_ctas, small_ctas = small * order.key_blocks;
    section_pairs = small;
    first_pair = big_sections * (small + 1) + rest / small_ctas * small;
    within = rest % small_ctas;
  }
  return {within / section_pairs, first_pair + within % section_pairs};
}
FLASHLAB_HOST_DEVICE inline int key_block_cta_index(int key_block, int pair, const KeyBlockOrder& order) {
  const int small = order.pairs / order.sections, big_sections = order.pairs % order.sections;
  const int big_pairs = big_sections * (small + 1);
  if (pair < big_pairs) {
    const int section = pair / (small + 1);
    return section * (small + 1) * order.key_blocks + key_block * (small + 1) + pair - section * (small + 1);
  }
  const int section = (pair - big_pairs) / small;
  const int first_pair = big_pairs + section * small;
  return big_pairs * order.key_blocks + section * small * order.key_blocks + key_block * small + pair - first_pair;
}

}  // namespace flashlab
