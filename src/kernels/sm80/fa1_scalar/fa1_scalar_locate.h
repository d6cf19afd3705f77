// fa1_scalar's answer to "where is this element" (KernelVariant::locate):
// host-only layout arithmetic, no device code (fa1_scalar_locate.cpp).
#pragma once

#include "flashlab/kernel_registry.h"

namespace flashlab::fa1_scalar {

// One thread per query row: block (query tile, head, batch), thread row % 64,
// O in accumulator[col], m and l in running_max / running_sum.
ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col);

// The launch's tiling (kBlockQ, kBlockK of fa1_scalar_kernel.cuh), defined in
// fa1_scalar.cu so the numbers have one home.
TileShape launch_tiles();

}  // namespace flashlab::fa1_scalar
