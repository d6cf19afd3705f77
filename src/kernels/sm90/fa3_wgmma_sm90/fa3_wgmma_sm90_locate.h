// fa3_wgmma_sm90's answer to "where is this element" (KernelVariant::locate):
// host-only layout arithmetic for the default tiling, no device code
// (fa3_wgmma_sm90_locate.cpp).
#pragma once

#include "flashlab/kernel_registry.h"

namespace flashlab::fa3_wgmma_sm90 {

// The persistent grid's CTA depends on the device (SM count, L2 size): the
// hook assumes an H100 SXM, these two.
inline constexpr int kLocateMultiprocessors = 132;
inline constexpr int kLocateL2Bytes = 50 * 1024 * 1024;

ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col);
// The same on a device with these limits (tests; other GPUs).
ElementLocation locate_on(const AttentionParams& params, int batch, int head, int row, int col,
                          int multiprocessors, int l2_bytes);

// The backward's (fa3_wgmma_sm90_bwd_locate.cpp): dK/dV of key row `row`
// (kv head head / group) and dQ of query row `row` (head `head`).
BackwardElementLocation locate_backward(const AttentionBackwardParams& params, int batch, int head, int row,
                                        int col);

}  // namespace flashlab::fa3_wgmma_sm90
