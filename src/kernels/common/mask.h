// The attention mask as one policy that every kernel applies to its score
// tiles (flash-attn's mask.h plays this part): which tiles need masking at
// all, and -inf on the elements of an accumulator fragment whose key a row
// does not see. The rule itself is visible_keys.h's (causal / sliding window,
// bottom-right aligned, the sequence end). Score modifications (softcap,
// ALiBi, sinks) extend this policy rather than each kernel body.
//
// Fragments: a tensor-core thread holds, for each row it owns, kPerTile
// consecutive keys of each of kTiles n8 column tiles, tile n's first at
// first_key + n * 8 + lane_key (mma m16n8 / wgmma accumulators: first_key the
// fragment's first key, lane_key = 2 * (lane % 4), two keys a tile).
// `score(n, i)` names the element of tile n, key i in the kernel's own
// accumulator array. (The key is summed in that order: the kernels' SASS is
// then the same as with the rule written inline, cuobjdump, session 20.)
#pragma once

#include <cmath>

#include "common/visible_keys.h"
#include "flashlab/kernel_params.h"

namespace flashlab {

struct VisibleKeyMask {
  int seqlen_q = 0, seqlen_k = 0;
  int window_left = -1, window_right = -1;

  // The keys `row` sees.
  FLASHLAB_HOST_DEVICE KeyRange visible(int row) const {
    return visible_keys(row, seqlen_q, seqlen_k, window_left, window_right);
  }

  // True when some row of [row_first, row_last] does not see every key of
  // [key_first, key_last] (the sequence end counts): such a tile needs
  // apply_row on its rows; the others need nothing.
  FLASHLAB_HOST_DEVICE bool needs_mask(int row_first, int row_last, int key_first, int key_last) const {
    return !tile_fully_visible(row_first, row_last, key_first, key_last, seqlen_q, seqlen_k, window_left,
                               window_right);
  }

  // -inf on row `row`'s fragment elements whose key the row does not see.
  template <int kTiles, int kPerTile = 2, class Score>
  FLASHLAB_HOST_DEVICE void apply_row(int row, int first_key, int lane_key, Score&& score) const {
    const KeyRange keys = visible(row);
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int i = 0; i < kPerTile; ++i)
        if (!keys.contains(first_key + n * 8 + lane_key + i)) score(n, i) = -INFINITY;
  }

  // The transposed fragment (the backward's S^T = K Q^T: a thread owns keys,
  // its columns are query rows): -inf on key `key`'s elements whose row does
  // not see it (keys past seqlen_k: every element). Rows run first_row +
  // n * 8 + lane_row + i as keys do in apply_row.
  template <int kTiles, int kPerTile = 2, class Score>
  FLASHLAB_HOST_DEVICE void apply_column(int key, int first_row, int lane_row, Score&& score) const {
    const KeyRange rows = key < seqlen_k
                              ? visible_rows_of_keys(key, key, seqlen_q, seqlen_k, window_left, window_right)
                              : KeyRange{};
#pragma unroll
    for (int n = 0; n < kTiles; ++n)
#pragma unroll
      for (int i = 0; i < kPerTile; ++i)
        if (!rows.contains(first_row + n * 8 + lane_row + i)) score(n, i) = -INFINITY;
  }
};

}  // namespace flashlab
