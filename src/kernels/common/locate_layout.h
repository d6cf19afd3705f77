// The parts of KernelVariant::locate that every kernel computes the same way
// (the source path, the row check, the key tiles, the m16n8 quad's state
// slots), so each kernel's *_locate.cpp holds only its own mapping. Host only:
// included by the *_locate.cpp files, never by device code.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/sequence_view.h"
#include "common/visible_keys.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {

// `kernel_file` in the folder of `here` (the caller's __FILE__, as compiled).
inline std::string kernel_source_beside(const std::string& here, const char* kernel_file) {
  return here.substr(0, here.rfind('/') + 1) + kernel_file;
}

// Why `row` cannot be located in batch entry `batch`; empty when it can.
inline std::string row_past_sequence(const SequenceView& view, int batch, int row) {
  if (row >= 0 && row < view.seqlen_q) return {};
  return "row " + std::to_string(row) + " is past batch entry " + std::to_string(batch) + "'s " +
         std::to_string(view.seqlen_q) + " query rows";
}

// Fills block_k, the key tiles the row's query block visits (ascending, or
// from the last down when `last_tile_first`) and the tiles the row itself sees.
inline void locate_key_tiles(ElementLocation& location, const AttentionParams& params,
                             const SequenceView& view, int row, int block_q, int block_k,
                             bool last_tile_first) {
  location.block_k = block_k;
  const int q0 = location.query_block * block_q;
  const int q_last = (q0 + block_q < view.seqlen_q ? q0 + block_q : view.seqlen_q) - 1;
  const KeyRange block_keys = visible_keys_of_rows(q0, q_last, view.seqlen_q, view.seqlen_k,
                                                   params.window_left, params.window_right);
  if (!block_keys.empty()) {
    const int first = block_keys.first / block_k, last = block_keys.last / block_k;
    if (last_tile_first)
      for (int tile = last; tile >= first; --tile) location.key_tiles.push_back(tile);
    else
      for (int tile = first; tile <= last; ++tile) location.key_tiles.push_back(tile);
  }
  const KeyRange row_keys =
      visible_keys(row, view.seqlen_q, view.seqlen_k, params.window_left, params.window_right);
  if (!row_keys.empty()) {
    location.row_first_tile = row_keys.first / block_k;
    location.row_last_tile = row_keys.last / block_k;
  }
}

// mma m16n8 accumulators: the row's m and l sit in all four lanes of the quad
// holding `lane`, as row_max<state_index> / row_sum<state_index>.
// `slot_of(lane)` gives the thread of a lane of the row's warp.
template <class SlotOf>
void locate_quad_row_state(ElementLocation& location, const SlotOf& slot_of, int lane,
                           const std::string& state_index, const std::vector<int>& index) {
  for (int thread_in_group = 0; thread_in_group < 4; ++thread_in_group) {
    RegisterSlot m = slot_of(lane / 4 * 4 + thread_in_group), l = m;
    m.index = l.index = index;
    m.name = "row_max" + state_index;
    l.name = "row_sum" + state_index;
    location.row_max.push_back(m);
    location.row_sum.push_back(l);
  }
}

}  // namespace flashlab
