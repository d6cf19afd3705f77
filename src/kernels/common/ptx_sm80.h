// PTX wrappers for sm_80-class kernels: cp.async, ldmatrix, mma.sync m16n8k16,
// a warp-level GEMM from shared memory, ex2.approx, 16-bit packing and float
// reductions to global memory. All of them are valid on sm_80 and later
// (sm_90a included), so Hopper kernels may use them too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/smem_layout.h"

namespace flashlab::sm80 {

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// The same with an L2 prefetch hint of PrefetchBytes (128 or 256): the L2
// fetches that aligned span around the address (for streams whose rows are
// that long, e.g. a KV cache's key rows: 128 bytes at head_dim 64, 256 at 128).
template <int PrefetchBytes>
__device__ __forceinline__ void cp_async_16_l2(uint32_t dst, const void* src, bool valid) {
  static_assert(PrefetchBytes == 128 || PrefetchBytes == 256, "cp.async takes L2::128B or L2::256B");
  const int src_bytes = valid ? 16 : 0;
  if constexpr (PrefetchBytes == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
  else
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
}
// 4-byte async copy (through L1: cp.async allows 4 bytes with .ca only);
// valid = false zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// c += a * b for one m16n8k16 tile, fp32 accumulators.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One 16-key (or 16-column) step of a warp's GEMM over kMT m16 row slabs: a
// single ldmatrix.x4 brings the 16x16 B block at b_address (transposed for V)
// and feeds 2 * kMT MMAs, acc[mt][2 * n16] and acc[mt][2 * n16 + 1] += a[mt] * B.
template <typename Element, bool kTransposeB, int kMT, int kNTiles>
__device__ __forceinline__ void mma_b_block(float (&acc)[kMT][kNTiles][4], int n16,
                                            const uint32_t (&a)[kMT][4], uint32_t b_address) {
  uint32_t b[4];
  if constexpr (kTransposeB)
    ldmatrix_x4_trans(b, b_address);
  else
    ldmatrix_x4(b, b_address);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    mma_16816<Element>(acc[mt][2 * n16], a[mt], b[0], b[1]);
    mma_16816<Element>(acc[mt][2 * n16 + 1], a[mt], b[2], b[3]);
  }
}

// ---------------------------------------------------------------------------
// ldmatrix.x4 lane addressing. One x4 load reads four 8x8 matrices of 16-bit
// elements; lane l gives the address of row (l % 8) of matrix (l / 8). Without
// .trans thread t receives (row t/4, columns 2(t%4), 2(t%4)+1) of each matrix,
// with .trans (rows 2(t%4), 2(t%4)+1, column t/4). For a 16x16 block of a
// row-major shared tile, two lane patterns feed every operand of mma m16n8k16
// (a0..a3 = A rows 0-7/8-15 x k 0-7/8-15 in the order (0-7,0-7), (8-15,0-7),
// (0-7,8-15), (8-15,8-15); a B pair = b0, b1 of n-tile 0 then b0, b1 of n-tile
// 1, which is what mma_b_block expects):
//
// ldmatrix_cell_rows16: lanes 0-15 rows 0-15 at chunk 0, lanes 16-31 rows
//   0-15 at chunk 1; matrices (r0-7, c0-7), (r8-15, c0-7), (r0-7, c8-15), (r8-15, c8-15).
//   - the A operand from [m][k] storage with ldmatrix (Q, dO, dS as A);
//   - a B pair from [k][n] storage with ldmatrix.trans (V, dO, Q, K as B).
// ldmatrix_cell_pairs: matrices (r0-7, c0-7), (r0-7, c8-15), (r8-15, c0-7), (r8-15, c8-15).
//   - a B pair from [n][k] storage with ldmatrix (K, V as B of Q K^T, dO V^T);
//   - the A operand from [k][m] storage with ldmatrix.trans (P^T, dS^T as A):
//     a1 = A(m 8-15, k 0-7) is stored at (k 0-7, m 8-15) = matrix (r0-7, c8-15).
// A cell is the lane's (row, 16-byte chunk) within the 16x16 block; a tile's
// layout (common/smem_layout.h) turns it into a byte offset (chunk_offset).
struct LaneCell {
  int row, chunk;
};
__device__ __forceinline__ LaneCell ldmatrix_cell_rows16(int lane) { return {lane & 15, lane >> 4}; }
__device__ __forceinline__ LaneCell ldmatrix_cell_pairs(int lane) {
  return {(lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1};
}
// The same as element offsets in a tile of rows `stride` elements apart.
__device__ __forceinline__ int ldmatrix_offset_rows16(int lane, int stride) {
  const LaneCell cell = ldmatrix_cell_rows16(lane);
  return cell.row * stride + cell.chunk * 8;
}
__device__ __forceinline__ int ldmatrix_offset_pairs(int lane, int stride) {
  const LaneCell cell = ldmatrix_cell_pairs(lane);
  return cell.row * stride + cell.chunk * 8;
}

// acc[kMT][kNT][4] += A * B for one warp, both operands in shared memory
// (16-bit elements, tiles laid out as ALayout / BLayout), kKSteps steps of
// k16. A is kMT*16 x kKSteps*16, B is kKSteps*16 x kNT*8; the accumulator
// tile (mt, n) covers rows mt*16.. and columns n*8.. (mma C layout: c0, c1 at
// row lane/4, columns 2(lane%4)+{0,1}; c2, c3 eight rows lower).
//   kATransposed false: A stored [m][k]; a_lane = the address of its ldmatrix_cell_rows16 cell.
//   kATransposed true:  A stored [k][m] (A^T row-major); a_lane = that of its ldmatrix_cell_pairs cell.
//   kBTransposed false: B stored [n][k]; b_lane = that of its ldmatrix_cell_pairs cell.
//   kBTransposed true:  B stored [k][n]; b_lane = that of its ldmatrix_cell_rows16 cell.
// (a_lane, b_lane: shared-memory byte addresses of the lane's row and chunk in
// its layout, tile origin included.)
template <typename Element, bool kATransposed, bool kBTransposed, int kKSteps, class ALayout,
          class BLayout, int kMT, int kNT>
__device__ __forceinline__ void warp_gemm_smem(float (&acc)[kMT][kNT][4], uint32_t a_lane,
                                               uint32_t b_lane) {
  static_assert(kNT % 2 == 0, "B is read in 16-column blocks (pairs of n8 tiles)");
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    uint32_t a[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      if constexpr (kATransposed)
        ldmatrix_x4_trans(a[mt], ALayout::advance(a_lane, ks * 16, mt * 2));
      else
        ldmatrix_x4(a[mt], ALayout::advance(a_lane, mt * 16, ks * 2));
    }
#pragma unroll
    for (int nb = 0; nb < kNT / 2; ++nb) {
      const uint32_t b = kBTransposed ? BLayout::advance(b_lane, ks * 16, nb * 2)
                                      : BLayout::advance(b_lane, nb * 16, ks * 2);
      mma_b_block<Element, kBTransposed>(acc, nb, a, b);
    }
  }
}

// 2^x with the hardware approximation (exp2f without fast-math adds range
// fix-ups); ex2.approx(-inf) = +0, which masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Two floats -> one register holding two 16-bit values (low = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// One register holding two 16-bit values -> two floats (x = low).
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t packed) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&packed));
  }
}

// *address += value in global memory, no result returned (red.global.add:
// relaxed, gpu scope). Reductions of one thread to one address take effect in
// program order.
__device__ __forceinline__ void red_add_f32(float* address, float value) {
  asm volatile("red.global.add.f32 [%0], %1;\n" ::"l"(address), "f"(value) : "memory");
}

// address[0..3] += a, b, c, d in one 16-byte vector reduction on sm_90 and
// newer (four scalar ones before); address 16-byte aligned.
__device__ __forceinline__ void red_add_f32x4(float* address, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(a), "f"(b),
               "f"(c), "f"(d)
               : "memory");
#else
  red_add_f32(address, a);
  red_add_f32(address + 1, b);
  red_add_f32(address + 2, c);
  red_add_f32(address + 3, d);
#endif
}

// Programmatic dependent launch (sm_90 and newer; no-ops before). A kernel
// launched after this one on the same stream with
// cudaLaunchAttributeProgrammaticStreamSerialization may be scheduled once
// every block of this grid has called pdl_launch_dependents (or exited); it
// calls pdl_wait_for_prerequisite_grid before touching this grid's results,
// which returns when this grid has completed and its writes are visible. The
// dependent's launch latency then hides under this grid's tail.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace flashlab::sm80
