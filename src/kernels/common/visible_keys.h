// The visible-key rule, written once: which keys a query row may attend to
// under causal / sliding-window masks, bottom-right aligned as flash-attn
// defines them. Every kernel, the reference masks and the comparison's tile
// report use these functions (host and device).
//
//   key j is visible from query i  iff
//   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right
//
// with window_left / window_right = -1 meaning unbounded on that side; causal
// is window_right = 0.
#pragma once

#include "flashlab/kernel_params.h"

namespace flashlab {

// Keys [first, last] (inclusive); empty when last < first. (visible_rows_of_keys
// returns an interval of query rows in the same type.)
struct KeyRange {
  int first = 0;
  int last = -1;
  FLASHLAB_HOST_DEVICE bool empty() const { return last < first; }
  FLASHLAB_HOST_DEVICE bool contains(int key) const { return first <= key && key <= last; }
};

// The keys row `row` sees.
FLASHLAB_HOST_DEVICE inline KeyRange visible_keys(int row, int seqlen_q, int seqlen_k,
                                                  int window_left, int window_right) {
  // The key aligned with this row. (Parenthesized: seqlen_k - seqlen_q is loop-invariant, and
  // this form keeps fa2_mma_sm80 d128 on sm_80 at 24 spilled bytes instead of 96.)
  const int diagonal = row + (seqlen_k - seqlen_q);
  KeyRange range{0, seqlen_k - 1};
  if (window_left >= 0 && diagonal - window_left > range.first) range.first = diagonal - window_left;
  if (window_right >= 0 && diagonal + window_right < range.last) range.last = diagonal + window_right;
  return range;
}

// The keys at least one of rows [row_first, row_last] sees (the union; the
// window moves right by one key per row, so it is one interval).
FLASHLAB_HOST_DEVICE inline KeyRange visible_keys_of_rows(int row_first, int row_last, int seqlen_q,
                                                          int seqlen_k, int window_left,
                                                          int window_right) {
  const KeyRange top = visible_keys(row_first, seqlen_q, seqlen_k, window_left, window_right);
  const KeyRange bottom = visible_keys(row_last, seqlen_q, seqlen_k, window_left, window_right);
  KeyRange range{top.first, bottom.last};
  if (range.first < 0) range.first = 0;
  if (range.last > seqlen_k - 1) range.last = seqlen_k - 1;
  return range;
}

// The other way round, for kernels that walk query rows per key block (the
// backward): the rows that see at least one of keys [key_first, key_last]
// (0 <= key_first <= key_last < seqlen_k), as an interval of rows within
// [0, seqlen_q); empty when no row does. Row i sees key j iff
//   j >= i + seqlen_k - seqlen_q - window_left  (window_left >= 0)  and
//   j <= i + seqlen_k - seqlen_q + window_right (window_right >= 0),
// so some key of the block is seen iff i + (seqlen_k - seqlen_q) + window_right >= key_first
// and i + (seqlen_k - seqlen_q) - window_left <= key_last (the per-row range
// clipped to [0, seqlen_k) stays non-empty then, since key_first >= 0 and
// key_last < seqlen_k). Same rule as visible_keys, row by row.
FLASHLAB_HOST_DEVICE inline KeyRange visible_rows_of_keys(int key_first, int key_last, int seqlen_q,
                                                          int seqlen_k, int window_left,
                                                          int window_right) {
  const int offset = seqlen_k - seqlen_q;
  KeyRange rows{0, seqlen_q - 1};
  if (window_right >= 0 && key_first - offset - window_right > rows.first)
    rows.first = key_first - offset - window_right;
  if (window_left >= 0 && key_last - offset + window_left < rows.last)
    rows.last = key_last - offset + window_left;
  return rows;
}

// True when every row of [row_first, row_last] sees every key of
// [key_first, key_last]: such a tile needs no mask.
FLASHLAB_HOST_DEVICE inline bool tile_fully_visible(int row_first, int row_last, int key_first,
                                                    int key_last, int seqlen_q, int seqlen_k,
                                                    int window_left, int window_right) {
  const KeyRange top = visible_keys(row_first, seqlen_q, seqlen_k, window_left, window_right);
  const KeyRange bottom = visible_keys(row_last, seqlen_q, seqlen_k, window_left, window_right);
  // The top row has the smallest right edge, the bottom row the largest left edge.
  return key_last <= top.last && key_first >= bottom.first;
}

// The key tiles of block_n keys (tile t = keys [t * block_n, (t + 1) * block_n))
// that need no mask for the query rows [row_first, row_last]: whole inside the
// sequence and tile_fully_visible. They are one interval (the top row bounds
// the right edge, the bottom row the left one), [first, last] in tile indices;
// empty when last < first. Lets a kernel run its unmasked tiles as a separate
// loop instead of testing every tile.
FLASHLAB_HOST_DEVICE inline KeyRange unmasked_key_tiles(int row_first, int row_last, int seqlen_q,
                                                        int seqlen_k, int window_left,
                                                        int window_right, int block_n) {
  const KeyRange top = visible_keys(row_first, seqlen_q, seqlen_k, window_left, window_right);
  const KeyRange bottom = visible_keys(row_last, seqlen_q, seqlen_k, window_left, window_right);
  // Tiles ending at or before key `end` (exclusive): floor(end / block_n), end may be <= 0.
  const auto tiles_before = [block_n](int end) {
    return end >= 0 ? end / block_n : -((-end + block_n - 1) / block_n);
  };
  const int first = (bottom.first + block_n - 1) / block_n;  // bottom.first >= 0
  const int last_by_mask = tiles_before(top.last + 1) - 1;
  const int last_by_length = seqlen_k / block_n - 1;
  return {first, last_by_mask < last_by_length ? last_by_mask : last_by_length};
}

}  // namespace flashlab
