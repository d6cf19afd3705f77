// The expected tile states the tile-state diff compares kernels with, in both
// visiting orders: computed on the CPU from small normal inputs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "flashlab/harness/tile_trace.h"

namespace flashlab {
namespace {

struct Inputs {
  at::Tensor q, k;
};

Inputs small_inputs() {
  at::manual_seed(7);
  return {at::randn({1, 37, 2, 16}, at::kDouble), at::randn({1, 53, 1, 16}, at::kDouble)};
}

// After its last visited tile a row has seen every visible key, whichever the
// order: ascending ends at the last tile, descending at tile 0.
TEST(ExpectedTileStates, BothOrdersEndWithTheWholeRow) {
  const Inputs in = small_inputs();
  for (const int window_right : {-1, 0}) {
    const ExpectedTileStates up = expected_tile_states(in.q, in.k, 0.25, -1, window_right, 16);
    const ExpectedTileStates down =
        expected_tile_states(in.q, in.k, 0.25, -1, window_right, 16, /*descending=*/true);
    const int64_t last = up.row_max.size(-1) - 1;
    EXPECT_TRUE(at::allclose(up.row_max.select(-1, last), down.row_max.select(-1, 0)));
    EXPECT_TRUE(at::allclose(up.row_sum.select(-1, last), down.row_sum.select(-1, 0)));
  }
}

// Descending, the state at tile t covers tiles t..last: its max is the max
// of the scores from key 16 t on (scaled), -inf where the row sees none.
TEST(ExpectedTileStates, DescendingStateCoversTheTilesFromTOn) {
  const Inputs in = small_inputs();
  const double scale = 0.25;
  const ExpectedTileStates down =
      expected_tile_states(in.q, in.k, scale, -1, -1, 16, /*descending=*/true);
  const at::Tensor scores =
      at::matmul(in.q.transpose(1, 2), in.k.transpose(1, 2).transpose(-2, -1)) * scale;  // (1, 2, 37, 53)
  for (int64_t tile = 0; tile < down.row_max.size(-1); ++tile) {
    const at::Tensor expected = std::get<0>(scores.slice(-1, tile * 16).max(-1));
    EXPECT_TRUE(at::allclose(down.row_max.select(-1, tile), expected)) << "tile " << tile;
  }
  // Ascending differs from descending before the last step (the test can fail).
  const ExpectedTileStates up = expected_tile_states(in.q, in.k, scale, -1, -1, 16);
  EXPECT_FALSE(at::allclose(up.row_max.select(-1, 0), down.row_max.select(-1, 0)));
}

}  // namespace
}  // namespace flashlab
