// fa2_mma_sm80's answer to "where is this element" (KernelVariant::locate):
// host-only layout arithmetic for the default tiling (DefaultTraits), no
// device code (fa2_mma_sm80_locate.cpp).
#pragma once

#include "flashlab/kernel_registry.h"

namespace flashlab::fa2_mma_sm80 {

ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col);

}  // namespace flashlab::fa2_mma_sm80
