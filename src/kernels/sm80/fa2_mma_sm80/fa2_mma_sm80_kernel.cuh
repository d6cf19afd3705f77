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
// Tiling: Traits<HeadDim, BlockQ, BlockK, Warps, Stages, QInRegs> (fa2_mma_sm80.h);
// shared rows are padded by 16 bytes so every ldmatrix phase hits 8 distinct
// bank groups. The visible-key rule, the sequence view and the online-softmax
// update come from src/kernels/common/.
//
// Limits: fp16 / bf16 only, head_dim a multiple of 32 (one instantiation per
// head dim), base pointers 16-byte aligned and strides multiples of 8 elements
// (cp.async moves 16 bytes), no dropout.
//
// Tile tracing: Trace = true is a separate instantiation (the default tilings
// only; launch_forward picks it when params.trace.enabled()) that also records
// each row's m and l after every key tile it visits (record_tile_state,
// common/tile_trace.h); the untraced, timed build has no trace code.
// Score modifications (softcap, ALiBi, sinks: common/score_modification.h)
// are kModifier instantiations (ModifierKind: sinks alone, or all; default
// tilings, untraced): S elements
// through the policy before the mask, each row's max from the sink.
// kPlantedSkipRescaleTile >= 0 is the test-only planted bug
// (src/kernels/dev/fa2_mma_sm80_planted_bug): on that key tile the rescale of
// l and O is skipped. Registered builds use -1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/online_softmax.h"
#include "common/ptx_sm80.h"
#include "common/score_modification.h"
#include "common/sequence_view.h"
#include "common/tile_trace.h"
#include "common/mask.h"
#include "common/visible_keys.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab::fa2_mma_sm80 {

using namespace ::flashlab::sm80;  // cp.async, ldmatrix, mma, mma_b_block, fast_exp2, pack2

// ---------------------------------------------------------------------------
// Copies a Rows x HeadDim tile (row-major, row_stride elements apart) into
// shared memory laid out as Layout (by default rows of Tr::kSmemStride elements:
// padded); rows >= valid_rows are zero-filled without a read.
// Where the threads cover whole rows, each thread moves the same 16-byte
// column of every kRowsPerPass-th row: one pointer and one stride cover all
// its copies, which keeps registers free for the accumulators.
// kFullTilePath: tiles with every row valid take a copy loop without the
// per-row checks (the backward refills Q and dO every step, and all of its
// query blocks but a sequence's last are full); the forward keeps one loop.
template <class Tr, int Rows, class Layout = PaddedRows<Tr::kSmemStride * 2>,
          bool kFullTilePath = false, typename Element>
__device__ __forceinline__ void load_tile_async(uint32_t smem_tile, const Element* tile,
                                                int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = Tr::kHeadDim / 8;
  constexpr int kRowsPerPass = Tr::kThreads / kChunksPerRow;
  if constexpr (Tr::kThreads % kChunksPerRow == 0 && Rows % kRowsPerPass == 0) {
    const int row0 = threadIdx.x / kChunksPerRow;
    const int chunk = threadIdx.x % kChunksPerRow;
    static_assert(kRowsPerPass % Layout::kRowPeriod == 0, "each pass keeps the thread's chunk position");
    const Element* src = tile + row0 * row_stride + chunk * 8;
    const uint32_t dst = smem_tile + Layout::chunk_offset(row0, chunk);
    if (kFullTilePath && valid_rows >= Rows) {
#pragma unroll
      for (int i = 0; i < Rows / kRowsPerPass; ++i)
        cp_async_16(Layout::advance(dst, i * kRowsPerPass, 0), src + i * kRowsPerPass * row_stride, true);
      return;
    }
#pragma unroll
    for (int i = 0; i < Rows / kRowsPerPass; ++i) {
      const bool valid = row0 + i * kRowsPerPass < valid_rows;
      cp_async_16(Layout::advance(dst, i * kRowsPerPass, 0), valid ? src : tile, valid);
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
        cp_async_16(smem_tile + Layout::chunk_offset(row, col / 8),
                    valid ? tile + row * row_stride + col : tile, valid);
      }
    }
  }
}

template <class Tr, typename Element, bool Trace, int kPlantedSkipRescaleTile,
          ModifierKind kModifier = ModifierKind::none>
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
  const SequenceView view = sequence_view(p, batch);
  const int seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
  const int q0 = q_tile * kBQ;
  if (q0 >= seqlen_q) return;

  const int kv_head = head / (p.heads / p.kv_heads);
  const Element* q_ptr = static_cast<const Element*>(p.q) + view.q_offset + head * p.q_head_stride;
  const Element* k_ptr = static_cast<const Element*>(p.k) + view.k_offset + kv_head * p.k_head_stride;
  const Element* v_ptr = static_cast<const Element*>(p.v) + view.v_offset + kv_head * p.v_head_stride;
  Element* o_ptr = static_cast<Element*>(p.out) + view.out_offset + head * p.out_head_stride;
  float* lse_ptr = p.lse == nullptr ? nullptr
                                    : p.lse + batch * p.lse_batch_stride +
                                          head * p.lse_head_stride + view.lse_row0;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int group = lane / 4;         // row within an 8-row half of the mma tile
  const int thread_in_group = lane % 4;
  const int warp_row0 = warp * Tr::kRowsPerWarp;  // first row of this warp in the tile

  // Key tiles visible to at least one row of this query tile; the rest are skipped.
  const int window_left = p.window_left, window_right = p.window_right;
  const VisibleKeyMask mask{seqlen_q, seqlen_k, window_left, window_right};
  const KeyRange tile_keys = visible_keys_of_rows(q0, min(q0 + kBQ, seqlen_q) - 1, seqlen_q,
                                                  seqlen_k, window_left, window_right);
  const int tile_begin = tile_keys.first / kBK;
  const int tile_end = tile_keys.empty() ? tile_begin : tile_keys.last / kBK + 1;
  const auto modifier = kind_modifier<kModifier, /*kFastTanh=*/true>(p, batch, head, seqlen_q, seqlen_k);

  // Online-softmax state: two rows per thread per m16 slab (group, group + 8).
  float row_max[kMT][2];
  float row_sum[kMT][2];
  float acc_o[kMT][kOTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = modifier.initial_row_max();
      row_sum[mt][h] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_o[mt][n][i] = 0.f;
  }

  const float scale_log2 = p.softmax_scale * kLog2e;
  const auto exp2 = [](float x) { return fast_exp2(x); };

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
        for (int nk = 0; nk < kBK / 16; ++nk)
          mma_b_block<Element, /*kTransposeB=*/false>(acc_s, nk, a_frag,
                                                      k_stage + (nk * 16 * kStride + ks * 16) * 2);
      }

      const int k0 = tile * kBK;
      if constexpr (decltype(modifier)::kScores) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            modifier.template apply_row<kSTiles>(q0 + warp_row0 + mt * 16 + group + h * 8, k0, thread_in_group * 2,
                                        [&](int n, int i) -> float& { return acc_s[mt][n][h * 2 + i]; });
      }
      // Mask only tiles that some row of the query tile does not see whole
      // (the sequence end counts: visible keys stop at seqlen_k - 1).
      if (mask.needs_mask(q0, q0 + kBQ - 1, k0, k0 + kBK - 1)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            mask.apply_row<kSTiles>(q0 + warp_row0 + mt * 16 + group + h * 8, k0, thread_in_group * 2,
                                    [&](int n, int i) -> float& { return acc_s[mt][n][h * 2 + i]; });
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
          float offset;
          float correction =
              online_softmax_rescale(row_max[mt][h], tile_max, scale_log2, offset, exp2);
          if constexpr (kPlantedSkipRescaleTile >= 0) {
            // The planted bug: on this key tile l and O keep the old max's scale.
            if (tile == kPlantedSkipRescaleTile) correction = 1.f;
          }
          float sum = 0.f;
#pragma unroll
          for (int n = 0; n < kSTiles; ++n)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              const float prob = softmax_probability(acc_s[mt][n][h * 2 + i], scale_log2, offset, exp2);
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
          if constexpr (Trace) {
            const float running_sum = quad_sum(row_sum[mt][h]);  // the row's l (whole warp)
            const int row = q0 + warp_row0 + mt * 16 + group + h * 8;
            if (thread_in_group == 0 && row < seqlen_q) {
              // Plain locals, so a cuda-gdb condition can name them (with tile, batch, head).
              const float running_max = row_max[mt][h] * p.softmax_scale;  // natural-log units
              // cuda-gdb: the online-softmax state of this row after `tile` (tests/debug uses this line).
              record_tile_state(p, batch, head, row, tile, running_max, running_sum);
            }
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
        for (int nd = 0; nd < kD / 16; ++nd)
          mma_b_block<Element, /*kTransposeB=*/true>(acc_o, nd, p_frag,
                                                     v_stage + (kk * 16 * kStride + nd * 16) * 2);
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
      if (!modifier.max_is_sink(row_max[mt][h]))
        sum = row_sum_as_pv_saw_it<Element>(sum, row_max[mt][h], scale_log2, exp2);
      modifier.add_sink_term(sum, row_max[mt][h], scale_log2, exp2);
      const SoftmaxResult result = online_softmax_finish(row_max[mt][h], sum, p.softmax_scale);
#pragma unroll
      for (int n = 0; n < kOTiles; ++n) {
        acc_o[mt][n][h * 2] *= result.inverse_sum;
        acc_o[mt][n][h * 2 + 1] *= result.inverse_sum;
      }
      const int row = q0 + warp_row0 + mt * 16 + group + h * 8;
      if (lse_ptr != nullptr && thread_in_group == 0 && row < seqlen_q) lse_ptr[row] = result.lse;
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

// kPlantedSkipRescaleTile: -1, or the planted bug's key tile (test-only).
template <class Tr, typename Element, int kPlantedSkipRescaleTile = -1>
void launch_forward(const AttentionParams& params) {
  // The traced instantiation exists for the default tilings and the planted
  // bug; the tuning tilings do not record tile states.
  constexpr bool kTraceable = kPlantedSkipRescaleTile >= 0 ||
                              std::is_same_v<Tr, typename DefaultTraits<Tr::kHeadDim>::type>;
  auto kernel = fa2_forward_kernel<Tr, Element, false, kPlantedSkipRescaleTile>;
  if constexpr (kTraceable) {
    if (params.trace.enabled()) kernel = fa2_forward_kernel<Tr, Element, true, kPlantedSkipRescaleTile>;
    // Score modifications: the registered (default) tilings only; no tile trace (the mode refuses one).
    if constexpr (kPlantedSkipRescaleTile < 0)
      switch (modifier_kind(params.modification)) {
        case ModifierKind::sinks: kernel = fa2_forward_kernel<Tr, Element, false, -1, ModifierKind::sinks>; break;
        case ModifierKind::all: kernel = fa2_forward_kernel<Tr, Element, false, -1, ModifierKind::all>; break;
        case ModifierKind::none:
        case ModifierKind::softcap_fixed_max: break;  // modifier_kind never gives it (fa3's own choice)
      }
  }
  constexpr int kSmem = Tr::kSmemBytes;
  if constexpr (kSmem > 48 * 1024) allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), kSmem);
  const dim3 grid((params.seqlen_q + Tr::kBlockQ - 1) / Tr::kBlockQ, params.heads,
                  params.batch);
  kernel<<<grid, Tr::kThreads, kSmem, static_cast<cudaStream_t>(params.stream)>>>(params);
  FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80", params);
}

// Dispatch on the element type for one tile configuration (declared in fa2_mma_sm80.h).
template <class Tr>
void launch(const AttentionParams& params) {
  FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] { launch_forward<Tr, Element>(params); });
}

}  // namespace flashlab::fa2_mma_sm80
