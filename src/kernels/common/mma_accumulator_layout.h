// Where an element of an mma.sync m16n8 (and wgmma m64nN, the same per-warp
// pattern) float accumulator lives: for a 16-row slab of a warp and an 8-column
// n tile, lane 4 * group + thread_in_group holds rows group and group + 8,
// columns 2 * thread_in_group and 2 * thread_in_group + 1, in the four slots
//   [0] (group, 2t)  [1] (group, 2t + 1)  [2] (group + 8, 2t)  [3] (group + 8, 2t + 1).
// The kernels index these slots as h * 2 + e (h: which 8-row half, e: which of
// the two columns); the row statistics m and l of a row are per (slab, h) and
// held by all four lanes of the quad. Host and device; used by the locate hooks.
#pragma once

#include "flashlab/kernel_params.h"

namespace flashlab {

struct AccumulatorPosition {
  int lane = 0;
  int h = 0;     // 0: rows 0-7 of the slab, 1: rows 8-15
  int e = 0;     // 0: even column, 1: odd column
  int slot = 0;  // h * 2 + e: the index within the n8 tile's four floats
};

// row_in_slab in [0, 16), col_in_tile in [0, 8).
FLASHLAB_HOST_DEVICE inline AccumulatorPosition accumulator_position(int row_in_slab, int col_in_tile) {
  AccumulatorPosition position;
  const int group = row_in_slab % 8, thread_in_group = col_in_tile / 2;
  position.lane = 4 * group + thread_in_group;
  position.h = row_in_slab / 8;
  position.e = col_in_tile % 2;
  position.slot = position.h * 2 + position.e;
  return position;
}

// Where a lane's value 0 of one accumulator fragment group sits in a block
// (row, column): the backward's dq accumulator orders (common/backward_dq.cuh)
// map each 128-float group back to it; values 1..3 follow the slots above.
struct FragmentOrigin {
  int row, col;
};

}  // namespace flashlab
