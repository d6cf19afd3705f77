// fa2_mma_sm80 kernel template: the FlashAttention-2 forward pass on tensor cores
// with plain sm_80 instructions (mma.sync m16n8k16, ldmatrix, cp.async).
//
// Algorithm: a thread block owns kBlockQ query rows of one (batch, head); each
// warp owns kRowsPerWarp of them, whole m16 MMA row slabs (one slab = 16 rows;
// the defaults give a warp two). The Q tile is copied to shared memory once
// (and, when QInRegs, into registers); K/V tiles of kBlockK keys stream
// through a kStages-deep cp.async ring. Per key tile: S = Q K^T on tensor cores (fp32 accumulate), boundary
// tiles masked (sequence end, causal / sliding window, bottom-right aligned),
// online softmax in base 2 with the running max subtracted before exp2, P
// re-packed in registers as the A operand of O += P V (V read with
// ldmatrix.trans). Key tiles invisible to the whole query tile are skipped.
// The output is staged through the warp's own Q rows in shared memory so the
// global stores are 16-byte and coalesced.
//
// Tiling: Traits<HeadDim, BlockQ, BlockK, Warps, Stages, QInRegs>; shared rows
// are padded by 16 bytes so every ldmatrix phase hits 8 distinct bank groups.
//
// Limits: fp16 / bf16 only, head_dim a multiple of 32 (one instantiation per
// head dim), base pointers 16-byte aligned and strides multiples of 8 elements
// (cp.async moves 16 bytes), no tile tracing, no dropout.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"

namespace flashlab::fa2_mma_sm80 {

template <int HeadDim, int BlockQ, int BlockK, int Warps, int Stages, bool QInRegs>
struct Traits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockQ = BlockQ;
  static constexpr int kBlockK = BlockK;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kStages = Stages;
  static constexpr bool kQInRegs = QInRegs;
  static constexpr int kRowsPerWarp = BlockQ / Warps;
  static constexpr int kMTiles = kRowsPerWarp / 16;  // m16 slabs per warp
  // Elements per shared-memory row: head_dim plus 16 bytes of padding.
  static constexpr int kSmemStride = HeadDim + 8;
  static constexpr int kQTileElems = BlockQ * kSmemStride;
  static constexpr int kKVTileElems = BlockK * kSmemStride;
  static constexpr int kSmemBytes = (kQTileElems + 2 * Stages * kKVTileElems) * 2;

  static_assert(HeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static_assert(BlockQ % (16 * Warps) == 0, "each warp owns whole m16 slabs");
  static_assert(BlockK % 16 == 0, "key tile must be a multiple of 16");
  static_assert(Stages >= 2, "need at least double buffering");
};

// Default tile configuration for each supported head dim (what launches run).
// Two m16 slabs per warp (block_q 128, 4 warps) let each K/V fragment read from
// shared memory feed two MMAs: on H100 (bf16, 8x16 heads, seqlen 4096) that beat
// one slab per warp by 20-50%. Q stays in shared memory where keeping it in
// registers would spill; head_dim 256 keeps one slab per warp so O fits.
template <int HeadDim> struct DefaultTraits;
template <> struct DefaultTraits<32> { using type = Traits<32, 128, 64, 4, 2, true>; };
template <> struct DefaultTraits<64> { using type = Traits<64, 128, 128, 4, 2, false>; };
template <> struct DefaultTraits<96> { using type = Traits<96, 128, 64, 4, 2, false>; };
template <> struct DefaultTraits<128> { using type = Traits<128, 128, 64, 4, 2, false>; };
template <> struct DefaultTraits<256> { using type = Traits<256, 64, 32, 4, 2, false>; };

// Defined in fa2_mma_sm80.cu: empty when some tile configuration can run the
// problem (dtype, head_dim 32/64/96/128/256, compute capability, GQA ratio,
// grid limits, 16-byte alignment), else the reason. Host only.
std::string unsupported_reason(const AttentionParams& params);

// Defined in fa2_mma_sm80_hdim<D>.cu, one head dim per file.
template <int HeadDim>
void run_head_dim(const AttentionParams& params);
template <> void run_head_dim<32>(const AttentionParams& params);
template <> void run_head_dim<64>(const AttentionParams& params);
template <> void run_head_dim<96>(const AttentionParams& params);
template <> void run_head_dim<128>(const AttentionParams& params);
template <> void run_head_dim<256>(const AttentionParams& params);

// ---------------------------------------------------------------------------
// PTX wrappers.

__device__ __forceinline__ uint32_t smem_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
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

// 2^x with the hardware approximation (exp2f without fast-math adds range
// fix-ups); ex2.approx(-inf) = +0, which the masking relies on.
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

// ---------------------------------------------------------------------------
// Copies a Rows x HeadDim tile (row-major, row_stride elements apart) into
// padded shared memory; rows >= valid_rows are zero-filled without a read.
// Where the threads cover whole rows, each thread moves the same 16-byte
// column of every kRowsPerPass-th row: one pointer and one stride cover all
// its copies, which keeps registers free for the accumulators.
template <class Tr, int Rows, typename Element>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const Element* tile,
                                                int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = Tr::kHeadDim / 8;
  constexpr int kRowsPerPass = Tr::kThreads / kChunksPerRow;
  if constexpr (Tr::kThreads % kChunksPerRow == 0 && Rows % kRowsPerPass == 0) {
    const int row0 = threadIdx.x / kChunksPerRow;
    const int col = (threadIdx.x % kChunksPerRow) * 8;
    const Element* src = tile + row0 * row_stride + col;
    const uint32_t dst = smem_tile + (row0 * Tr::kSmemStride + col) * 2;
#pragma unroll
    for (int i = 0; i < Rows / kRowsPerPass; ++i) {
      const bool valid = row0 + i * kRowsPerPass < valid_rows;
      cp_async_16(dst + i * kRowsPerPass * Tr::kSmemStride * 2, valid ? src : tile, valid);
      src += kRowsPerPass * row_stride;
    }
  } else {  // e.g. head_dim 96: 12 chunks a row do not divide the thread count
    constexpr int kChunks = Rows * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < (kChunks + Tr::kThreads - 1) / Tr::kThreads; ++i) {
      const int chunk = threadIdx.x + i * Tr::kThreads;
      if (kChunks % Tr::kThreads == 0 || chunk < kChunks) {
        const int row = chunk / kChunksPerRow;
        const int col = (chunk % kChunksPerRow) * 8;
        const bool valid = row < valid_rows;
        cp_async_16(smem_tile + (row * Tr::kSmemStride + col) * 2,
                    valid ? tile + row * row_stride + col : tile, valid);
      }
    }
  }
}

template <class Tr, typename Element>
__global__ void __launch_bounds__(Tr::kThreads) fa2_forward_kernel(const AttentionParams p) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kBQ = Tr::kBlockQ;
  constexpr int kBK = Tr::kBlockK;
  constexpr int kMT = Tr::kMTiles;
  constexpr int kStride = Tr::kSmemStride;
  constexpr int kSTiles = kBK / 8;   // n8 tiles of S per m16 slab
  constexpr int kOTiles = kD / 8;    // n8 tiles of O per m16 slab
  constexpr int kDSteps = kD / 16;   // k16 steps of Q K^T
  constexpr int kKSteps = kBK / 16;  // k16 steps of P V
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(16) unsigned char smem[];
  Element* q_smem = reinterpret_cast<Element*>(smem);
  const uint32_t q_smem_addr = smem_address(q_smem);
  const uint32_t k_smem_addr = q_smem_addr + Tr::kQTileElems * 2;
  const uint32_t v_smem_addr = k_smem_addr + Tr::kStages * Tr::kKVTileElems * 2;

  // Highest query tiles first: under a causal mask they have the most key tiles,
  // so the long blocks start early and the short ones fill the tail.
  const int q_tile = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y;
  const int batch = blockIdx.z;

  // Per-batch sequence lengths and row offsets (packed tokens when varlen).
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  int64_t q_offset, o_offset, k_offset, v_offset, lse_row0 = 0;
  if (p.cu_seqlens_q != nullptr) {
    const int start = p.cu_seqlens_q[batch];
    seqlen_q = p.cu_seqlens_q[batch + 1] - start;
    q_offset = start * p.q_row_stride;
    o_offset = start * p.out_row_stride;
    lse_row0 = start;
  } else {
    q_offset = batch * p.q_batch_stride;
    o_offset = batch * p.out_batch_stride;
  }
  if (p.cu_seqlens_k != nullptr) {
    const int start = p.cu_seqlens_k[batch];
    seqlen_k = p.cu_seqlens_k[batch + 1] - start;
    k_offset = start * p.k_row_stride;
    v_offset = start * p.v_row_stride;
  } else {
    k_offset = batch * p.k_batch_stride;
    v_offset = batch * p.v_batch_stride;
  }
  const int q0 = q_tile * kBQ;
  if (q0 >= seqlen_q) return;

  const int kv_head = head / (p.heads / p.kv_heads);
  const Element* q_ptr = static_cast<const Element*>(p.q) + q_offset + head * p.q_head_stride;
  const Element* k_ptr = static_cast<const Element*>(p.k) + k_offset + kv_head * p.k_head_stride;
  const Element* v_ptr = static_cast<const Element*>(p.v) + v_offset + kv_head * p.v_head_stride;
  Element* o_ptr = static_cast<Element*>(p.out) + o_offset + head * p.out_head_stride;
  float* lse_ptr = p.lse == nullptr ? nullptr
                                    : p.lse + batch * p.lse_batch_stride +
                                          head * p.lse_head_stride + lse_row0;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;         // row within an 8-row half of the mma tile
  const int thread_in_group = lane % 4;
  const int warp_row0 = warp * Tr::kRowsPerWarp;  // first row of this warp in the tile

  // Keys visible to at least one row of this query tile (bottom-right aligned).
  const int diagonal = seqlen_k - seqlen_q;  // key index aligned with query row 0
  const int q_last = min(q0 + kBQ, seqlen_q) - 1;
  const int window_left = p.window_left, window_right = p.window_right;
  int key_begin = 0, key_end = seqlen_k;
  if (window_left >= 0) key_begin = max(0, q0 + diagonal - window_left);
  if (window_right >= 0) key_end = min(seqlen_k, q_last + diagonal + window_right + 1);
  const int tile_begin = key_begin / kBK;
  const int tile_end = key_end > key_begin ? (key_end + kBK - 1) / kBK : tile_begin;

  // Online-softmax state: two rows per thread per m16 slab (group, group + 8).
  float row_max[kMT][2];
  float row_sum[kMT][2];
  float acc_o[kMT][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = -INFINITY;
      row_sum[mt][h] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][n][i] = 0.f;
  }

  const float scale_log2 = p.softmax_scale * kLog2e;

  if (tile_begin < tile_end) {
    // Prologue: Q (joins the first group) and the first kStages-1 K/V tiles.
    load_tile_async<Tr, kBQ>(q_smem_addr, q_ptr + q0 * p.q_row_stride, p.q_row_stride,
                             seqlen_q - q0);
    auto load_kv = [&](int tile, int stage) {
      const int k0 = tile * kBK;
      load_tile_async<Tr, kBK>(k_smem_addr + stage * Tr::kKVTileElems * 2,
                               k_ptr + k0 * p.k_row_stride, p.k_row_stride, seqlen_k - k0);
      load_tile_async<Tr, kBK>(v_smem_addr + stage * Tr::kKVTileElems * 2,
                               v_ptr + k0 * p.v_row_stride, p.v_row_stride, seqlen_k - k0);
    };
#pragma unroll
    for (int s = 0; s < Tr::kStages - 1; ++s) {
      if (tile_begin + s < tile_end) load_kv(tile_begin + s, s);
      cp_async_commit();
    }

    // ldmatrix lane addressing (byte offsets within a tile).
    // A operand (Q): lanes 0-15 rows 0-15 at col 0, lanes 16-31 rows 0-15 at col 8.
    const uint32_t q_lane_offset =
        ((warp_row0 + (lane & 15)) * kStride + (lane >> 4) * 8) * 2;
    // B operand from K (non-transposed): matrices (keys 0-7, d 0-7), (keys 0-7, d 8-15),
    // (keys 8-15, d 0-7), (keys 8-15, d 8-15).
    const uint32_t k_lane_offset =
        (((lane & 7) + ((lane >> 4) << 3)) * kStride + ((lane >> 3) & 1) * 8) * 2;
    // B operand from V (transposed): matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7),
    // (keys 0-7, d 8-15), (keys 8-15, d 8-15).
    const uint32_t v_lane_offset = (((lane & 15)) * kStride + (lane >> 4) * 8) * 2;

    uint32_t q_frag[Tr::kQInRegs ? kMT : 1][Tr::kQInRegs ? kDSteps : 1][4];

    for (int tile = tile_begin; tile < tile_end; ++tile) {
      const int iteration = tile - tile_begin;
      const int stage = iteration % Tr::kStages;
      cp_async_wait<Tr::kStages - 2>();
      __syncthreads();  // tile `tile` visible to all; stage of tile-1 free for reuse
      {
        const int next = tile + Tr::kStages - 1;
        if (next < tile_end) load_kv(next, (iteration + Tr::kStages - 1) % Tr::kStages);
        cp_async_commit();
      }
      if constexpr (Tr::kQInRegs) {
        if (iteration == 0) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int ks = 0; ks < kDSteps; ++ks)
              ldmatrix_x4(q_frag[mt][ks], q_smem_addr + q_lane_offset +
                                              (mt * 16 * kStride + ks * 16) * 2);
        }
      }

      const uint32_t k_stage = k_smem_addr + stage * Tr::kKVTileElems * 2 + k_lane_offset;
      const uint32_t v_stage = v_smem_addr + stage * Tr::kKVTileElems * 2 + v_lane_offset;

      // S = Q K^T for this warp's rows and the kBK keys of the tile.
      float acc_s[kMT][kSTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int n = 0; n < kSTiles; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_s[mt][n][i] = 0.f;

#pragma unroll
      for (int ks = 0; ks < kDSteps; ++ks) {
        uint32_t a_frag[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (Tr::kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a_frag[mt][i] = q_frag[mt][ks][i];
          } else {
            ldmatrix_x4(a_frag[mt],
                        q_smem_addr + q_lane_offset + (mt * 16 * kStride + ks * 16) * 2);
          }
        }
#pragma unroll
        for (int nk = 0; nk < kBK / 16; ++nk) {
          uint32_t b[4];
          ldmatrix_x4(b, k_stage + (nk * 16 * kStride + ks * 16) * 2);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<Element>(acc_s[mt][2 * nk], a_frag[mt], b[0], b[1]);
            mma_16816<Element>(acc_s[mt][2 * nk + 1], a_frag[mt], b[2], b[3]);
          }
        }
      }

      // Mask only tiles that some row of the query tile does not see whole.
      const int k0 = tile * kBK;
      const bool needs_mask =
          k0 + kBK > seqlen_k ||
          (window_right >= 0 && k0 + kBK - 1 > q0 + diagonal + window_right) ||
          (window_left >= 0 && k0 < q0 + kBQ - 1 + diagonal - window_left);
      if (needs_mask) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = q0 + warp_row0 + mt * 16 + group + h * 8;
            const int key_hi = window_right >= 0 ? min(seqlen_k - 1, row + diagonal + window_right)
                                                 : seqlen_k - 1;
            const int key_lo = window_left >= 0 ? row + diagonal - window_left : 0;
#pragma unroll
            for (int n = 0; n < kSTiles; ++n)
#pragma unroll
              for (int i = 0; i < 2; ++i) {
                const int key = k0 + n * 8 + thread_in_group * 2 + i;
                if (key < key_lo || key > key_hi) acc_s[mt][n][h * 2 + i] = -INFINITY;
              }
          }
      }

      // Online softmax (base 2); P overwrites S in place.
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float tile_max = row_max[mt][h];
#pragma unroll
          for (int n = 0; n < kSTiles; ++n)
            tile_max = fmaxf(tile_max, fmaxf(acc_s[mt][n][h * 2], acc_s[mt][n][h * 2 + 1]));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          // A row with nothing visible yet keeps max -inf; subtract 0 then so
          // exp2(-inf) gives 0 instead of exp2(-inf + inf) = NaN.
          const float max_scaled = tile_max == -INFINITY ? 0.f : tile_max * scale_log2;
          const float correction = fast_exp2(row_max[mt][h] * scale_log2 - max_scaled);
          row_max[mt][h] = tile_max;
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < kSTiles; ++n)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const float prob = fast_exp2(fmaf(acc_s[mt][n][h * 2 + i], scale_log2, -max_scaled));
              acc_s[mt][n][h * 2 + i] = prob;
              sum += prob;
            }
          // Per-thread partial sums; the quad is reduced once at the end.
          row_sum[mt][h] = row_sum[mt][h] * correction + sum;
#pragma unroll
          for (int n = 0; n < kOTiles; ++n) {
            acc_o[mt][n][h * 2] *= correction;
            acc_o[mt][n][h * 2 + 1] *= correction;
          }
        }

      // O += P V, P re-packed from the S accumulator layout into A fragments.
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t p_frag[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          p_frag[mt][0] = pack2<Element>(acc_s[mt][2 * kk][0], acc_s[mt][2 * kk][1]);
          p_frag[mt][1] = pack2<Element>(acc_s[mt][2 * kk][2], acc_s[mt][2 * kk][3]);
          p_frag[mt][2] = pack2<Element>(acc_s[mt][2 * kk + 1][0], acc_s[mt][2 * kk + 1][1]);
          p_frag[mt][3] = pack2<Element>(acc_s[mt][2 * kk + 1][2], acc_s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int nd = 0; nd < kD / 16; ++nd) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_stage + (kk * 16 * kStride + nd * 16) * 2);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            mma_16816<Element>(acc_o[mt][2 * nd], p_frag[mt], b[0], b[1]);
            mma_16816<Element>(acc_o[mt][2 * nd + 1], p_frag[mt], b[2], b[3]);
          }
        }
      }
    }
    cp_async_wait<0>();  // only empty groups remain; drain before reusing Q smem
  }

  // Finalize: reduce the row sums over the quad, normalize, write the LSE.
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[mt][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const bool any_visible = sum > 0.f;
      const float inv_sum = any_visible ? 1.f / sum : 0.f;
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        acc_o[mt][n][h * 2] *= inv_sum;
        acc_o[mt][n][h * 2 + 1] *= inv_sum;
      }
      const int row = q0 + warp_row0 + mt * 16 + group + h * 8;
      if (lse_ptr != nullptr && thread_in_group == 0 && row < seqlen_q)
        lse_ptr[row] = any_visible ? row_max[mt][h] * p.softmax_scale + logf(sum) : -INFINITY;
    }

  // Stage O through this warp's own Q rows (no other warp reads them), then
  // write 16-byte chunks of whole rows.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = warp_row0 + mt * 16 + group + h * 8;
        const int col = n * 8 + thread_in_group * 2;
        *reinterpret_cast<uint32_t*>(q_smem + row * kStride + col) =
            pack2<Element>(acc_o[mt][n][h * 2], acc_o[mt][n][h * 2 + 1]);
      }
  __syncwarp();
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kChunks = Tr::kRowsPerWarp * kChunksPerRow;
  static_assert(kChunks % 32 == 0, "whole-warp output copy");
#pragma unroll
  for (int i = 0; i < kChunks / 32; ++i) {
    const int chunk = lane + i * 32;
    const int row = warp_row0 + chunk / kChunksPerRow;
    const int col = (chunk % kChunksPerRow) * 8;
    if (q0 + row < seqlen_q) {
      const uint4 value = *reinterpret_cast<const uint4*>(q_smem + row * kStride + col);
      *reinterpret_cast<uint4*>(o_ptr + (q0 + row) * p.out_row_stride + col) = value;
    }
  }
}

template <class Tr, typename Element>
void launch_forward(const AttentionParams& params) {
  auto kernel = fa2_forward_kernel<Tr, Element>;
  constexpr int kSmem = Tr::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) {
    FLASHLAB_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  }
  const dim3 grid((params.seqlen_q + Tr::kBlockQ - 1) / Tr::kBlockQ, params.heads,
                  params.batch);
  kernel<<<grid, Tr::kThreads, kSmem, static_cast<cudaStream_t>(params.stream)>>>(params);
  FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80", params);
}

// Dispatch on the element type for one tile configuration.
template <class Tr>
void launch_for_dtype(const AttentionParams& params) {
  if (params.dtype == DataType::bfloat16)
    launch_forward<Tr, __nv_bfloat16>(params);
  else
    launch_forward<Tr, __half>(params);
}

}  // namespace flashlab::fa2_mma_sm80
