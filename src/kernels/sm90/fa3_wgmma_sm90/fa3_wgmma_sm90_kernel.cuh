// fa3_wgmma_sm90 kernel template: a FlashAttention-3 style forward pass for
// Hopper (sm_90a only): TMA loads, wgmma, warp specialization.
//
// Algorithm: a persistent grid (one CTA per SM) walks (query block, head,
// batch) work tiles in sections of heads whose K/V fit in a quarter of the L2
// (half under masks), longest first within a section under causal masks;
// under masks and varlen the
// head_dim 128 and 256 tilings hand tiles out at run time (an atomic counter: greedy,
// longest first), the producer publishing each tile's index to the consumers
// with its Q. Each CTA has three
// warpgroups. Warpgroup 0 is the producer: after setmaxnreg drops it to 24
// registers, one thread issues TMA copies of the Q tile and of K and V tiles
// into 128-byte-swizzled shared memory, through a kStages-deep ring of
// mbarriers (K and V on separate barriers, so S = Q K^T starts before V has
// landed). Warpgroups 1 and 2 are consumers (setmaxnreg raises them to 240 (160 with three)
// registers), each owning 64 query rows: S = Q K^T on wgmma with both operands
// in shared memory, the mask (sequence end, causal / sliding window,
// bottom-right aligned) only on tiles that need it, the online softmax in base
// 2, P kept in registers as the A operand of O += P V (16-bit: V MN-major,
// transposed by the descriptor; e4m3: V^T, below). K/V tiles are walked from the last visible one down, so
// the tiles cut by a causal diagonal come first; tiles no row of the block
// sees are never loaded. Where two Q buffers fit (head_dim 128), work tiles
// overlap: a tile's last P V is issued with the next tile's first S, and the
// tile's output is written while that S runs.
//
// Tiling: Traits<HeadDim, BlockN, Stages, Pingpong, Consumers>: BlockM = 64 x
// consumers: 192 x 128 for head_dim 64 (three consumers at 160 registers),
// 128 x 128 for 128, 128 x 80 for 256 (two at 240); shared memory Q (two
// buffers at 128) + 2 stages of K and V = 88 / 192 / 224 KB. (H100 smoke,
// bf16, 16k tokens: 192 rows beat 128 at head_dim 64 by 17-36%; key tiles of
// 80 beat 64 at 256 by 2-11%; 176 beat 128 at head_dim 128 only at 16k
// non-causal, and spills now, so 128.) Shared tiles are stored as 64-column
// panels of 128-byte rows (TMA box inner size = one swizzle row).
//
// FP8 (e4m3 Q, K, V; Fp8Traits, 128 x 128 at head_dim 64, 128 and 256, 128 x
// 192 at 128 from 2048 keys on; at 64 the Q and K rows are 64 bytes, 64-byte
// swizzled): k32 wgmma;
// 8-bit wgmma takes B K-major only, so V arrives as V^T, written by
// fp8_transpose_v_kernel into the workspace before the launch with its keys
// permuted within every 16 (fp8_vt_key_of_position) so that S's accumulator
// fragments are P V's A fragments as they stand; P is exp2(... + 8) rounded to
// e4m3 (the 2^8 leaves the LSE in the epilogue); the per-(batch, kv head)
// descales scale the scores and O. The producer gets 40 registers at head_dim
// 64 and 128 (24 spilled at 128), 24 at 256 and with the 192-key tile. V^T
// tiles are panels of 128 keys (128-byte swizzle) or, for the 192-key tile,
// three of 64 (64-byte swizzle), one TMA box each. Variable-length batches keep each
// sequence's V^T from a multiple of 16 keys on (fp8_vt_key0). No score
// modifications, no trace, forward only; output bf16 or fp16
// (AttentionParams::output_dtype).
//
// Limits: fp16 / bf16 / e4m3, head_dim 64 / 128 / 256, compute capability 9.0 built
// as sm_90a, base pointers 16-byte aligned and batch/row/head strides that are
// multiples of 8 elements (TMA strides are multiples of 16 bytes). Tile
// tracing (a separate traced instantiation) for fixed-length batches; the
// trace's key tiles are visited from the last down. The output is written
// from registers (4-byte stores per pair). Score modifications (softcap,
// ALiBi, sinks; common/score_modification.h) are kModifier instantiations
// (ModifierKind: sinks alone, all, or softcap_fixed_max: bf16 at head_dim
// 128 with softcap <= 60 alone, each row's max fixed), either
// schedule, untraced: S through the policy before the mask (all's forward
// leaves ALiBi's row-constant part to each lane's max and offset), each
// row's max from its sink, the sink's term added in the epilogue.
//
// Structure: ForwardSharedStorage (the shared-memory carve-out and barriers),
// forward_producer (the TMA thread), ForwardTileSource (the consumers' side of
// the tile schedule), forward_consumer (the mainloop: its GEMMs are
// issue_scores and issue_probabilities_times_values, the mask is common/mask.h's
// VisibleKeyMask, the softmax update common/online_softmax.h's) and
// store_output_rows (the epilogue). The softmax step stays a lambda of the
// consumer: as a function of its own it changed head_dim 64's code generation
// (SASS, session 22), and every split here kept the SASS as measured.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/online_softmax.h"
#include "common/ptx_sm80.h"  // fast_exp2, pack2
#include "common/ptx_sm90.h"
#include "common/sequence_view.h"
#include "common/tile_trace.h"
#include "common/mask.h"
#include "common/score_modification.h"
#include "common/visible_keys.h"
#include "common/wgmma_fragment.h"
#include "common/wgmma_sm90_generated.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"

namespace flashlab::fa3_wgmma_sm90 {

// Everything the kernel reads, passed by value as a __grid_constant__ so the
// tensor maps live in parameter space (TMA reads them from there).
struct KernelArguments {
  CUtensorMap q_map;
  CUtensorMap k_map;
  CUtensorMap v_map;
  AttentionParams params;
  int num_q_blocks = 0;
  int num_work_tiles = 0;
  int section_heads = 1;  // (batch, head) pairs per scheduling section (work_tile)
  // Dynamic schedule: a zeroed counter in the workspace; each CTA's producer
  // takes its next work tile from it when it finishes one (greedy, in the
  // longest-first order). nullptr: static, CTA i takes tiles i, i + grid, ...
  int* tile_counter = nullptr;
};

// One work tile (WorkTile, work_tile_at and the schedule: common/tile_scheduler.h).
__device__ __forceinline__ WorkTile work_tile(const KernelArguments& args, int index) {
  return work_tile_at(index, args.num_q_blocks, args.section_heads, args.params.heads,
                      args.params.batch);
}

// The key tiles a query block visits, [first, last]; empty when last < first.
struct KeyTiles {
  int first, last;
};
template <class Tr>
__device__ __forceinline__ KeyTiles key_tiles(const AttentionParams& p, const SequenceView& view,
                                              int q0) {
  const int q_last = min(q0 + Tr::kBlockM, view.seqlen_q) - 1;
  const KeyRange keys = visible_keys_of_rows(q0, q_last, view.seqlen_q, view.seqlen_k,
                                             p.window_left, p.window_right);
  if (keys.empty()) return {0, -1};
  return {keys.first / Tr::kBlockN, keys.last / Tr::kBlockN};
}

// A consumer's work tile in hand: where its rows are, the key tiles it visits,
// the run of them no mask cuts, and its Q buffer (once known).
struct Tile {
  int index = -1;  // -1: no more work
  WorkTile work{};
  SequenceView view{};
  int q0 = 0;
  KeyTiles tiles{0, -1};
  KeyRange unmasked{};
  int q_buffer = 0;
  __device__ bool has_keys() const { return tiles.last >= tiles.first; }
};

using sm80::fast_exp2;
using sm80::pack2;

// The CTA's shared memory (aligned to 1024 bytes for the 128-byte swizzle):
// kQBuffers Q tiles, kStages K and V tiles, the mbarriers, and the work tile
// each Q buffer holds (the dynamic schedule's producer publishes it there
// before q_full completes, -1: no more work; the consumers read it after
// waiting on q_full).
template <class Tr>
struct ForwardSharedStorage {
  unsigned char* q_smem;
  unsigned char* k_smem;
  unsigned char* v_smem;
  uint64_t* q_full;   // one per Q buffer: the TMA bytes
  uint64_t* q_empty;  // one arrival per consumer warp
  uint64_t* k_full;   // per stage
  uint64_t* v_full;
  uint64_t* k_empty;  // K and V are released apart: K after S,
  uint64_t* v_empty;  // V after P V, one tile later
  int* published_tile;
  __device__ explicit ForwardSharedStorage(unsigned char* smem)
      : q_smem(smem),
        k_smem(q_smem + Tr::kQBuffers * Tr::kQTileBytes),
        v_smem(k_smem + Tr::kStages * Tr::kKVTileBytes),
        q_full(reinterpret_cast<uint64_t*>(v_smem + Tr::kStages * Tr::kKVTileBytes)),
        q_empty(q_full + 2),
        k_full(q_empty + 2),
        v_full(k_full + Tr::kStages),
        k_empty(v_full + Tr::kStages),
        v_empty(k_empty + Tr::kStages),
        published_tile(reinterpret_cast<int*>(v_empty + Tr::kStages)) {}
  __device__ void init() const {
    constexpr int kConsumerWarps = 4 * Tr::kConsumers;  // each consumer warp arrives once
    for (int b = 0; b < Tr::kQBuffers; ++b) {
      sm90::mbarrier_init(&q_full[b], 1);
      sm90::mbarrier_init(&q_empty[b], kConsumerWarps);
    }
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbarrier_init(&k_full[s], 1);
      sm90::mbarrier_init(&v_full[s], 1);
      sm90::mbarrier_init(&k_empty[s], kConsumerWarps);
      sm90::mbarrier_init(&v_empty[s], kConsumerWarps);
    }
    sm90::fence_barrier_init();
  }
  // Q buffers are taken in turn by the work tiles that load (or, dynamic,
  // publish) one: iteration i uses buffer i % kQBuffers, phase (i / kQBuffers) & 1.
  __device__ static int q_buffer_of(uint32_t iteration) { return int(iteration % Tr::kQBuffers); }
  __device__ static uint32_t q_phase_of(uint32_t iteration) { return (iteration / Tr::kQBuffers) & 1; }
};

// ---------------------------------------------------------------------------
// The producer (one thread, 24 registers): per work tile its Q, then its key
// tiles' K and V from the highest down, through the kStages ring. Dynamic:
// the next work tile from the counter, published in the Q buffer's slot.
template <class Tr, typename Element, bool Dynamic>
__device__ __forceinline__ void forward_producer(const KernelArguments& args, const ForwardSharedStorage<Tr>& smem) {
  constexpr int kBM = Tr::kBlockM;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kStages = Tr::kStages;
  const AttentionParams& p = args.params;
  using Storage = ForwardSharedStorage<Tr>;
  sm90::tma_prefetch_descriptor(&args.q_map);
  sm90::tma_prefetch_descriptor(&args.k_map);
  sm90::tma_prefetch_descriptor(&args.v_map);
  uint32_t kv_iteration = 0, q_iteration = 0;
  const auto next_index = [&](int index) {
    return Dynamic ? atomicAdd(args.tile_counter, 1) + int(gridDim.x) : index + int(gridDim.x);
  };
  for (int index = blockIdx.x;; index = next_index(index)) {
    WorkTile work{};
    SequenceView view{};
    int q0 = 0;
    KeyTiles tiles{0, -1};
    const int q_buffer = Storage::q_buffer_of(q_iteration);
    if constexpr (Dynamic) {
      // Tiles past a varlen sequence's rows have nothing to write: never
      // published. Rows that see no key are published without a Q (the
      // consumers write 0 / -inf); -1 ends the consumers' loop.
      for (; index < args.num_work_tiles; index = next_index(index)) {
        work = work_tile(args, index);
        view = sequence_view(p, work.batch);
        q0 = work.q_block * kBM;
        if (q0 < view.seqlen_q) break;
      }
      sm90::mbarrier_wait(&smem.q_empty[q_buffer], Storage::q_phase_of(q_iteration) ^ 1);
      ++q_iteration;
      smem.published_tile[q_buffer] = index < args.num_work_tiles ? index : -1;
      if (index >= args.num_work_tiles) {
        sm90::mbarrier_arrive(&smem.q_full[q_buffer]);
        break;
      }
      tiles = key_tiles<Tr>(p, view, q0);
      if (tiles.last < tiles.first) {
        sm90::mbarrier_arrive(&smem.q_full[q_buffer]);
        continue;
      }
    } else {
      if (index >= args.num_work_tiles) break;
      work = work_tile(args, index);
      view = sequence_view(p, work.batch);
      q0 = work.q_block * kBM;
      if (q0 >= view.seqlen_q) continue;
      tiles = key_tiles<Tr>(p, view, q0);
      if (tiles.last < tiles.first) continue;
      sm90::mbarrier_wait(&smem.q_empty[q_buffer], Storage::q_phase_of(q_iteration) ^ 1);
      ++q_iteration;
    }
    const int batch_coordinate = p.is_varlen() ? 0 : work.batch;
    const int kv_head = work.head / (p.heads / p.kv_heads);
    sm90::mbarrier_arrive_expect_tx(&smem.q_full[q_buffer], Tr::kQTileBytes);
#pragma unroll 1  // the producer has 24 registers
    for (int panel = 0; panel < Tr::kPanels; ++panel)
      sm90::tma_load_4d(smem.q_smem + q_buffer * Tr::kQTileBytes + panel * kBM * Tr::kPanelBytes, &args.q_map,
                        &smem.q_full[q_buffer], panel * Tr::kPanelElements, view.q_row0 + q0, work.head,
                        batch_coordinate);

    for (int tile = tiles.last; tile >= tiles.first; --tile, ++kv_iteration) {
      const int stage = kv_iteration % kStages;
      const uint32_t phase = (kv_iteration / kStages) & 1;
      const int key_row = view.k_row0 + tile * kBN;
      sm90::mbarrier_wait(&smem.k_empty[stage], phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(&smem.k_full[stage], Tr::kKVTileBytes);
#pragma unroll 1  // the producer has 24 registers
      for (int panel = 0; panel < Tr::kPanels; ++panel)
        sm90::tma_load_4d(smem.k_smem + stage * Tr::kKVTileBytes + panel * kBN * Tr::kPanelBytes, &args.k_map,
                          &smem.k_full[stage], panel * Tr::kPanelElements, key_row, kv_head, batch_coordinate);
      sm90::mbarrier_wait(&smem.v_empty[stage], phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(&smem.v_full[stage], Tr::kKVTileBytes);
      if constexpr (Tr::kElementBytes == 1) {
        // V^T (fp8_vt_key_of_position's layout): head_dim rows of kVtPanelKeys keys a box.
        const int vt_key = static_cast<int>(fp8_vt_key0(p, view.k_row0, work.batch)) + tile * kBN;
#pragma unroll 1  // the producer has 24-40 registers
        for (int panel = 0; panel < Tr::kVtPanels; ++panel)
          sm90::tma_load_4d(smem.v_smem + stage * Tr::kKVTileBytes + panel * Tr::kHeadDim * Tr::kVtPanelKeys,
                            &args.v_map, &smem.v_full[stage], vt_key + panel * Tr::kVtPanelKeys, 0, kv_head,
                            batch_coordinate);
      } else {
#pragma unroll 1  // the producer has 24 registers
        for (int panel = 0; panel < Tr::kPanels; ++panel)
          sm90::tma_load_4d(smem.v_smem + stage * Tr::kKVTileBytes + panel * kBN * Tr::kPanelBytes, &args.v_map,
                            &smem.v_full[stage], panel * Tr::kPanelElements, key_row, kv_head, batch_coordinate);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The consumers' side of the tile schedule (common/tile_scheduler.h orders the
// work tiles): which tile comes next, and its Q buffer's turn.
template <class Tr>
__device__ __forceinline__ Tile describe_tile(const KernelArguments& args, int index, int q_buffer) {
  const AttentionParams& p = args.params;
  Tile t;
  t.index = index;
  t.q_buffer = q_buffer;
  if (index < 0) return t;
  t.work = work_tile(args, index);
  t.view = sequence_view(p, t.work.batch);
  t.q0 = t.work.q_block * Tr::kBlockM;
  t.tiles = key_tiles<Tr>(p, t.view, t.q0);
  t.unmasked = unmasked_key_tiles(t.q0, t.q0 + Tr::kBlockM - 1, t.view.seqlen_q, t.view.seqlen_k, p.window_left,
                                  p.window_right, Tr::kBlockN);
  return t;
}
template <class Tr, bool Dynamic>
struct ForwardTileSource {
  const KernelArguments& args;
  const ForwardSharedStorage<Tr>& storage;
  int lane;
  uint32_t q_iteration = 0;
  // The next work tile from `candidate` on. Dynamic: as the producer published
  // it (waits for its Q; lane 0 reads the slot and passes it on, since lane 0
  // releases q_empty, after which the producer may overwrite the slot); a
  // key-less tile's Q buffer is released at once (one arrival per consumer
  // warp, as after a tile's last S). Static: tiles past a varlen sequence's
  // rows are skipped; the Q of a tile with keys is waited for by the caller.
  __device__ Tile acquire(int candidate) {
    using Storage = ForwardSharedStorage<Tr>;
    if constexpr (Dynamic) {
      const int q_buffer = Storage::q_buffer_of(q_iteration);
      sm90::mbarrier_wait(&storage.q_full[q_buffer], Storage::q_phase_of(q_iteration));
      ++q_iteration;
      int published = 0;
      if (lane == 0) published = storage.published_tile[q_buffer];
      const Tile t = describe_tile<Tr>(args, __shfl_sync(0xffffffffu, published, 0), q_buffer);
      if (t.index >= 0 && !t.has_keys() && lane == 0) sm90::mbarrier_arrive(&storage.q_empty[q_buffer]);
      return t;
    } else {
      for (; candidate < args.num_work_tiles; candidate += gridDim.x) {
        const Tile t = describe_tile<Tr>(args, candidate, 0);
        if (t.q0 < t.view.seqlen_q) return t;
      }
      return describe_tile<Tr>(args, -1, 0);
    }
  }
  // Static: the Q of a tile with keys (its buffer is the next in turn).
  __device__ void wait_q(Tile& t) {
    using Storage = ForwardSharedStorage<Tr>;
    if constexpr (!Dynamic) {
      t.q_buffer = Storage::q_buffer_of(q_iteration);
      sm90::mbarrier_wait(&storage.q_full[t.q_buffer], Storage::q_phase_of(q_iteration));
      ++q_iteration;
    }
  }
};

// ---------------------------------------------------------------------------
// The consumer's GEMMs (one commit group each). S = Q K^T: this consumer's 64
// query rows (q_rows: its first row in the swizzled Q tile) x kBlockN keys.
template <class Tr, typename Element>
__device__ __forceinline__ void issue_scores(float (&acc_s)[Tr::kBlockN / 2], uint32_t q_rows, uint32_t k_tile) {
  sm90::wgmma_fence();
  constexpr int kPanelBytes = Tr::kPanelBytes, kStepsPerPanel = kPanelBytes / 32;
#pragma unroll
  for (int ks = 0; ks < Tr::kHeadDim * Tr::kElementBytes / 32; ++ks) {
    // A wgmma's K (32 bytes) within a panel row; 8-row swizzle atoms kPanelBytes x 8 apart.
    const uint32_t column_bytes = (ks % kStepsPerPanel) * 32;
    const int panel = ks / kStepsPerPanel;
    const uint64_t desc_q = sm90::make_smem_descriptor<kPanelBytes>(
        q_rows + panel * Tr::kBlockM * kPanelBytes + column_bytes, 16, 8 * kPanelBytes);
    const uint64_t desc_k = sm90::make_smem_descriptor<kPanelBytes>(
        k_tile + panel * Tr::kBlockN * kPanelBytes + column_bytes, 16, 8 * kPanelBytes);
    sm90::wgmma_ss<Tr::kBlockN, Element>(acc_s, desc_q, desc_k, ks > 0);
  }
  sm90::wgmma_commit();
}
// O += P V: P from registers (A fragments), V (keys x head_dim, head_dim
// contiguous) MN-major; e4m3: V^T (head_dim rows of keys) K-major, like K.
template <class Tr, typename Element>
__device__ __forceinline__ void issue_probabilities_times_values(
    float (&acc_o)[Tr::kHeadDim / 2], const uint32_t (&p_frag)[Tr::kBlockN / sm90::kWgmmaK<Element>][4],
    uint32_t v_tile) {
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < Tr::kBlockN / sm90::kWgmmaK<Element>; ++kk) {
    // e4m3: step kk's 32 keys (bytes) within its V^T panel; 8-row atoms kVtPanelKeys x 8 apart.
    constexpr int kVtSteps = Tr::kVtPanelKeys / 32;
    const uint64_t desc_v =
        Tr::kElementBytes == 1
            ? sm90::make_smem_descriptor<Tr::kVtPanelKeys>(
                  v_tile + kk / kVtSteps * Tr::kHeadDim * Tr::kVtPanelKeys + kk % kVtSteps * 32, 16,
                  8 * Tr::kVtPanelKeys)
            : sm90::make_smem_descriptor_sw128(v_tile + kk * 16 * 128, Tr::kBlockN * 128, 1024);
    sm90::wgmma_rs<Tr::kHeadDim, Element>(acc_o, p_frag[kk], desc_v, 1);
  }
  sm90::wgmma_commit();
}

// FP8: the (batch, kv head)'s descale factors (1 where none is given).
struct Fp8Scales {
  float qk = 1.f;  // q_descale * k_descale: multiplies the raw scores
  float v = 1.f;   // v_descale: multiplies O
};
__device__ __forceinline__ Fp8Scales fp8_scales(const AttentionParams& p, int batch, int head) {
  const int64_t at = batch * p.descale_batch_stride + head / (p.heads / p.kv_heads);
  Fp8Scales s;
  if (p.q_descale != nullptr) s.qk = p.q_descale[at];
  if (p.k_descale != nullptr) s.qk *= p.k_descale[at];
  if (p.v_descale != nullptr) s.v = p.v_descale[at];
  return s;
}
// FP8 P is exp2(... + kFp8PExponent): up to 256 (e4m3's largest is 448), so the
// small probabilities keep e4m3's normal range; l counts the same factor, and
// O / l cancels it. Only the LSE takes it out again.
inline constexpr float kFp8PExponent = 8.f;

// ---------------------------------------------------------------------------
// The epilogue: normalize a consumer thread's two rows of tile `t` (row
// first_row and first_row + 8 of the block; their state in acc_o, row_max,
// row_sum) and write O (4-byte stores) and LSE, rows < seqlen_q only.
// e4m3 (Element one byte): the output is p.output_dtype's, the scores' scale
// and O's carry the descales (fp8), P's factor 2^kFp8PExponent leaves the LSE.
template <class Tr, typename Element, bool kFixedMax = false, class Modifier>
__device__ __forceinline__ void store_output_rows(const AttentionParams& p, const Tile& t, int first_row,
                                                  int thread_in_group, float scale_log2,
                                                  const float (&acc_o)[Tr::kHeadDim / 2], const float (&row_max)[2],
                                                  const float (&row_sum)[2], const Modifier& modifier,
                                                  const Fp8Scales& fp8 = {}) {
  constexpr bool kFp8 = sizeof(Element) == 1;
  const auto exp2 = [](float x) { return fast_exp2(x); };
  const int64_t head_offset = t.view.out_offset + static_cast<int64_t>(t.work.head) * p.out_head_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if constexpr (!kFp8) {
      // (With kFixedMax the max is a constant, not a score P carries; l sums
      // the row's P unrounded where P V takes them rounded: up to 2^-9 relative
      // in a nearly one-hot bf16 row, within bf16's own rounding of O.)
      if (!kFixedMax && !modifier.max_is_sink(row_max[h]))
        sum = row_sum_as_pv_saw_it<Element>(sum, row_max[h], scale_log2, exp2);
    }
    modifier.add_sink_term(sum, row_max[h], scale_log2, exp2);
    SoftmaxResult result =
        online_softmax_finish(row_max[h], sum, kFp8 ? p.softmax_scale * fp8.qk : modifier.natural_scale(p.softmax_scale));
    if constexpr (kFp8) {
      result.inverse_sum *= fp8.v;
      result.lse -= kFp8PExponent * 0.6931471805599453f;  // ln 2
    }
    const float inv_sum = result.inverse_sum;
    const int row = t.q0 + first_row + h * 8;
    if (row < t.view.seqlen_q) {
      if (p.lse != nullptr && thread_in_group == 0)
        p.lse[t.work.batch * p.lse_batch_stride + t.work.head * p.lse_head_stride + t.view.lse_row0 + row] =
            result.lse;
      const auto store = [&](auto* out) {
        using Out = std::remove_pointer_t<decltype(out)>;
        Out* o_row = out + head_offset + static_cast<int64_t>(row) * p.out_row_stride;
#pragma unroll
        for (int n = 0; n < Tr::kHeadDim / 8; ++n)
          *reinterpret_cast<uint32_t*>(o_row + n * 8 + thread_in_group * 2) =
              pack2<Out>(acc_o[n * 4 + h * 2] * inv_sum, acc_o[n * 4 + h * 2 + 1] * inv_sum);
      };
      if constexpr (kFp8) {
        if (p.output_dtype == DataType::bfloat16) store(static_cast<__nv_bfloat16*>(p.out));
        else store(static_cast<__half*>(p.out));
      } else {
        store(static_cast<Element*>(p.out));
      }
    }
  }
}

// ---------------------------------------------------------------------------
// A consumer warpgroup (64 rows of each query block): for each work tile, S =
// Q K^T and P V over its key tiles from the highest down, the online softmax
// between (pingpong with the other consumer), then O and LSE.
template <class Tr, typename Element, bool Trace, bool Dynamic, ModifierKind kModifier>
__device__ __forceinline__ void forward_consumer(const KernelArguments& args, const ForwardSharedStorage<Tr>& storage,
                                                 int warpgroup) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kBN = Tr::kBlockN;
  constexpr int kStages = Tr::kStages;
  const AttentionParams& p = args.params;
  unsigned char* q_smem = storage.q_smem;
  unsigned char* k_smem = storage.k_smem;
  unsigned char* v_smem = storage.v_smem;
  uint64_t* q_empty = storage.q_empty;
  uint64_t* k_full = storage.k_full;
  uint64_t* v_full = storage.v_full;
  uint64_t* k_empty = storage.k_empty;
  uint64_t* v_empty = storage.v_empty;
  const int consumer = warpgroup - 1;        // which 64-row half of the query block
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32;              // warp within the warpgroup: 16 rows each
  const int lane = thread % 32;
  const int group = lane / 4;                // row within an 8-row half of the warp's slab
  const int thread_in_group = lane % 4;
  const int warp_row0 = consumer * 64 + warp * 16;  // first row of this warp in the block

  const uint32_t q_address = sm90::smem_address(q_smem);
  const uint32_t k_address = sm90::smem_address(k_smem);
  const uint32_t v_address = sm90::smem_address(v_smem);
  constexpr bool kFp8 = sizeof(Element) == 1;
  float scale_log2 = p.softmax_scale * kLog2e;  // FP8: times the tile's descales (first_softmax)
  Fp8Scales fp8{};
  const auto exp2 = [](float x) { return fast_exp2(x); };

  // Consumer 0 takes the first GEMM turn; every turn after is passed on in a ring.
  if (Tr::kPingpong && consumer == Tr::kConsumers - 1) sm90::named_barrier_arrive(1, 256);

  uint32_t kv_iteration = 0;
  ForwardTileSource<Tr, Dynamic> source{args, storage, lane};
  // Called through lambdas: calling source's members at each site renumbers
  // registers (SASS, session 22), and the code as measured is this one.
  const auto acquire = [&](int candidate) { return source.acquire(candidate); };
  const auto wait_q = [&](Tile& t) { source.wait_q(t); };

  Tile cur = acquire(blockIdx.x);
  float acc_o[kD / 2];
  float row_max[2], row_sum[2];
  float acc_s[kBN / 2];
  uint32_t p_frag[kBN / sm90::kWgmmaK<Element>][4];
  float correction[2];
  constexpr bool kModified = kModifier != ModifierKind::none;
  // Softcap in tanh units (ScoreModifier::in_tanh_units, one FMUL an element
  // less) at head_dim 128 only: there softcap ran 0.96-0.996x its old time,
  // at 64 1.00-1.03x and ALiBi 1.02-1.03x (H200, session 31); 256 not measured.
  constexpr bool kTanhUnits = kind_per_element(kModifier) && kD == 128;
  // ModifierKind::softcap_fixed_max (bf16 at head_dim 128, softcap alone within
  // ScoreModifier::fix_row_max's window): each row's max fixed (fixed_row_max),
  // no max reduction, no rescaling of O.
  constexpr bool kFixedMax = kModifier == ModifierKind::softcap_fixed_max;
  static_assert(!kFixedMax || (kTanhUnits && std::is_same_v<Element, __nv_bfloat16>),
                "the fixed row max needs tanh units and P with float32's exponent range (bf16)");
  KindModifier<kModifier, /*kFastTanh=*/true> modifier;  // cur's (batch, head), set by first_softmax
  const auto fixed_max = [] { return kFixedMax; };
  // ALiBi's row-constant part out of the per-element code (apply_row_shifted)
  // in all's forward; the fixed-max kind (no ALiBi) keeps apply_row's. On a
  // shifted lane the max's term that row_sum_as_pv_saw_it recomputes is the
  // kernel's within the offset's rounding, no longer bitwise (a one-ulp matter
  // only for fp16 rows with exponents near 4e4, LargeScores' regime).
  constexpr bool kShiftedRows = kModifier == ModifierKind::all;
  const auto reset_rows = [&] {
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) acc_o[i] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[h] = -INFINITY;
      row_sum[h] = 0.f;
    }
  };

  // S = Q K^T for the tile in `stage`: 64 rows of this consumer x kBN keys.
  auto issue_qk = [&](int stage, int q_buffer) {
    issue_scores<Tr, Element>(acc_s, q_address + q_buffer * Tr::kQTileBytes + consumer * 64 * Tr::kPanelBytes,
                              k_address + stage * Tr::kKVTileBytes);
  };
  // O += P V.
  auto issue_pv = [&](int stage) {
    issue_probabilities_times_values<Tr, Element>(acc_o, p_frag, v_address + stage * Tr::kKVTileBytes);
  };
  // Mask, then the online softmax in base 2 for key tile `tile` of `cur`: P
  // overwrites S; `correction` gets each row's factor for O (applied once O is
  // no longer in flight).
  auto softmax = [&](int tile, bool needs_mask) {
    const int k0 = tile * kBN;
    // What this lane left out of its scores in each row (apply_row_shifted):
    // s' = acc_s + lane_shift; added to the lane's max, taken out of its offset.
    float lane_shift[2] = {0.f, 0.f};
    if constexpr (kind_per_element(kModifier)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = cur.q0 + warp_row0 + group + h * 8;
        const auto score = [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; };
        if constexpr (kShiftedRows)
          lane_shift[h] = modifier.template apply_row_shifted<kBN / 8, 2, kTanhUnits>(row, k0, thread_in_group * 2, score);
        else
          modifier.template apply_row<kBN / 8, 2, kTanhUnits>(row, k0, thread_in_group * 2, score);
      }
    }
    if (needs_mask) {
      const VisibleKeyMask mask{cur.view.seqlen_q, cur.view.seqlen_k, p.window_left, p.window_right};
#pragma unroll
      for (int h = 0; h < 2; ++h)
        mask.apply_row<kBN / 8>(cur.q0 + warp_row0 + group + h * 8, k0, thread_in_group * 2,
                                [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; });
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = row_max[h];
      if (!fixed_max()) {
        float lane_max = kShiftedRows ? -INFINITY : tile_max;
#pragma unroll
        for (int n = 0; n < kBN / 8; ++n)
          lane_max = fmaxf(lane_max, fmaxf(acc_s[n * 4 + h * 2], acc_s[n * 4 + h * 2 + 1]));
        tile_max = kShiftedRows ? fmaxf(tile_max, lane_max + lane_shift[h]) : lane_max;
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      }
      float offset;
      correction[h] = online_softmax_rescale(row_max[h], tile_max, scale_log2, offset, exp2);
      if constexpr (kFp8) offset -= kFp8PExponent;
      if constexpr (kShiftedRows) offset -= lane_shift[h] * scale_log2;  // the lane's P from its own scores
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& value = acc_s[n * 4 + h * 2 + e];
          value = softmax_probability(value, scale_log2, offset, exp2);
          sum += value;
        }
      row_sum[h] = row_sum[h] * correction[h] + sum;
      if constexpr (Trace) {
        const float running_sum = quad_sum(row_sum[h]);  // the row's l (whole warp)
        const int row = cur.q0 + warp_row0 + group + h * 8;
        if (thread_in_group == 0 && row < cur.view.seqlen_q) {
          // Plain locals, so a cuda-gdb condition can name them.
          const int batch = cur.work.batch, head = cur.work.head;
          const float running_max = row_max[h] * modifier.natural_scale(p.softmax_scale);  // natural-log units
          // cuda-gdb: the online-softmax state of this row after `tile` (tests/debug uses this line).
          record_tile_state(p, batch, head, row, tile, running_max, running_sum);
        }
      }
    }
  };
  auto rescale_o = [&] {
    if (fixed_max()) return;  // every correction is 1
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        acc_o[n * 4 + h * 2] *= correction[h];
        acc_o[n * 4 + h * 2 + 1] *= correction[h];
      }
  };
  // P as wgmma A fragments: k16 step kk takes S columns 16kk..16kk+15 (e4m3: k32
  // step kk columns 32kk..32kk+31 in fp8_vt_key_of_position's order).
  auto convert_p = [&] {
    if constexpr (kFp8) sm90::accumulator_to_fp8_a_fragments(acc_s, p_frag);
    else sm90::accumulator_to_a_fragments<Element>(acc_s, p_frag);
  };
  // Pingpong: the two consumers take turns to issue their GEMMs (named
  // barriers 1 and 2), so one's softmax runs under the other's matmuls.
  auto wait_turn = [&] {
    if constexpr (Tr::kPingpong) sm90::named_barrier_sync(1 + consumer, 256);
  };
  auto pass_turn = [&] {
    if constexpr (Tr::kPingpong)
      sm90::named_barrier_arrive(1 + (consumer + 1) % Tr::kConsumers, 256);
  };
  auto release = [&](uint64_t* barrier) {
    if (lane == 0) sm90::mbarrier_arrive(barrier);
  };
  // A tile needs the mask when it reaches past the sequence end or a mask
  // edge crosses it (the highest tiles: causal diagonal, window's right
  // edge; the lowest: its left edge). unmasked_key_tiles gives the same
  // answer as an interval (tests/cpu/test_visible_keys.cpp); the per-tile
  // form stays for the branchy loop, whose code generation (head_dim 64, no
  // spills) was measured with it.
  const auto needs_mask = [&](int tile) {
    if constexpr (Tr::kMaskFreeSteps) return !cur.unmasked.contains(tile);
    const int k0 = tile * kBN;
    const VisibleKeyMask mask{cur.view.seqlen_q, cur.view.seqlen_k, p.window_left, p.window_right};
    return k0 + kBN > cur.view.seqlen_k || mask.needs_mask(cur.q0, cur.q0 + kBM - 1, k0, k0 + kBN - 1);
  };
  // Tile t's modifier (its batch and head), and each row's max before its
  // first key; in tanh units at head_dim 128 (kTanhUnits), with the
  // exponent's scale to match.
  const auto start_modified_rows = [&](const Tile& t) {
    modifier = kind_modifier<kModifier, true>(p, t.work.batch, t.work.head, t.view.seqlen_q, t.view.seqlen_k);
    if constexpr (kTanhUnits) {
      modifier = modifier.in_tanh_units();
      scale_log2 = p.softmax_scale * modifier.unit() * kLog2e;
    }
    row_max[0] = row_max[1] = modifier.initial_row_max();
  };
  // The first key tile's S (in the K stage of kv_iteration), then its softmax
  // and P: what every later step builds on.
  const auto first_softmax = [&] {
    const int stage = kv_iteration % kStages;
    sm90::wgmma_wait<0>();
    sm90::fence_registers(acc_s);
    release(&k_empty[stage]);
    if (cur.tiles.first == cur.tiles.last) release(&q_empty[cur.q_buffer]);
    if constexpr (kFp8) {
      fp8 = fp8_scales(p, cur.work.batch, cur.work.head);
      scale_log2 = p.softmax_scale * fp8.qk * kLog2e;
    }
    if constexpr (kModified) start_modified_rows(cur);
    if constexpr (kFixedMax) row_max[0] = row_max[1] = modifier.fixed_row_max(scale_log2);  // softcap_fixed_max_allowed
    softmax(cur.tiles.last, needs_mask(cur.tiles.last));
    convert_p();
  };
  const auto finalize = [&](const Tile& t) {
    if constexpr (kModified) {
      if (!t.has_keys()) start_modified_rows(t);  // no first_softmax ran: the rows see only the sink, if any
    }
    store_output_rows<Tr, Element, kFixedMax>(p, t, warp_row0 + group, thread_in_group, scale_log2, acc_o, row_max,
                                              row_sum, modifier, fp8);
  };

  bool started = false;  // cur's first S and softmax done (by the previous tile's tail)
  while (cur.index >= 0) {
    if (!started) reset_rows();
    Tile next;
    next.index = -2;  // not acquired yet
    if (cur.has_keys()) {
      if (!started) {
        wait_q(cur);
        // Prologue: S for the first (highest) tile.
        sm90::mbarrier_wait(&k_full[kv_iteration % kStages], (kv_iteration / kStages) & 1);
        wait_turn();
        issue_qk(kv_iteration % kStages, cur.q_buffer);
        pass_turn();
        first_softmax();
      }
      started = false;

      // Steady state: S of the next tile and P V of this one in flight
      // together; the softmax of the next tile runs while P V finishes. With
      // kMaskFreeSteps, whether a tile is masked is a compile-time argument of
      // the step, not a branch inside it: ptxas moves the wait for P V up to
      // the first branch join after the issue, which puts the softmax behind P V.
      auto step = [&](int tile, auto masked) {
        const int stage = kv_iteration % kStages;
        const uint32_t phase = (kv_iteration / kStages) & 1;
        const int next_stage = (kv_iteration + 1) % kStages;
        const uint32_t next_phase = ((kv_iteration + 1) / kStages) & 1;
        sm90::mbarrier_wait(&k_full[next_stage], next_phase);
        sm90::mbarrier_wait(&v_full[stage], phase);
        wait_turn();
        issue_qk(next_stage, cur.q_buffer);
        issue_pv(stage);
        pass_turn();
        sm90::wgmma_wait<1>();  // S of the next tile is done; P V may still run
        sm90::fence_registers(acc_s);
        release(&k_empty[next_stage]);
        if (tile == cur.tiles.first) release(&q_empty[cur.q_buffer]);
        softmax(tile, bool(masked));
        sm90::wgmma_wait<0>();
        sm90::fence_registers(acc_o);
        release(&v_empty[stage]);
        rescale_o();
        convert_p();
        ++kv_iteration;
      };
      if constexpr (Tr::kMaskFreeSteps) {
        int tile = cur.tiles.last - 1;
        for (; tile >= cur.tiles.first && tile > cur.unmasked.last; --tile)
          step(tile, std::true_type{});
        for (; tile >= cur.tiles.first && tile >= cur.unmasked.first; --tile)
          step(tile, std::false_type{});
        for (; tile >= cur.tiles.first; --tile) step(tile, std::true_type{});
      } else {
        for (int tile = cur.tiles.last - 1; tile >= cur.tiles.first; --tile)
          step(tile, needs_mask(tile));
      }

      const int stage = kv_iteration % kStages;
      sm90::mbarrier_wait(&v_full[stage], (kv_iteration / kStages) & 1);
      if constexpr (Tr::kOverlapWorkTiles) {
        // Tail: the last P V together with the next tile's first S (its Q is
        // in the other buffer), this tile's output written while S runs.
        next = acquire(cur.index + gridDim.x);
        if (next.index >= 0 && next.has_keys()) {
          wait_q(next);
          const int next_stage = (kv_iteration + 1) % kStages;
          sm90::mbarrier_wait(&k_full[next_stage], ((kv_iteration + 1) / kStages) & 1);
          wait_turn();
          issue_pv(stage);
          issue_qk(next_stage, next.q_buffer);
          pass_turn();
          sm90::wgmma_wait<1>();  // P V is done; S of the next tile may still run
          sm90::fence_registers(acc_o);
          release(&v_empty[stage]);
          ++kv_iteration;
          finalize(cur);
          reset_rows();
          cur = next;
          first_softmax();
          started = true;
          continue;
        }
      }
      // The last P V alone.
      wait_turn();
      issue_pv(stage);
      pass_turn();
      sm90::wgmma_wait<0>();
      sm90::fence_registers(acc_o);
      release(&v_empty[stage]);
      ++kv_iteration;
    }
    finalize(cur);
    cur = next.index != -2 ? next : acquire(cur.index + gridDim.x);
  }
}

// ---------------------------------------------------------------------------
// The kernel: warpgroup 0 produces, warpgroups 1.. consume.
// Trace: the tile-trace build (a separate instantiation, never the timed one)
// also writes each row's running max and sum after every key tile.
// Dynamic: work tiles come from args.tile_counter, published by the producer;
// otherwise the static order (the code both sides ran before the dynamic
// schedule, instantiated apart so its code generation stays as it was).
// kModifier: score modifications (common/score_modification.h), untraced.
template <class Tr, typename Element, bool Trace, bool Dynamic = false, ModifierKind kModifier = ModifierKind::none>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    fa3_forward_kernel(const __grid_constant__ KernelArguments args) {
  extern __shared__ unsigned char smem_raw[];
  const ForwardSharedStorage<Tr> storage(reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023)));
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) storage.init();
  __syncthreads();
  if (warpgroup == 0) {
    sm90::setmaxnreg_decrease<Tr::kProducerRegisters>();
    if (threadIdx.x != 0) return;
    forward_producer<Tr, Element, Dynamic>(args, storage);
    return;
  }
  sm90::setmaxnreg_increase<Tr::kConsumerRegisters>();
  forward_consumer<Tr, Element, Trace, Dynamic, kModifier>(args, storage, warpgroup);
}

// ---------------------------------------------------------------------------
// Host side.

// The dynamic-schedule instantiation, only for tilings that use one.
template <class Tr, typename Element, ModifierKind kModifier = ModifierKind::none>
auto dynamic_kernel() {
  if constexpr (Tr::kDynamicSchedule) return fa3_forward_kernel<Tr, Element, false, true, kModifier>;
  else return fa3_forward_kernel<Tr, Element, false, false, kModifier>;
}

// FP8: V (batch, seqlen_k, kv_heads, head_dim) or packed (total_k, kv_heads,
// head_dim) e4m3 into V^T (fa3_wgmma_sm90.h: fp8_vt_row_keys keys a row, each
// sequence from fp8_vt_key0 on) in fp8_vt_key_of_position's order, zeros from
// a sequence's last key to the next one's start; after the last sequence, zeros
// up to region_keys past its start (the row's end at most: TMA fills past it),
// so a key tile read past any sequence's end meets no unwritten byte; a block
// moves 64 keys x 64 head-dim columns through shared memory, 16 bytes a thread
// each way (rows and strides are multiples of 16 bytes: unsupported_reason;
// head_dim a multiple of 64, regions of 16 keys). (A template of the tiling, so
// only the FP8 instantiation files emit it.)
template <class Tr>
__global__ void __launch_bounds__(256) fp8_transpose_v_kernel(const AttentionParams p, uint8_t* vt,
                                                              int64_t row_keys, int key_blocks) {
  __shared__ __align__(16) uint8_t tile[64][64 + 16];
  // blockIdx.x: (sequence, kv head) and the key block, folded (grid.z stops at 65535).
  const int pair = blockIdx.x / key_blocks;
  const int key0 = blockIdx.x % key_blocks * 64, column0 = blockIdx.y * 64;
  const int batch = pair / p.kv_heads, head = pair % p.kv_heads;
  const SequenceView view = sequence_view(p, batch);
  // This sequence's region of a V^T row: [first, end), a multiple of 16 keys.
  const int64_t first = fp8_vt_key0(p, view.k_row0, batch);
  const int64_t end = p.is_varlen() && batch + 1 < p.batch ? fp8_vt_key0(p, view.k_row0 + view.seqlen_k, batch + 1)
                                                           : row_keys;
  if (first + key0 >= end) return;
  const uint8_t* v = static_cast<const uint8_t*>(p.v) + view.v_offset + head * p.v_head_stride;
  {
    const int key = threadIdx.x / 4, piece = threadIdx.x % 4;  // 4 x 16 bytes: a key's 64 columns
    uint4 value = make_uint4(0, 0, 0, 0);
    if (key0 + key < view.seqlen_k)
      value = *reinterpret_cast<const uint4*>(v + static_cast<int64_t>(key0 + key) * p.v_row_stride + column0 +
                                              piece * 16);
    *reinterpret_cast<uint4*>(&tile[key][piece * 16]) = value;
  }
  __syncthreads();
  const int column = threadIdx.x / 4, run = threadIdx.x % 4;  // 16 positions of one V^T row
  const int64_t position = first + key0 + run * 16;
  if (position >= end || position >= row_keys) return;
  uint32_t words[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      word |= static_cast<uint32_t>(tile[fp8_vt_key_of_position(run * 16 + w * 4 + b)][column]) << (8 * b);
    words[w] = word;
  }
  const int plane = p.is_varlen() ? 0 : batch;
  uint8_t* out = vt + ((static_cast<int64_t>(plane) * p.kv_heads + head) * p.head_dim + column0 + column) * row_keys;
  *reinterpret_cast<uint4*>(out + position) = make_uint4(words[0], words[1], words[2], words[3]);
}

template <class Tr, typename Element>
void launch_forward(const AttentionParams& params) {
  constexpr bool kFp8 = sizeof(Element) == 1;
  // The traced build keeps the static order, so a traced or cuda-gdb run finds
  // a tile on the CTA that locate() names.
  const DeviceLimits device = device_limits();
  const Schedule plan = schedule(params, Tr::kBlockM, sizeof(Element), device.multiprocessors,
                                 device.l2_bytes);
  const bool dynamic = Tr::kDynamicSchedule && plan.dynamic && !params.trace.enabled() &&
                       params.workspace != nullptr && params.workspace_bytes >= sizeof(int);
  // Score modifications: their own instantiations (sinks alone, or all), either
  // schedule; no trace (the mode refuses one).
  constexpr auto kSinks = ModifierKind::sinks, kAll = ModifierKind::all;
  const ModifierKind kind = modifier_kind(params.modification);
  const auto choose_kernel = [&] {
    if constexpr (kFp8) {  // unsupported_reason: no trace, no modifications
      return dynamic ? dynamic_kernel<Tr, Element>() : fa3_forward_kernel<Tr, Element, false>;
    } else {
      if constexpr (std::is_same_v<Element, __nv_bfloat16> && Tr::kHeadDim == 128) {
        constexpr auto kFixed = ModifierKind::softcap_fixed_max;
        if (!params.trace.enabled() && kind == kAll && softcap_fixed_max_allowed(params.modification))
          return dynamic ? dynamic_kernel<Tr, Element, kFixed>() : fa3_forward_kernel<Tr, Element, false, false, kFixed>;
      }
      return params.trace.enabled() ? fa3_forward_kernel<Tr, Element, true>
             : kind == kAll         ? (dynamic ? dynamic_kernel<Tr, Element, kAll>()
                                               : fa3_forward_kernel<Tr, Element, false, false, kAll>)
             : kind == kSinks       ? (dynamic ? dynamic_kernel<Tr, Element, kSinks>()
                                               : fa3_forward_kernel<Tr, Element, false, false, kSinks>)
             : dynamic              ? dynamic_kernel<Tr, Element>()
                                    : fa3_forward_kernel<Tr, Element, false>;
    }
  };
  auto kernel = choose_kernel();
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
  KernelArguments args;
  args.q_map = make_tensor_map(params, Operand::q, Tr::kBlockM, Tr::kPanelBytes);
  args.k_map = make_tensor_map(params, Operand::k, Tr::kBlockN, Tr::kPanelBytes);
  if constexpr (kFp8) {
    if (params.workspace == nullptr || params.workspace_bytes < workspace_bytes(params))
      throw std::invalid_argument("fa3_wgmma_sm90's e4m3 forward writes V^T into its workspace: needs " +
                                  std::to_string(workspace_bytes(params)) + " bytes; got " +
                                  std::to_string(params.workspace_bytes));
    uint8_t* vt = static_cast<uint8_t*>(params.workspace) + kFp8VtOffset;
    const int64_t row_keys = fp8_vt_row_keys(params);
    // The keys a block column writes from a sequence's start: its keys rounded up to 16;
    // varlen: up to 16 zeros before the next sequence, a key tile of zeros after the last.
    const int64_t region_keys = fp8_vt_keys(params.seqlen_k) + (params.is_varlen() ? Tr::kBlockN : 0);
    if (params.seqlen_k > 0) {  // no keys: no key tile is loaded
      const int key_blocks = static_cast<int>((region_keys + 63) / 64);
      const dim3 transpose_grid(static_cast<unsigned>(int64_t{key_blocks} * params.batch * params.kv_heads),
                                (params.head_dim + 63) / 64);
      fp8_transpose_v_kernel<Tr><<<transpose_grid, 256, 0, static_cast<cudaStream_t>(params.stream)>>>(
          params, vt, row_keys, key_blocks);
      FLASHLAB_CHECK_LAUNCH("fa3_wgmma_sm90 (FP8 V transpose)", params);
    }
    args.v_map = make_vt_tensor_map(params, vt, Tr::kVtPanelKeys);
  } else {
    args.v_map = make_tensor_map(params, Operand::v, Tr::kBlockN);
  }
  args.params = params;
  args.num_q_blocks = plan.num_q_blocks;
  args.num_work_tiles = plan.num_work_tiles;
  if (args.num_work_tiles == 0) return;
  args.section_heads = plan.section_heads;
  if (dynamic) {
    args.tile_counter = static_cast<int*>(params.workspace);
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(args.tile_counter, 0, sizeof(int),
                                        static_cast<cudaStream_t>(params.stream)));
  }
  const int grid = plan.grid;
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, static_cast<cudaStream_t>(params.stream)>>>(args);
  FLASHLAB_CHECK_LAUNCH("fa3_wgmma_sm90", params);
}

template <class Tr>
void launch(const AttentionParams& params) {
  FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] { launch_forward<Tr, Element>(params); });
}

template <int HeadDim>
void launch_fp8_at(const AttentionParams& params) {
  if constexpr (Fp8HeadDims::contains(HeadDim))
    with_fp8_traits<HeadDim>(params, [&](auto tiling) { launch_forward<decltype(tiling), __nv_fp8_e4m3>(params); });
}

}  // namespace flashlab::fa3_wgmma_sm90
