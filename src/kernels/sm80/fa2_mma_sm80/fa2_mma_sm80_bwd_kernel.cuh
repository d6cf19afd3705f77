// fa2_mma_sm80 backward kernel templates: the FlashAttention-2 backward pass on
// tensor cores with plain sm_80 instructions (mma.sync m16n8k16, ldmatrix(.trans),
// cp.async), three kernels on one stream:
//
// 1. preprocess: D = rowsum(dO * O) per (batch, head, query row), float32, into
//    params.softmax_d (laid out like the LSE).
// 2. main: one thread block per (key block of kBlockN keys, kv head, batch). K
//    and V of the block are loaded into shared memory once; the block then
//    walks, for each query head of the kv head's group (GQA/MQA) in turn, the
//    kBlockM-row query blocks that see at least one of its keys
//    (visible_rows_of_keys: causal / sliding window, bottom-right aligned), Q
//    and dO tiles arriving through cp.async (double-buffered where shared
//    memory allows, see DefaultBwdTraits). Per query block, on tensor cores:
//      S  = Q K^T,  P = exp2(S * scale * log2(e) - LSE * log2(e))   (the forward's P, recomputed;
//                   masked entries, rows past seqlen_q and rows with LSE = -inf give P = 0)
//      dP = dO V^T, dS = P * (dP - D)
//      dV += P^T dO, dK += dS^T Q      (registers, over every query block and head)
//      dQ  = dS K, added to the float32 accumulator params.dq_accum with red.global.add
//           (the accumulator in fragment order, BackwardWorkspace: 16-byte vector
//           reductions on sm_90 covering 512 contiguous bytes a warp)
//    P and dS go through shared memory (16-bit) and come back transposed as
//    A operands with ldmatrix.trans. At the end dK * scale and dV are
//    written in the input dtype (staged through shared memory, 16-byte stores).
//    GQA: dK/dV sum over the group's query heads in registers, no atomics.
// 3. convert: dq = dq_accum * scale in the input dtype, back from fragment order
//    (deterministic mode: the sum of the accumulator slots, slot 0 first).
// Score modifications (a kModified instantiation of 2): S goes through the
// policy (common/score_modification.h) before the mask and dS is multiplied
// by ds'/ds; with sinks, backward_sink_gradient_kernel runs after 1.
//
// Deterministic mode (params.deterministic): the grid's x dimension is the
// number of dq accumulator slots S (BackwardWorkspace); block s handles one key
// block of each round of S, in a zigzag: s, 2S - 1 - s, 2S + s, 4S - 1 - s, ...
// (backward_key_block in fa2_mma_sm80.h: under a causal mask a plain stride
// gave slot 0 the most work), and adds its dQ to slot s only.
// Each slot element then receives its additions from one thread in program
// order, so every slot and their fixed-order sum are bitwise reproducible.
// Without a left window bound the rows a key block's queries see run to the
// sequence's end, so the query blocks a slot has touched are those from the
// smallest first block of its rounds on: a slot's first contribution to a
// query block is stored rather than added, the slots are not zeroed, and the
// convert kernel skips the blocks a slot never touched (slot_first).
// Default mode: one block per key block, all adding to slot 0 in whatever
// order the atomics land. dK/dV are bitwise stable in both modes.
//
// Deterministic mode picks S from the device's SM count (fa2_mma_sm80.cu), so
// it is reproducible run to run on one device, not across devices.
//
// Tiling: BwdTraits<HeadDim, BlockM, BlockN, Warps, QStages, DoStages> in
// fa2_mma_sm80.h (warp layouts of the five GEMMs, shared-memory map, static
// asserts); the defaults (DefaultBwdTraits) are 128 x 128 up to head_dim 64,
// 64 x 128 at 96 and 128, 64 x 64 at 256, 8 warps, 130-160 KB of shared
// memory. Shared rows are padded by 16 bytes (conflict-free ldmatrix and
// fragment stores). The LSE and D of a query block's rows travel with its Q
// tile (cp.async) into shared memory.
//
// One step of the walk (step j, query block m0 of head h), barriers A-D:
//   wait for Q[j], dO[j]; A; issue Q[j+1] (+ LSE, D) and, double-buffered, dO[j+1]
//   S, dP GEMMs; P, dS -> shared; B; dV GEMM; [single dO: C; issue dO[j+1]]
//   dK GEMM; [single Q: D; issue Q[j+1]]; dQ GEMM and the red.global.adds
// Every buffer a cp.async refills was last read before the barrier that
// precedes the issue; P and dS are rewritten only after the next step's A.
//
// The visible-key rule, the sequence views, the PTX wrappers (warp_gemm_smem,
// the ldmatrix lane patterns, cp_async_4, red_add_f32 / red_add_f32x4) come from
// src/kernels/common/; the tile loader is the forward's (fa2_mma_sm80_kernel.cuh).
// scripts/fa2_bwd_fragment_model.py replays the kernel's index math (ldmatrix,
// mma fragments, warp layouts, masks, the walk) on the CPU against numpy
// gradients: run it after changing a tiling or a lane pattern.
//
// Limits: fp16 / bf16; head_dim a multiple of 32 (HeadDims); base pointers
// 16-byte aligned and strides multiples of 8 elements; no dropout, no ALiBi.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/backward_dq.cuh"
#include "common/online_softmax.h"
#include "common/ptx_sm80.h"
#include "common/sequence_view.h"
#include "common/mask.h"
#include "common/score_modification.h"
#include "common/visible_keys.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_kernel.cuh"  // load_tile_async

namespace flashlab::fa2_mma_sm80 {

using namespace ::flashlab::sm80;

// ---------------------------------------------------------------------------
// The dq accumulator's fragment order (BackwardWorkspace). A block_m x head_dim
// block of one head is a run of 128-float groups, one per (warp, dQ column
// chunk, m16 tile, n8 tile) of the main kernel's dQ GEMM in that order; a group
// holds the four C-fragment values of each of the warp's 32 lanes (value i:
// row lane / 4 + 8 * (i / 2), column 2 * (lane % 4) + i % 2 of the n8 tile).
// Row-major reductions touched eight 128-byte lines per warp instruction and
// throttled the LSU queue (H100, head_dim 128, ncu: lg_throttle stalls 8% of
// the samples, FA2's kernel 0.2%).
template <class Tr>
__device__ __forceinline__ int dq_fragment_group(int warp, int chunk, int mt, int n) {
  return ((warp * Tr::kDqChunks + chunk) * Tr::kDqMT + mt) * Tr::kDqChunkNT + n;
}
// The fragment order's decode for the convert kernel (backward_dq.cuh): group
// g of a block is (warp, chunk, m16 tile, n8 tile) as dq_fragment_group numbers it.
template <class Tr>
struct DqFragmentOrder {
  static constexpr int kBlockM = Tr::kBlockM;
  static constexpr int kHeadDim = Tr::kHeadDim;
  __device__ static FragmentOrigin origin(int group, int lane) {
    const int n = group % Tr::kDqChunkNT;
    const int mt = group / Tr::kDqChunkNT % Tr::kDqMT;
    const int chunk = group / (Tr::kDqChunkNT * Tr::kDqMT) % Tr::kDqChunks;
    const int warp = group / (Tr::kDqChunkNT * Tr::kDqMT * Tr::kDqChunks);
    return {Tr::dq_row0(warp) + mt * 16 + lane / 4,
            Tr::dq_col0(warp) + chunk * Tr::kDqChunkCols + n * 8 + (lane % 4) * 2};
  }
};

// ---------------------------------------------------------------------------
// 2. The main kernel. Grid (key blocks, or dq slots in deterministic mode;
// kv_heads; batch), Tr::kThreads threads, Tr::kSmemBytes of dynamic shared memory.
// kFirstTouch: deterministic mode with slot_first (a separate instantiation: the
// store path in the default mode's kernel cost its head_dim 64 form 4%).
// kModified: score modifications (common/score_modification.h), S through the
// policy before the mask and dS times ds'/ds.
template <class Tr, typename Element, bool kFirstTouch, bool kModified = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    fa2_backward_kernel(const AttentionBackwardParams p, const int64_t dq_accum_slot_stride,
                        int* const slot_first) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kPStride = Tr::kPStride;
  constexpr int kSdpMT = Tr::kSdpMT, kSdpNT = Tr::kSdpNT;
  constexpr int kKvMT = Tr::kKvMT, kKvNT = Tr::kKvNT;
  constexpr int kDqMT = Tr::kDqMT, kDqChunkNT = Tr::kDqChunkNT;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_base = smem_address(smem);
  const uint32_t k_smem = smem_base + Tr::kKOffset;
  const uint32_t v_smem = smem_base + Tr::kVOffset;
  const uint32_t q_smem = smem_base + Tr::kQOffset;    // + stage * kQTileBytes
  const uint32_t do_smem = smem_base + Tr::kDoOffset;  // + stage * kQTileBytes
  const uint32_t p_smem = smem_base + Tr::kPOffset;
  const uint32_t ds_smem = smem_base + Tr::kDsOffset;
  const uint32_t lse_smem = smem_base + Tr::kLseOffset;  // + stage * kBM floats
  const uint32_t d_smem = smem_base + Tr::kDOffset;      // + stage * kBM floats
  Element* const p_tile = reinterpret_cast<Element*>(smem + Tr::kPOffset);
  Element* const ds_tile = reinterpret_cast<Element*>(smem + Tr::kDsOffset);
  const float* const lse_stats = reinterpret_cast<const float*>(smem + Tr::kLseOffset);
  const float* const d_stats = reinterpret_cast<const float*>(smem + Tr::kDOffset);

  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const BackwardSequenceView view = backward_sequence_view(p, batch);
  const int seqlen_q = view.seqlen_q, seqlen_k = view.seqlen_k;
  const int group = p.heads / p.kv_heads;  // query heads per kv head
  const int window_left = p.window_left, window_right = p.window_right;
  const VisibleKeyMask mask{seqlen_q, seqlen_k, window_left, window_right};
  const float scale_log2 = p.softmax_scale * kLog2e;
  const int n_key_blocks = (seqlen_k + kBN - 1) / kBN;

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int quad_row = lane / 4;  // C fragment: rows quad_row, quad_row + 8
  const int quad_col = lane % 4;  // C fragment: columns 2 * quad_col, + 1

  // Warp positions in the three layouts (BwdTraits).
  const int sdp_row0 = (warp / Tr::kSdpWarpsN) * Tr::kSdpRows;  // query row in the block
  const int sdp_col0 = (warp % Tr::kSdpWarpsN) * Tr::kSdpCols;  // key in the block
  const int kv_row0 = (warp / Tr::kKvWarpsD) * 32;              // key in the block
  const int kv_col0 = (warp % Tr::kKvWarpsD) * Tr::kKvCols;     // head_dim column
  const int dq_row0 = Tr::dq_row0(warp);                       // query row in the block
  const int dq_col0 = Tr::dq_col0(warp);                       // head_dim column

  // ldmatrix lane addresses (bytes from a tile's origin), operand by operand
  // (see warp_gemm_smem): Q and dO in Tr::QLayout, K, V, P and dS padded.
  using QLayout = typename Tr::QLayout;
  using KvLayout = typename Tr::KvLayout;
  using PLayout = typename Tr::PLayout;
  const LaneCell rows16 = ldmatrix_cell_rows16(lane), pairs = ldmatrix_cell_pairs(lane);
  // S = Q K^T, dP = dO V^T: A = Q / dO rows [m][k]; B = K / V rows [n][k].
  const uint32_t sdp_a_lane = QLayout::chunk_offset(sdp_row0 + rows16.row, rows16.chunk);
  const uint32_t sdp_b_lane = KvLayout::chunk_offset(sdp_col0 + pairs.row, pairs.chunk);
  // dV += P^T dO, dK += dS^T Q: A = P^T / dS^T from P / dS rows [k = query][m = key];
  // B = dO / Q rows [k = query][n = column].
  const uint32_t kv_a_lane = PLayout::chunk_offset(pairs.row, kv_row0 / 8 + pairs.chunk);
  const uint32_t kv_b_lane = QLayout::chunk_offset(rows16.row, kv_col0 / 8 + rows16.chunk);
  // dQ = dS K: A = dS rows [m = query][k = key]; B = K rows [k = key][n = column].
  const uint32_t dq_a_lane = PLayout::chunk_offset(dq_row0 + rows16.row, rows16.chunk);
  const uint32_t dq_b_lane = KvLayout::chunk_offset(rows16.row, dq_col0 / 8 + rows16.chunk);

  float* const dq_accum_slot =
      p.dq_accum + (p.deterministic ? blockIdx.x * dq_accum_slot_stride : 0) + view.dq_accum_offset;
  // Threads 0 .. kBM-1 copy a Q tile's LSE, kBM .. 2kBM-1 its D, one row each:
  // the row's source at head 0, query row 0 (+ head * lse_head_stride + m0),
  // and its destination in stage 0 (+ stage * kBM floats).
  const int stats_row = tid % kBM;
  const float* const stats_src = (tid < kBM ? p.lse : p.softmax_d) + batch * p.lse_batch_stride +
                                 view.lse_row0 + stats_row;
  const uint32_t stats_dst = (tid < kBM ? lse_smem : d_smem) + stats_row * 4;

  // Default mode: gridDim.x = key blocks, one round. Deterministic: gridDim.x =
  // slots, one key block a round (backward_key_block).
  // With slot_first: query blocks from covered_from on hold this slot's earlier
  // contributions (the rounds' visible rows are suffixes: their union is one).
  int covered_from = INT_MAX;
  for (int round = 0;; ++round) {
    const int n_block = backward_key_block(round, blockIdx.x, gridDim.x);
    if (n_block >= n_key_blocks) break;  // later rounds start further on
    const int n0 = n_block * kBN;
    const int keys_here = min(kBN, seqlen_k - n0);
    const KeyRange rows = visible_rows_of_keys(n0, n0 + keys_here - 1, seqlen_q, seqlen_k,
                                               window_left, window_right);
    const int m_begin = rows.empty() ? 0 : rows.first / kBM;
    const int m_count = rows.empty() ? 0 : rows.last / kBM + 1 - m_begin;
    // The walk: step j is query head kv_head * group + j / m_count, query block
    // m_begin + j % m_count, tracked as (head, m0) and advanced one step at a
    // time (a division by m_count in the loop cost about 20 serial instructions
    // per use, between the barrier and the first ldmatrix).
    const int steps = m_count * group;
    const int m0_first = m_begin * kBM, m0_end = (m_begin + m_count) * kBM;
    const auto next_tile = [&](int& head, int& m0) {
      m0 += kBM;
      if (m0 == m0_end) {
        m0 = m0_first;
        ++head;
      }
    };

    // Q tile (head, m0) into stage `stage`, with the LSE and D of its rows (zero past seqlen_q).
    const auto load_q = [&](int head, int m0, int stage) {
      load_tile_async<Tr, kBM, QLayout, true>(q_smem + stage * Tr::kQTileBytes,
                               static_cast<const Element*>(p.q) + view.q_offset +
                                   head * p.q_head_stride + m0 * p.q_row_stride,
                               p.q_row_stride, seqlen_q - m0);
      if (tid < 2 * kBM) {
        const bool valid = m0 + stats_row < seqlen_q;
        cp_async_4(stats_dst + stage * kBM * 4, valid ? stats_src + head * p.lse_head_stride + m0 : stats_src,
                   valid);
      }
    };
    const auto load_do = [&](int head, int m0, uint32_t dst) {
      load_tile_async<Tr, kBM, QLayout, true>(dst,
                               static_cast<const Element*>(p.dout) + view.dout_offset +
                                   head * p.dout_head_stride + m0 * p.dout_row_stride,
                               p.dout_row_stride, seqlen_q - m0);
    };

    float acc_dk[kKvMT][kKvNT][4];
    float acc_dv[kKvMT][kKvNT][4];
#pragma unroll
    for (int mt = 0; mt < kKvMT; ++mt)
#pragma unroll
      for (int n = 0; n < kKvNT; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc_dk[mt][n][i] = acc_dv[mt][n][i] = 0.f;

    __syncthreads();  // the previous key block's epilogue is done with K/V shared memory
    if (steps > 0) {
      load_tile_async<Tr, kBN, KvLayout>(k_smem,
                               static_cast<const Element*>(p.k) + view.k_offset +
                                   kv_head * p.k_head_stride + n0 * p.k_row_stride,
                               p.k_row_stride, keys_here);
      load_tile_async<Tr, kBN, KvLayout>(v_smem,
                               static_cast<const Element*>(p.v) + view.v_offset +
                                   kv_head * p.v_head_stride + n0 * p.v_row_stride,
                               p.v_row_stride, keys_here);
      load_q(kv_head * group, m0_first, 0);
      load_do(kv_head * group, m0_first, do_smem);
      cp_async_commit();
    }

    int head = kv_head * group, m0 = m0_first;  // step j's query head and block
    for (int j = 0; j < steps; ++j) {
      int next_head = head, next_m0 = m0;  // step j + 1's
      next_tile(next_head, next_m0);
      const int q_stage = j % Tr::kQStages;
      const uint32_t q_cur = q_smem + q_stage * Tr::kQTileBytes;
      const uint32_t do_cur = do_smem + (j % Tr::kDoStages) * Tr::kQTileBytes;

      // Q[j], dO[j] (and at j = 0 K, V) have landed for every thread; step
      // j-1's readers of P, dS and of the buffers refilled below are done.
      cp_async_wait<0>();
      __syncthreads();
      if constexpr (Tr::kQStages == 2) {
        if (j + 1 < steps) load_q(next_head, next_m0, (j + 1) % 2);
      }
      if constexpr (Tr::kDoStages == 2) {
        if (j + 1 < steps) load_do(next_head, next_m0, do_smem + ((j + 1) % 2) * Tr::kQTileBytes);
      }
      cp_async_commit();

      // S = Q K^T and dP = dO V^T for this warp's kSdpRows x kSdpCols.
      float acc_s[kSdpMT][kSdpNT][4];
      float acc_dp[kSdpMT][kSdpNT][4];
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
        for (int n = 0; n < kSdpNT; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc_s[mt][n][i] = acc_dp[mt][n][i] = 0.f;
      warp_gemm_smem<Element, false, false, kD / 16, QLayout, KvLayout>(
          acc_s, q_cur + sdp_a_lane, k_smem + sdp_b_lane);
      warp_gemm_smem<Element, false, false, kD / 16, QLayout, KvLayout>(
          acc_dp, do_cur + sdp_a_lane, v_smem + sdp_b_lane);

      // Mask (only blocks some row does not see whole), P, dS; both to shared memory.
      const bool needs_mask = mask.needs_mask(m0, m0 + kBM - 1, n0, n0 + kBN - 1);
      const auto modifier = score_modifier<kModified, /*kFastTanh=*/true>(p, batch, head, seqlen_q, seqlen_k);
      const float* const lse_rows = lse_stats + q_stage * kBM;
      const float* const d_rows = d_stats + q_stage * kBM;
#pragma unroll
      for (int mt = 0; mt < kSdpMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = sdp_row0 + mt * 16 + quad_row + h * 8;  // in the block
          // The row's LSE in base 2 and D. Rows past seqlen_q and rows that saw
          // no key in the forward (LSE -inf) get +inf: P = 2^(s - inf) = 0, never NaN.
          const float lse = lse_rows[row];
          const float lse_log2 =
              m0 + row < seqlen_q && lse != -INFINITY ? lse * kLog2e : INFINITY;
          const float row_d = d_rows[row];
          modifier.template apply_row<kSdpNT>(m0 + row, n0 + sdp_col0, quad_col * 2,
                                     [&](int n, int i) -> float& { return acc_s[mt][n][h * 2 + i]; });
          if (needs_mask)
            mask.apply_row<kSdpNT>(m0 + row, n0 + sdp_col0, quad_col * 2,
                                   [&](int n, int i) -> float& { return acc_s[mt][n][h * 2 + i]; });
#pragma unroll
          for (int n = 0; n < kSdpNT; ++n) {
            float prob[2], dscore[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              prob[i] = fast_exp2(fmaf(acc_s[mt][n][h * 2 + i], scale_log2, -lse_log2));
              dscore[i] = prob[i] * (acc_dp[mt][n][h * 2 + i] - row_d);
              if constexpr (kModified)
                dscore[i] *= modifier.gradient_factor_of(acc_s[mt][n][h * 2 + i], m0 + row,
                                                         n0 + sdp_col0 + n * 8 + quad_col * 2 + i);
            }
            const int col = sdp_col0 + n * 8 + quad_col * 2;
            *reinterpret_cast<uint32_t*>(p_tile + row * kPStride + col) =
                pack2<Element>(prob[0], prob[1]);
            *reinterpret_cast<uint32_t*>(ds_tile + row * kPStride + col) =
                pack2<Element>(dscore[0], dscore[1]);
          }
        }
      __syncthreads();  // P, dS complete

      // dV += P^T dO (k = the block's kBM query rows).
      warp_gemm_smem<Element, true, true, kBM / 16, PLayout, QLayout>(
          acc_dv, p_smem + kv_a_lane, do_cur + kv_b_lane);
      if constexpr (Tr::kDoStages == 1) {
        __syncthreads();  // every warp is done with dO[j]
        if (j + 1 < steps) load_do(next_head, next_m0, do_smem);
        cp_async_commit();
      }
      // dK += dS^T Q.
      warp_gemm_smem<Element, true, true, kBM / 16, PLayout, QLayout>(
          acc_dk, ds_smem + kv_a_lane, q_cur + kv_b_lane);
      if constexpr (Tr::kQStages == 1) {
        __syncthreads();  // every warp is done with Q[j]
        if (j + 1 < steps) load_q(next_head, next_m0, 0);
        cp_async_commit();
      }

      // dQ += dS K (k = the block's kBN keys), a column chunk at a time, added
      // to the float32 accumulator (fragment order; scaled by the convert
      // kernel). Rows past seqlen_q add zeros (P = 0) to the block's padding.
      float* const dq_block = dq_accum_slot + head * p.dq_accum_head_stride +
                              static_cast<int64_t>(m0) * p.dq_accum_row_stride;
      const bool first_touch = kFirstTouch && m0 / kBM < covered_from;
#pragma unroll
      for (int chunk = 0; chunk < Tr::kDqChunks; ++chunk) {
        float acc_dq[kDqMT][kDqChunkNT][4];
#pragma unroll
        for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
          for (int n = 0; n < kDqChunkNT; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc_dq[mt][n][i] = 0.f;
        warp_gemm_smem<Element, false, true, kBN / 16, PLayout, KvLayout>(
            acc_dq, ds_smem + dq_a_lane,
            KvLayout::advance(k_smem + dq_b_lane, 0, chunk * Tr::kDqChunkCols / 8));
        const auto add_chunk = [&](auto store) {  // store: std::bool_constant
#pragma unroll
          for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
            for (int n = 0; n < kDqChunkNT; ++n)
              add_dq_fragment<decltype(store)::value>(
                  dq_block + dq_fragment_group<Tr>(warp, chunk, mt, n) * 128, lane, acc_dq[mt][n]);
        };
        if (kFirstTouch && first_touch)
          add_chunk(std::true_type{});
        else
          add_chunk(std::false_type{});
      }
      head = next_head;
      m0 = next_m0;
    }
    if (kFirstTouch && steps > 0) covered_from = min(covered_from, m_begin);

    // Epilogue: dK * scale and dV in the input dtype, staged through the K and V
    // tiles, then 16-byte stores of the rows < seqlen_k. Blocks no query row
    // sees write zeros.
    cp_async_wait<0>();  // nothing is in flight (only empty groups); kept for safety
    __syncthreads();     // every warp is done reading K and V
    // (row, column) of the K and V tiles in their layout: byte offsets.
    const auto tile_byte = [](int row, int col) {
      return KvLayout::chunk_offset(row, col / 8) + (col % 8) * 2;
    };
    unsigned char* const dk_tile = smem + Tr::kKOffset;
    unsigned char* const dv_tile = smem + Tr::kVOffset;
#pragma unroll
    for (int mt = 0; mt < kKvMT; ++mt)
#pragma unroll
      for (int n = 0; n < kKvNT; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = kv_row0 + mt * 16 + quad_row + h * 8;
          const int col = kv_col0 + n * 8 + quad_col * 2;
          *reinterpret_cast<uint32_t*>(dk_tile + tile_byte(row, col)) =
              pack2<Element>(acc_dk[mt][n][h * 2] * p.softmax_scale,
                             acc_dk[mt][n][h * 2 + 1] * p.softmax_scale);
          *reinterpret_cast<uint32_t*>(dv_tile + tile_byte(row, col)) =
              pack2<Element>(acc_dv[mt][n][h * 2], acc_dv[mt][n][h * 2 + 1]);
        }
    __syncthreads();
    constexpr int kChunksPerRow = kD / 8;
    constexpr int kChunks = kBN * kChunksPerRow;
    Element* const dk_out = static_cast<Element*>(p.dk) + view.dk_offset + kv_head * p.dk_head_stride;
    Element* const dv_out = static_cast<Element*>(p.dv) + view.dv_offset + kv_head * p.dv_head_stride;
    // Not unrolled: unrolled, the compiler computes these row addresses before
    // the query-block loop and spills them across it.
#pragma unroll 1
    for (int i = 0; i < (kChunks + Tr::kThreads - 1) / Tr::kThreads; ++i) {
      const int chunk = tid + i * Tr::kThreads;
      if (kChunks % Tr::kThreads == 0 || chunk < kChunks) {
        const int row = chunk / kChunksPerRow;
        const int col = (chunk % kChunksPerRow) * 8;
        if (row < keys_here) {
          *reinterpret_cast<uint4*>(dk_out + (n0 + row) * p.dk_row_stride + col) =
              *reinterpret_cast<const uint4*>(dk_tile + tile_byte(row, col));
          *reinterpret_cast<uint4*>(dv_out + (n0 + row) * p.dv_row_stride + col) =
              *reinterpret_cast<const uint4*>(dv_tile + tile_byte(row, col));
        }
      }
    }
  }
  // Every kv head's blocks see the same query blocks: kv head 0 reports the slot's.
  if (kFirstTouch && blockIdx.y == 0 && tid == 0) slot_first[batch * gridDim.x + blockIdx.x] = covered_from;
}

// ---------------------------------------------------------------------------
// Host: carve the workspace on a copy of the block, zero the dq accumulator
// (not in deterministic mode with slot_first: slots are written on first touch),
// launch the three kernels on params.stream.
template <class Tr, typename Element>
void launch_backward_typed(const AttentionBackwardParams& params) {
  AttentionBackwardParams p = params;
  const BackwardWorkspace workspace = backward_workspace(p, Tr::kBlockM, Tr::kBlockN);
  carve_backward_workspace(p, workspace, workspace.total_bytes, "fa2_mma_sm80");
  unsigned char* const base = static_cast<unsigned char*>(p.workspace);
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.batch <= 0 || p.heads <= 0) return;  // nothing to compute
  // seqlen_q = 0: no dq rows, but dk = dv = 0 are still written by the main kernel.
  const bool has_rows = p.seqlen_q > 0;

  // Deterministic mode without a left window: slots written on first touch (slot_first).
  // (Without keys the main kernel does not run: then zeros, as in default mode.)
  int* const slot_first = workspace.slot_first_bytes > 0 && p.seqlen_k > 0
                              ? reinterpret_cast<int*>(base + workspace.slot_first_offset)
                              : nullptr;
  if (workspace.dq_accum_bytes > 0 && slot_first == nullptr)
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(p.dq_accum, 0, workspace.dq_accum_bytes, stream));

  if (has_rows) {
    constexpr int kRows = kBwdAuxThreads / kPreprocessThreadsPerRow<Tr::kHeadDim>;
    const dim3 grid((p.seqlen_q + kRows - 1) / kRows, p.heads, p.batch);
    backward_preprocess_kernel<Tr::kHeadDim, Element>
        <<<grid, kBwdAuxThreads, 0, stream>>>(p);
    FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 backward (preprocess)", p);
    launch_backward_sink_gradient(p, SoftmaxDLikeLse{}, "fa2_mma_sm80 backward (sink gradient)");
  }
  if (p.seqlen_k > 0) {
    const auto launch_main = [&](auto kernel) {
      constexpr int kSmem = Tr::kSmemBytes;
      if constexpr (kSmem > 48 * 1024) allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), kSmem);
      const int key_blocks = (p.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
      const dim3 grid(p.deterministic ? workspace.dq_accum_slots : key_blocks, p.kv_heads, p.batch);
      kernel<<<grid, Tr::kThreads, kSmem, stream>>>(p, workspace.dq_accum_slot_stride, slot_first);
    };
    const bool modified = p.modification.per_element();  // sinks alone: the plain kernel (the LSE has them)
    if (slot_first != nullptr)
      modified ? launch_main(fa2_backward_kernel<Tr, Element, true, true>)
               : launch_main(fa2_backward_kernel<Tr, Element, true>);
    else
      modified ? launch_main(fa2_backward_kernel<Tr, Element, false, true>)
               : launch_main(fa2_backward_kernel<Tr, Element, false>);
    FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 backward", p);
  }
  if (has_rows) {
    const dim3 grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads, p.batch);
    backward_convert_dq_kernel<DqFragmentOrder<Tr>, Element><<<grid, kConvertThreads, 0, stream>>>(
        p, workspace.dq_accum_slots, workspace.dq_accum_slot_stride, slot_first);
    FLASHLAB_CHECK_LAUNCH("fa2_mma_sm80 backward (convert dq)", p);
  }
}

// Dispatch on the element type (declared in fa2_mma_sm80.h).
template <class Tr>
void launch_backward(const AttentionBackwardParams& params) {
  FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element,
                            [&] { launch_backward_typed<Tr, Element>(params); });
}

}  // namespace flashlab::fa2_mma_sm80
