// The mask rules of common/visible_keys.h against each other, exhaustively on
// small problems: the closed forms kernels use to skip work must agree with
// the per-key rule they stand for.
#include <gtest/gtest.h>

#include "common/visible_keys.h"

namespace flashlab {
namespace {

struct MaskCase {
  int seqlen_q, seqlen_k, window_left, window_right;
};

std::vector<MaskCase> mask_cases() {
  std::vector<MaskCase> cases;
  for (const int seqlen_q : {1, 7, 40, 113})
    for (const int seqlen_k : {1, 9, 64, 113, 130})
      for (const int window_left : {-1, 0, 5, 37})
        for (const int window_right : {-1, 0, 3, 50}) cases.push_back({seqlen_q, seqlen_k, window_left, window_right});
  return cases;
}

// unmasked_key_tiles is exactly the set of tiles that lie inside the sequence
// and that every row of the block sees whole (tile_fully_visible).
TEST(VisibleKeys, UnmaskedKeyTilesMatchTileFullyVisible) {
  for (const MaskCase& c : mask_cases())
    for (const int block_m : {1, 16, 64})
      for (const int block_n : {16, 80, 128})
        for (int row_first = 0; row_first < c.seqlen_q; row_first += block_m) {
          const int row_last = row_first + block_m - 1;  // may pass seqlen_q, as kernels pass it
          const KeyRange tiles = unmasked_key_tiles(row_first, row_last, c.seqlen_q, c.seqlen_k,
                                                    c.window_left, c.window_right, block_n);
          for (int tile = -1; tile * block_n < c.seqlen_k + block_n; ++tile) {
            const int k0 = tile * block_n, k_last = k0 + block_n - 1;
            const bool expected = tile >= 0 && k_last < c.seqlen_k &&
                                  tile_fully_visible(row_first, row_last, k0, k_last, c.seqlen_q,
                                                     c.seqlen_k, c.window_left, c.window_right);
            ASSERT_EQ(tiles.contains(tile), expected)
                << "seqlen_q " << c.seqlen_q << ", seqlen_k " << c.seqlen_k << ", window ("
                << c.window_left << ", " << c.window_right << "), rows [" << row_first << ", "
                << row_last << "], block_n " << block_n << ", tile " << tile << ": got ["
                << tiles.first << ", " << tiles.last << "]";
          }
        }
}

// tile_fully_visible and visible_keys_of_rows agree with visible_keys row by row.
TEST(VisibleKeys, BlockRulesMatchTheRowRule) {
  for (const MaskCase& c : mask_cases())
    for (int row_first = 0; row_first < c.seqlen_q; row_first += 16) {
      const int row_last = std::min(row_first + 15, c.seqlen_q - 1);
      const KeyRange block = visible_keys_of_rows(row_first, row_last, c.seqlen_q, c.seqlen_k,
                                                  c.window_left, c.window_right);
      for (int key_first = 0; key_first < c.seqlen_k; key_first += 8) {
        const int key_last = std::min(key_first + 7, c.seqlen_k - 1);
        bool all_visible = true;
        for (int row = row_first; row <= row_last; ++row)
          for (int key = key_first; key <= key_last; ++key) {
            const bool visible =
                visible_keys(row, c.seqlen_q, c.seqlen_k, c.window_left, c.window_right).contains(key);
            all_visible = all_visible && visible;
            if (visible) ASSERT_TRUE(block.contains(key)) << "row " << row << ", key " << key;
          }
        ASSERT_EQ(tile_fully_visible(row_first, row_last, key_first, key_last, c.seqlen_q, c.seqlen_k,
                                     c.window_left, c.window_right),
                  all_visible)
            << "rows [" << row_first << ", " << row_last << "], keys [" << key_first << ", " << key_last << "]";
      }
    }
}

}  // namespace
}  // namespace flashlab
