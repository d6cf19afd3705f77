// Shared-memory tile layouts for ldmatrix operands and cp.async destinations
// (host-visible so tiling traits can name them; the offsets are plain integers).
#pragma once

#include <cstdint>

#include "flashlab/kernel_params.h"  // FLASHLAB_HOST_DEVICE

namespace flashlab::sm80 {

// Shared-memory layouts of a tile of 16-byte chunks (8 16-bit elements), rows
// of RowBytes, as ldmatrix operands and cp.async destinations:
// - PaddedRows: each row RowBytes apart, its data then padding (a row 16 bytes
//   longer than its data puts the 8 rows of an ldmatrix phase in 8 bank groups).
//   A 16-byte-shifted row straddles 128-byte segments, so cp.async writes of
//   whole rows cost more wavefronts and L2 sectors than they carry.
// - SwizzledRows: rows of exactly RowBytes (a multiple of 128), chunk c of row r
//   stored at c ^ (r % 8) within its 128-byte group (conflict-free ldmatrix, and
//   cp.async writes that fill whole segments). Moving a lane address by a
//   compile-time number of rows (a multiple of 8) and chunks is one XOR and an
//   add, valid when the chunks' low three bits share no bit with the lane's own
//   chunk (kernels keep lane chunks and offsets in disjoint bits).
// chunk_offset: byte offset of (row, chunk) from the tile; advance: a lane's
// address moved by `rows` rows and `chunks` chunks (constants after unrolling).
template <int RowBytes>
struct PaddedRows {
  static constexpr int kRowBytes = RowBytes;
  static constexpr int kRowPeriod = 1;  // rows with the same chunk placement: every one
  FLASHLAB_HOST_DEVICE static constexpr uint32_t chunk_offset(int row, int chunk) {
    return row * RowBytes + chunk * 16;
  }
  FLASHLAB_HOST_DEVICE static constexpr uint32_t advance(uint32_t lane_address, int rows, int chunks) {
    return lane_address + rows * RowBytes + chunks * 16;
  }
};
template <int RowBytes>
struct SwizzledRows {
  static_assert(RowBytes % 128 == 0, "swizzled rows are whole 128-byte groups");
  static constexpr int kRowBytes = RowBytes;
  static constexpr int kRowPeriod = 8;  // advance moves by whole periods of rows
  FLASHLAB_HOST_DEVICE static constexpr uint32_t chunk_offset(int row, int chunk) {
    return row * RowBytes + ((chunk ^ (row & 7)) << 4);
  }
  FLASHLAB_HOST_DEVICE static constexpr uint32_t advance(uint32_t lane_address, int rows, int chunks) {
    return (lane_address ^ ((chunks & 7) << 4)) + rows * RowBytes + (chunks & ~7) * 16;
  }
};

}  // namespace flashlab::sm80
