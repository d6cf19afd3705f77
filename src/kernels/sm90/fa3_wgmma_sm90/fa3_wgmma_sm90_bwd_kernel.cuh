// fa3_wgmma_sm90 backward kernel template: a FlashAttention-3 style backward
// for Hopper (sm_90a only): TMA loads, wgmma, warp specialization. Three
// kernels on one stream, the first and last shared with fa2_mma_sm80
// (common/backward_dq.cuh):
//
// 1. preprocess: D = rowsum(dO * O) per (batch, head, query row), float32,
//    and the dq accumulator's rows zeroed (no memset: FA3's way).
// 2. main (this file): a tile per (key block, kv head, batch), in the tiles'
//    order or, in the default mode under a right-bounded mask (causal,
//    windows) from 16 key blocks a pair, in KeyBlockOrder's sections
//    (common/tile_scheduler.h). In the default mode a persistent grid, one
//    CTA an SM walking tiles back to back: without a mask (one sequence
//    length) every gridDim.x-th tile, otherwise, where the kernels hand tiles
//    out (BwdTraits::kHandsOutTiles: head dim 64, and 128 at 64 rows), the
//    next tile from a counter, the producer handing each to the other roles
//    with its K and V (BwdBarriers); else, and in the deterministic mode, a
//    CTA a tile (backward_grid_ctas, backward_schedules_dynamically,
//    fa3_wgmma_sm90.h).
//    Three warpgroups.
//    Warpgroup 0 is the producer: setmaxnreg drops it to 24 registers and its
//    first thread takes the CTA's tiles and loads a tile's K and V (TMA, one
//    transaction barrier; from the CTA's second tile on after its first Q and
//    dO, once the consumers have released the last tile's K and V: once the
//    epilogue's TMA stores have read the dK and dV staged over them, or, where
//    the epilogue stores from registers, in the last step of the walk), then for
//    each query head of the kv head's group and each query block that sees
//    the keys (visible_rows_of_keys) the Q and dO tiles, through rings, with
//    the rows' LSE in base 2 and D (written padded to whole query blocks by
//    the preprocess) bulk-copied onto the same barriers.
//    Warpgroups 1 and 2 are consumers (240 registers) and compute transposed
//    scores so that P and dS land in registers as the A operands of dV and dK:
//      S^T  = K Q^T,  dP^T = V dO^T                 (wgmma SS, K-major, N = BlockM queries)
//      P^T  = exp2(S^T * scale * log2e - LSE_log2)  (mask as a column policy, VisibleKeyMask)
//      dS^T = P^T * (dP^T - D)
//      dV  += P^T dO,  dK += dS^T Q                 (wgmma RS, dO / Q MN-major)
//      dQ   = dS K                                  (wgmma SS, both MN-major: dS^T is stored
//                                                    to shared memory keys-as-rows; 80-row
//                                                    blocks: dQ^T = K^T dS^T, below)
//    Two layouts of the consumers (BwdTraits):
//    - keys split (head_dim 64, 128): 128 keys a CTA, each consumer owns 64
//      of them and computes both GEMMs of its keys' scores;
//    - head dim split (head_dim 256, where dK and dV of 64 keys x 256 columns
//      alone would take 256 registers a thread): 64 keys a CTA, consumer 1
//      computes S^T and P^T, consumer 2 dP^T; they swap the two through
//      shared memory (float32, one named barrier a step), both form dS^T,
//      and each accumulates dK / dV of half the head dim.
//    dQ goes out in 64 x 64 slabs (64 query rows x 64 columns at head_dim
//    128 and 256: one a consumer at 128, two in turn at 256; head_dim 64:
//    half the 128 query rows x all columns; 80-row blocks: dQ^T, 64 columns x
//    80 rows a consumer), added to the float32 accumulator in wgmma fragment
//    order (SlabDqOrder) as backward_dq_add picks (DqAdd): unmodified scores
//    (keys split) staged in shared memory for the consumer's writer warp
//    (the producer warpgroup's warps 1 and 2), which adds it with one bulk
//    reduce-add while the consumer goes on; otherwise red.global.add.v4.f32
//    from the consumer's registers; deterministic: staged, in order. dS has two shared
//    buffers, so one named barrier a step orders both consumers' dS stores
//    before either reads the other's. At head dims 128 and 256, and at 64 in
//    the deterministic mode (backward_stages_key_gradients), the epilogue
//    stages dK * scale and dV in the input dtype over the tile's K and V
//    (stmatrix) and stores them with TMA (store_key_gradients_by_tma); the
//    default mode at 64, a block that ends past the sequence's keys (TMA
//    would write into the next varlen sequence) and one that walks nothing
//    store from registers.
// 3. convert: dq = scale * accumulator in the input dtype.
//
// Tiling (BwdTraits, chosen per problem by with_bwd_traits): 128 keys per CTA
// and query blocks of 64 rows at head_dim 128, 128 rows at 64 (FA3's sm90
// tiles), Q/dO rings of 2 stages: shared memory K + V + 2 x (Q + dO) + 2 x dS
// = 160 KB at both head dims. At head_dim 128 without a mask (either mode,
// no softcap or ALiBi) 80 rows, FA3's tile there: 25% more GEMM a step for
// the same K/V reads (S^T and dP^T m64n80, dV / dK five k16 steps); 80 is
// no multiple of wgmma's 64 rows, so each consumer computes dQ^T = K^T dS^T
// of its 64 columns (m64n80, A = K MN-major, B = dS stored a row per query, keys contiguous,
// by stmatrix.trans) and adds it as an 80 x 64 slab in transposed fragment
// order: K + V + rings + dS = 184 KB. head_dim 256: 64 keys x 64 query rows, 2 Q stages and 1 dO
// stage, 2 x 16 KB swap buffers: 210 KB.
//
// Limits: fp16 / bf16, head_dim 64, 128 and 256 (BackwardHeadDims; others run
// at a padded head dim or on fa2_mma_sm80), compute capability 9.0 built as
// sm_90a, 16-byte aligned base pointers and strides that are multiples of 8
// elements (TMA). At head_dim 256 no softcap or ALiBi (the host path runs
// those on fa2_mma_sm80). The deterministic mode keeps
// a CTA a tile (its waits count on the hardware's order), and so does head_dim
// 256 under a mask or variable lengths.
//
// Score modifications (softcap, ALiBi, sinks): the kModified instantiations
// take S^T through common/score_modification.h before the mask and multiply
// dS^T by ds'/ds; with sinks, backward_sink_gradient_kernel (backward_dq.cuh)
// runs after the preprocess.
//
// Deterministic mode (a separate instantiation): one accumulator, and the key
// blocks that see a query block add their dQ slabs to it in a fixed order,
// FA3's semaphores: an int32 per (batch, head, query block, slab), zeroed by a
// memset before the preprocess, counts the key blocks that have added. The consumers stage
// their slabs in shared memory (at the head dim split, two a step, one after
// the other in the consumer's swap buffer); the producer warpgroup's warps 1
// and 2 (the dQ writers, one per consumer) wait until a slab's count is its
// key block's rank, add the slab with one bulk reduce-add, hand the buffer
// back once it is read and release count + 1 once it is added. Without a mask the walks are
// rotated (key block n starts at query block n) and ranks follow the order in
// which the key blocks reach a query block (rotates_backward_walks); where the
// right edge of the mask bounds the walk (causal, windows) ranks descend from
// the last key block that sees the query block, with CTAs launched from the
// last key block down, so under a causal mask the key block with the fewest
// query blocks adds first; otherwise they ascend. A CTA only ever waits for
// CTAs launched before it or resident beside it, so the wait cannot deadlock. (fa2_mma_sm80's dq slots
// made each CTA stream a whole dQ copy through HBM per key block: 1.4-1.8x the
// default mode's time on the H100, session 21.)
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/backward_dq.cuh"
#include "common/mask.h"
#include "common/score_modification.h"
#include "common/online_softmax.h"
#include "common/ptx_sm80.h"  // fast_exp2, pack2, red_add_f32x4
#include "common/ptx_sm90.h"
#include "common/sequence_view.h"
#include "common/visible_keys.h"
#include "common/wgmma_fragment.h"
#include "common/wgmma_sm90_generated.h"
#include "flashlab/cuda_check.h"
#include "flashlab/kernel_params.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"

namespace flashlab::fa3_wgmma_sm90 {

struct BwdKernelArguments {
  CUtensorMap q_map, k_map, v_map, do_map;
  CUtensorMap dk_map, dv_map;  // 64-row boxes: the epilogue's stores (store_key_gradients_by_tma)
  AttentionBackwardParams params;
  // The preprocess's padded statistics (BackwardWorkspace): (heads, stats_rows).
  const float* lse_log2 = nullptr;
  const float* dsum = nullptr;
  int64_t stats_rows = 0;
  // Deterministic mode: int32 (batch, heads, query_blocks, kDqBlockSlabs), zeroed.
  int* dq_semaphore = nullptr;
  int query_blocks = 0;  // ceil(max seqlen_q / kBlockM)
  bool rotates_walks = false;  // rotates_backward_walks (deterministic mode)
  KeyBlockOrder order;         // which tile takes which key block (backward_key_block_order)
  int tiles = 0;               // key blocks of the longest sequence x kv heads x batch
  // backward_schedules_dynamically: the tiles after the grid's first are
  // taken from this counter (zeroed); null: CTA c takes c, c + grid, ...
  int* tile_counter = nullptr;
};

// The CTA's tiles: tile blockIdx.x, then every gridDim.x-th after it, or
// (tile_counter) the next from the counter. A grid of one CTA a tile runs
// each once; the persistent grid (backward_grid_ctas) one CTA an SM, walking
// its tiles back to back, so that a tile's epilogue and the next one's first
// loads overlap. Where the kernel hands tiles out (kHandsOut) the producer
// takes them and hands each to the consumers and the writer warps with its
// K/V load (BwdBarriers::tile); otherwise every role walks them alike, and
// the counter's code is not compiled (it costs the producer warpgroup, at 24
// registers, 44-88 bytes of spills).
template <class Tr, DqAdd kDq>
inline constexpr bool kHandsOut = Tr::kHandsOutTiles && kDq != DqAdd::writer_in_order;
__device__ __forceinline__ int first_backward_tile() { return static_cast<int>(blockIdx.x); }
template <bool kHandsOutTiles>
__device__ __forceinline__ int next_backward_tile(const BwdKernelArguments& args, int tile) {
  if constexpr (kHandsOutTiles)
    if (args.tile_counter != nullptr) return atomicAdd(args.tile_counter, 1) + static_cast<int>(gridDim.x);
  return tile + static_cast<int>(gridDim.x);
}
// A static schedule's tile of round `round` (past args.tiles: none left).
__device__ __forceinline__ int static_backward_tile(uint32_t round) {
  return first_backward_tile() + static_cast<int>(round * gridDim.x);
}

// A tile's place: its key-block index (KeyBlockOrder over the tile's linear
// index), kv head and batch entry. The deterministic mode keeps the tiles'
// own order (its waits count on it: key index fastest, then kv head, batch).
struct BackwardCta {
  int key_index, kv_head, batch;
};
template <bool kDeterministic>
__device__ __forceinline__ BackwardCta backward_cta(const BwdKernelArguments& args, int tile) {
  const int kv_heads = args.params.kv_heads;
  if constexpr (kDeterministic) {
    const int pair = tile / args.order.key_blocks;
    return {tile - pair * args.order.key_blocks, pair % kv_heads, pair / kv_heads};
  }
  const KeyBlockCta cta = key_block_cta_at(tile, args.order);
  return {cta.key_block, cta.pair % kv_heads, cta.pair / kv_heads};
}
// The key block of this CTA (-1: none, a varlen sequence shorter than the
// grid): its key index, or counted from the last block down where
// deterministic ranks descend (dq_rank).
__device__ __forceinline__ bool ranks_descend(const AttentionBackwardParams& p) {
  return p.window_right >= 0;
}
template <bool kDeterministic>
__device__ __forceinline__ int cta_key_block(const AttentionBackwardParams& p, int n_key_blocks, int key_index) {
  if (key_index >= n_key_blocks) return -1;
  return kDeterministic && ranks_descend(p) ? n_key_blocks - 1 - key_index : key_index;
}

// The walk of a key block's CTA (QueryWalk, fa3_wgmma_sm90.h): the producer,
// the consumers and the dQ writers compute the same.
template <class Tr>
__device__ __forceinline__ QueryWalk query_walk(const BwdKernelArguments& args, const SequenceView& view,
                                                int n_block) {
  const AttentionBackwardParams& p = args.params;
  const int n0 = n_block * Tr::kBlockN;
  QueryWalk walk;
  const int keys_here = min(Tr::kBlockN, view.seqlen_k - n0);
  const KeyRange rows = visible_rows_of_keys(n0, n0 + keys_here - 1, view.seqlen_q, view.seqlen_k,
                                             p.window_left, p.window_right);
  if (rows.empty()) return walk;
  walk.m_begin = rows.first / Tr::kBlockM;
  walk.m_count = rows.last / Tr::kBlockM + 1 - walk.m_begin;
  walk.steps = walk.m_count * (p.heads / p.kv_heads);
  const int n_key_blocks = (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  if (args.rotates_walks && n_key_blocks <= walk.m_count) {
    walk.rotated = true;
    walk.rotation = n_block;
  }
  return walk;
}

// Deterministic mode: how many key blocks add to query block m_block's dQ
// before key block n_block (dq_semaphore counts up to it): on rotated walks
// the order in which they reach it (rotated_dq_rank, fa3_wgmma_sm90.h);
// otherwise the key blocks that see a query block are one interval
// (visible_keys_of_rows), ranks ascend from its first key block, or descend
// from its last where the mask's right edge bounds the walk.
template <class Tr>
__device__ __forceinline__ int dq_rank(const AttentionBackwardParams& p, const SequenceView& view,
                                      const QueryWalk& walk, int n_block, int m_block) {
  const int n_key_blocks = (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  if (walk.rotated)
    return rotated_dq_rank(m_block, n_block, n_key_blocks, walk.m_count);
  const int m0 = m_block * Tr::kBlockM;
  const int row_last = min(m0 + Tr::kBlockM, view.seqlen_q) - 1;
  const KeyRange keys = visible_keys_of_rows(m0, row_last, view.seqlen_q, view.seqlen_k, p.window_left,
                                             p.window_right);
  return ranks_descend(p) ? keys.last / Tr::kBlockN - n_block : n_block - keys.first / Tr::kBlockN;
}

using sm80::fast_exp2;
using sm80::pack2;

// The CTA's mbarriers: K/V (the TMA bytes), and per ring stage Q and dO
// full (the TMA bytes) and empty (one arrival per consumer thread: each
// thread's reads of the stage's LSE / D rows are then ordered before the
// producer's next bulk copy into them by its own release; one arrival a warp
// after __syncwarp drew racecheck hazards, session 22).
// kv_full / kv_empty: a tile's K and V, loaded once every consumer thread has
// arrived on kv_empty after its last GEMM of the last tile that read them, or,
// where the epilogue staged dK and dV over them, once each consumer's first
// thread has arrived for its 128 after the TMA stores have read them.
// Where the kernel hands tiles out (kHandsOut) a round is a tile: the producer
// writes it (or -1: no more) to `tile`, then completes kv_full (with its K
// and V, or a plain arrival where the walk has no step); the consumers and
// the writer warps read it after their wait; kv_empty counts the consumer
// threads (at once where the walk has no step) and the writer warps
// (DqAdd::writer) once they have read the tile; the producer writes the next
// round after it. Otherwise a round is a tile with a step.
template <class Tr>
struct BwdBarriers {
  uint64_t* kv_full;
  uint64_t* kv_empty;
  uint64_t* q_full;
  uint64_t* q_empty;
  uint64_t* do_full;
  uint64_t* do_empty;
  int* tile;
  __device__ BwdBarriers(uint64_t* base, int* tile_slot)
      : kv_full(base), kv_empty(base + 1), q_full(base + 2), q_empty(q_full + Tr::kStages), do_full(q_empty + Tr::kStages),
        do_empty(do_full + Tr::kStages), tile(tile_slot) {}
  __device__ void init(int kv_empty_arrivals) const {
    constexpr int kConsumerThreads = 128 * Tr::kConsumers;
    sm90::mbarrier_init(kv_full, 1);
    sm90::mbarrier_init(kv_empty, kv_empty_arrivals);
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbarrier_init(&q_full[s], 1);
      sm90::mbarrier_init(&q_empty[s], kConsumerThreads);
      sm90::mbarrier_init(&do_full[s], 1);
      sm90::mbarrier_init(&do_empty[s], kConsumerThreads);
    }
    sm90::fence_barrier_init();
  }
};

// ---------------------------------------------------------------------------
// The producer (one thread): per tile K and V, and Q and dO per step. The
// rings' slots count on across tiles; a tile's K and V go in once the
// consumers have released the last tile's (kv_empty), after its first Q and
// dO, which may load while the consumers finish the last tile.
template <class Tr, typename Element, DqAdd kDq>
__device__ __forceinline__ void backward_producer(const BwdKernelArguments& args,
                                                 unsigned char* smem, const BwdBarriers<Tr>& bar) {
  constexpr int kBM = Tr::kBlockM;
  const AttentionBackwardParams& p = args.params;
  sm90::tma_prefetch_descriptor(&args.q_map);
  sm90::tma_prefetch_descriptor(&args.k_map);
  sm90::tma_prefetch_descriptor(&args.v_map);
  sm90::tma_prefetch_descriptor(&args.do_map);
  const int group = p.heads / p.kv_heads;
  constexpr bool kHandsOutTiles = kHandsOut<Tr, kDq>;
  uint32_t iteration = 0, kv_round = 0;  // ring slots and K/V rounds of the CTA so far
  // A round's start, once the last round's K and V are released: its tile
  // (-1: no more) to the other roles where the kernel hands tiles out.
  const auto hand_out = [&](int tile) {
    if (kv_round > 0) sm90::mbarrier_wait(bar.kv_empty, (kv_round - 1) & 1);
    if constexpr (kHandsOutTiles) *bar.tile = tile;  // before the arrival on kv_full (its release orders it)
  };
#pragma unroll 1
  for (int tile = first_backward_tile(); tile < args.tiles; tile = next_backward_tile<kHandsOutTiles>(args, tile)) {
    constexpr bool kOrdered = kDq == DqAdd::writer_in_order;
    const BackwardCta cta = backward_cta<kOrdered>(args, tile);
    const int kv_head = cta.kv_head, batch = cta.batch;
    const BackwardSequenceView view = backward_sequence_view(p, batch);
    const int batch_coordinate = p.is_varlen() ? 0 : batch;
    const int n_block =
        cta_key_block<kOrdered>(p, (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, cta.key_index);
    if (n_block < 0) continue;  // past a shorter sequence's keys: nothing to store, not handed out
    const int n0 = n_block * Tr::kBlockN;
    const QueryWalk walk = query_walk<Tr>(args, view, n_block);
    if (walk.steps == 0) {  // no row sees the block: its dK and dV are zeros, no K or V needed
      if constexpr (kHandsOutTiles) {
        if (kv_round == 0) sm80::pdl_wait_for_prerequisite_grid();  // before any later tile's statistics
        hand_out(tile);
        sm90::mbarrier_arrive(bar.kv_full);
        ++kv_round;
      }
      continue;
    }
    const int64_t stats_row0 = padded_stats_row0(p, view.q_row0, batch, kBM);
    const auto load_keys_and_values = [&] {
      hand_out(tile);
      sm90::mbarrier_arrive_expect_tx(bar.kv_full, 2 * Tr::kKVTileBytes);
#pragma unroll 1
      for (int panel = 0; panel < Tr::kPanels; ++panel) {
        sm90::tma_load_4d(smem + Tr::kKOffset + panel * Tr::kBlockN * 128, &args.k_map, bar.kv_full, panel * 64,
                          view.k_row0 + n0, kv_head, batch_coordinate);
        sm90::tma_load_4d(smem + Tr::kVOffset + panel * Tr::kBlockN * 128, &args.v_map, bar.kv_full, panel * 64,
                          view.k_row0 + n0, kv_head, batch_coordinate);
      }
      ++kv_round;
    };
    // The CTA's first tile: K and V ahead of its first Q and dO (nothing to wait for).
    const bool keys_first = kv_round == 0;
    if (keys_first) {
      load_keys_and_values();
      // The preprocess (this grid's programmatic prerequisite) writes the
      // statistics and zeros the dq accumulator: the CTA's first K and V
      // go out before the wait, under its tail.
      sm80::pdl_wait_for_prerequisite_grid();
    }
#pragma unroll 1
    for (int step = 0; step < walk.steps; ++step, ++iteration) {
      const int head = kv_head * group + walk.head_in_group(step);
      const int m0 = walk.query_block(step) * kBM;
      const auto [stage, phase] = sm90::RingSlot<Tr::kStages>(iteration);
      const auto [do_stage, do_phase] = sm90::RingSlot<Tr::kDoStages>(iteration);
      // The stage's LSE rows, and D after them in the dO stage's slot.
      float* const stats = reinterpret_cast<float*>(smem + Tr::kStatsOffset) + stage * Tr::kStatsFloats;
      float* const d_stats = Tr::kDoStages == Tr::kStages
                                 ? stats + kBM
                                 : reinterpret_cast<float*>(smem + Tr::kStatsOffset) + do_stage * Tr::kStatsFloats + kBM;
      const int64_t stats_row = head * args.stats_rows + stats_row0 + m0;
      sm90::mbarrier_wait(&bar.q_empty[stage], phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(&bar.q_full[stage], Tr::kQTileBytes + kBM * 4);
#pragma unroll 1
      for (int panel = 0; panel < Tr::kPanels; ++panel)
        sm90::tma_load_4d(smem + Tr::kQOffset + stage * Tr::kQTileBytes + panel * kBM * 128, &args.q_map,
                          &bar.q_full[stage], panel * 64, view.q_row0 + m0, head, batch_coordinate);
      sm90::bulk_load(stats, args.lse_log2 + stats_row, kBM * 4, &bar.q_full[stage]);
      sm90::mbarrier_wait(&bar.do_empty[do_stage], do_phase ^ 1);
      sm90::mbarrier_arrive_expect_tx(&bar.do_full[do_stage], Tr::kQTileBytes + kBM * 4);
#pragma unroll 1
      for (int panel = 0; panel < Tr::kPanels; ++panel)
        sm90::tma_load_4d(smem + Tr::kDoOffset + do_stage * Tr::kQTileBytes + panel * kBM * 128, &args.do_map,
                          &bar.do_full[do_stage], panel * 64, view.q_row0 + m0, head, batch_coordinate);
      sm90::bulk_load(d_stats, args.dsum + stats_row, kBM * 4, &bar.do_full[do_stage]);
      if (step == 0 && !keys_first) load_keys_and_values();
    }
  }
  // The convert kernel may launch (it waits for this grid before reading).
  sm80::pdl_launch_dependents();
  if constexpr (kHandsOutTiles) {
    hand_out(-1);  // no more tiles
    sm90::mbarrier_arrive(bar.kv_full);
  }
}

// ---------------------------------------------------------------------------
// The dQ writer warps (DqAdd::writer and writer_in_order: the producer
// warpgroup's second and third warps, one per consumer): per step, the
// consumer's staged slab goes to the accumulator as one bulk reduce-add
// (cp.reduce.async.bulk ... add.f32, 16-20 KB) off the consumers' path, and
// the staging buffer goes back to the consumer once the copy has read it.

// A staged slab's place in the accumulator (dq_accum: the sequence's).
template <class Tr>
__device__ __forceinline__ float* dq_slab_of(const AttentionBackwardParams& p, float* dq_accum, int head,
                                             int m_block, int slab_index) {
  return dq_accum + head * p.dq_accum_head_stride +
         static_cast<int64_t>(m_block) * Tr::kBlockM * p.dq_accum_row_stride + slab_index * Tr::kDqSlabFloats;
}

// In order (the deterministic mode, a CTA a tile): a slab first waits for its
// turn, and the turn passes on (count + 1) once the addition is done.
// (Consumers waiting for the turn themselves: 1.15-1.45x the default mode's
// time; one writer for both slabs, the buffer back after the addition:
// 1.05-1.40x; H100, session 21.) The turns chain the CTAs, so the writer's
// latency counts: written for one tile, not the persistent loop below (its
// tile loop and hand-backs cost the deterministic mode 2-4.5% at head_dim 64
// and 256, and 12-52 bytes more spills; H200, session 39).
template <class Tr>
__device__ __forceinline__ void backward_dq_writer_in_order(const BwdKernelArguments& args, unsigned char* smem,
                                                            int consumer) {
  const AttentionBackwardParams& p = args.params;
  const int lane = threadIdx.x % 32;
  // The deterministic mode runs a CTA a tile (launch_backward_typed): the
  // staging handshakes below start and end with the walk.
  const BackwardCta cta = backward_cta<true>(args, first_backward_tile());
  const int key_index = cta.key_index, kv_head = cta.kv_head, batch = cta.batch;
  const int group = p.heads / p.kv_heads;
  const BackwardSequenceView view = backward_sequence_view(p, batch);
  const int n_block = cta_key_block<true>(p, (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, key_index);
  if (n_block < 0) return;
  const QueryWalk walk = query_walk<Tr>(args, view, n_block);
  float* const dq_accum = p.dq_accum + view.dq_accum_offset;
  const unsigned char* const staged = smem + Tr::kDqStageOffset + consumer * Tr::kDqStageStride;
#pragma unroll 1
  for (int step = 0; step < walk.steps; ++step) {
    const int head = kv_head * group + walk.head_in_group(step);
    const int m_block = walk.query_block(step);
    const int rank = dq_rank<Tr>(p, view, walk, n_block, m_block);
    // The consumer's slabs of this step, from `first`, are added (not only
    // read): the next key block's turn.
    const auto release_added = [&](int* first, int count) {
      sm90::bulk_wait_group<0>();
      sm90::fence_proxy_async_global();
#pragma unroll 1
      for (int j = 0; j < count; ++j) sm90::add_release_gpu(first + j, 1);
    };
#pragma unroll 1
    for (int i = 0; i < Tr::kDqSlabs; ++i) {
      const int slab_index = consumer * Tr::kDqSlabs + i;
      float* const slab = dq_slab_of<Tr>(p, dq_accum, head, m_block, slab_index);
      int* const semaphore =
          args.dq_semaphore +
          ((static_cast<int64_t>(batch) * p.heads + head) * args.query_blocks + m_block) * Tr::kDqBlockSlabs +
          slab_index;
      sm90::named_barrier_sync(Tr::kDqFullBarrier + consumer, 128 + 32);
      if (lane == 0) {
        while (sm90::load_acquire_gpu(semaphore) != rank) {
        }
        sm90::fence_proxy_async_global();
        sm90::bulk_reduce_add_f32(slab, staged, Tr::kDqSlabBytes);
        sm90::bulk_commit_group();
        sm90::bulk_wait_group_read<0>();
      }
      __syncwarp();
      // The consumer waits for this before it writes the buffer again (its
      // next slab; at the head dim split also its next swap store): none
      // after the walk's last slab.
      if (step + 1 < walk.steps || i + 1 < Tr::kDqSlabs)
        sm90::named_barrier_arrive(Tr::kDqEmptyBarrier + consumer, 128 + 32);
      // The head dim split takes a step's slabs before it waits for their
      // additions: waiting for each slab's addition before taking the next
      // held up the second slab, and with it the consumer's next swap store,
      // an L2 round trip (the d256 deterministic mode: 1.29-1.38x its
      // default's time -> 1.16-1.23x, H200, session 31). One slab a step
      // (head_dim 64/128) keeps this order: releasing after the loop cost
      // those 1-3%.
      if (lane == 0 && (Tr::kDqSlabs == 1 || i + 1 == Tr::kDqSlabs))
        release_added(semaphore - i, Tr::kDqSlabs);
    }
  }
}

// In any order (the default mode): the writer walks the CTA's tiles as the
// consumers do (those the producer hands out, BwdBarriers::tile, where
// Tr::kHandsOutTiles) and hands back every staged slab, the CTA's last too:
// the consumer takes that hand-back after its last tile.
template <class Tr>
__device__ __forceinline__ void backward_dq_writer(const BwdKernelArguments& args, unsigned char* smem,
                                                   const BwdBarriers<Tr>& bar, int consumer) {
  const AttentionBackwardParams& p = args.params;
  const int lane = threadIdx.x % 32;
  const int group = p.heads / p.kv_heads;
  const unsigned char* const staged = smem + Tr::kDqStageOffset + consumer * Tr::kDqStageStride;
#pragma unroll 1
  for (uint32_t round = 0;; ++round) {
    int tile;
    if constexpr (Tr::kHandsOutTiles) {
      // The round's tile, as the consumers take it; read, the producer may
      // hand out the next (kv_empty counts the writer warps' threads too).
      sm90::mbarrier_wait(bar.kv_full, round & 1);
      tile = *bar.tile;
      sm90::mbarrier_arrive(bar.kv_empty);
      if (tile < 0) break;
    } else {
      tile = static_backward_tile(round);
      if (tile >= args.tiles) break;
    }
    const BackwardCta cta = backward_cta<false>(args, tile);
    const int kv_head = cta.kv_head, batch = cta.batch;
    const BackwardSequenceView view = backward_sequence_view(p, batch);
    const int n_block = cta_key_block<false>(p, (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN, cta.key_index);
    if (n_block < 0) continue;  // past a shorter sequence's keys (never handed out)
    const QueryWalk walk = query_walk<Tr>(args, view, n_block);
    float* const dq_accum = p.dq_accum + view.dq_accum_offset;
#pragma unroll 1
    for (int step = 0; step < walk.steps; ++step) {
      const int head = kv_head * group + walk.head_in_group(step);
      const int m_block = walk.query_block(step);
#pragma unroll 1
      for (int i = 0; i < Tr::kDqSlabs; ++i) {
        float* const slab = dq_slab_of<Tr>(p, dq_accum, head, m_block, consumer * Tr::kDqSlabs + i);
        sm90::named_barrier_sync(Tr::kDqFullBarrier + consumer, 128 + 32);
        if (lane == 0) {
          sm90::bulk_reduce_add_f32(slab, staged, Tr::kDqSlabBytes);
          sm90::bulk_commit_group();
          sm90::bulk_wait_group_read<0>();
        }
        __syncwarp();
        // The consumer waits for this before it writes the buffer again.
        sm90::named_barrier_arrive(Tr::kDqEmptyBarrier + consumer, 128 + 32);
      }
    }
  }
  if (lane == 0) sm90::bulk_wait_group<0>();  // the last additions done before the CTA ends
}

// ---------------------------------------------------------------------------
// A consumer's element-wise steps and stores on its accumulators (m64nN
// fragments: this thread's keys are rows first_key and first_key + 8, its
// query columns 8 n + 2 quad_col + e).

// Each element index i of a transposed m64nBlockM accumulator (this thread's
// keys as rows) with its query column's value from `rows` (the LSE or D of
// the query rows in the stage): f(i, value).
template <class Tr, class F>
__device__ __forceinline__ void for_each_query_column(const float* rows, int quad_col, F&& f) {
#pragma unroll
  for (int n = 0; n < Tr::kBlockM / 8; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float value = rows[n * 8 + quad_col * 2 + e];
#pragma unroll
      for (int h = 0; h < 2; ++h) f(n * 4 + h * 2 + e, value);
    }
}

// P^T = exp2(S^T * scale_log2 - LSE_log2 of the column's row), in place; the
// mask (a column policy: rows that do not see the key) where `masked`.
template <class Tr>
__device__ __forceinline__ void transposed_probabilities(float (&acc_s)[Tr::kBlockM / 2], const float* lse_rows,
                                                         float scale_log2, bool masked, const VisibleKeyMask& mask,
                                                         int first_key, int m0, int quad_col) {
  if (masked) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      mask.apply_column<Tr::kBlockM / 8>(first_key + h * 8, m0, quad_col * 2,
                                         [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; });
  }
  for_each_query_column<Tr>(lse_rows, quad_col, [&](int i, float lse_log2) {
    acc_s[i] = sm80::fast_exp2(fmaf(acc_s[i], scale_log2, -lse_log2));
  });
}

// dS^T = P^T * (dP^T - D of the column's row), in place of dP^T.
template <class Tr>
__device__ __forceinline__ void transposed_score_gradients(const float (&acc_p)[Tr::kBlockM / 2],
                                                           float (&acc_dp)[Tr::kBlockM / 2], const float* d_rows,
                                                           int quad_col) {
  for_each_query_column<Tr>(d_rows, quad_col, [&](int i, float row_d) { acc_dp[i] = acc_p[i] * (acc_dp[i] - row_d); });
}

// Score modifications (kModified): S^T through the policy, the mask, then
// P^T in place of S^T and dS^T = P^T (dP^T - D) ds'/ds in place of dP^T.
template <class Tr, class Modifier>
__device__ __forceinline__ void modified_probabilities_and_gradients(
    float (&acc_s)[Tr::kBlockM / 2], float (&acc_dp)[Tr::kBlockM / 2], const float* lse_rows, const float* d_rows,
    float scale_log2, bool masked, const VisibleKeyMask& mask, const Modifier& modifier, int first_key, int m0,
    int quad_col) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
    modifier.template apply_column<Tr::kBlockM / 8>(first_key + h * 8, m0, quad_col * 2,
                                                    [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; });
  if (masked) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      mask.apply_column<Tr::kBlockM / 8>(first_key + h * 8, m0, quad_col * 2,
                                         [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; });
  }
  // ds'/ds from s': without ALiBi no distance to add back (about half the
  // instructions an element).
  const auto gradients = [&](auto factor_of) {
#pragma unroll
    for (int n = 0; n < Tr::kBlockM / 8; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int column = n * 8 + quad_col * 2 + e;
        const float lse_log2 = lse_rows[column], row_d = d_rows[column];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = n * 4 + h * 2 + e;
          const float factor = factor_of(acc_s[i], m0 + column, first_key + h * 8);
          acc_s[i] = sm80::fast_exp2(fmaf(acc_s[i], scale_log2, -lse_log2));
          acc_dp[i] = acc_s[i] * (acc_dp[i] - row_d) * factor;
        }
      }
  };
  if (modifier.has_alibi())
    gradients([&](float s, int row, int key) { return modifier.gradient_factor_of(s, row, key); });
  else
    gradients([&](float s, int, int) { return modifier.softcap_gradient_factor_of(s); });
}

// A consumer's dQ slab (an m64n64 accumulator, or m64nBlockM for dQ^T) in the
// accumulator's fragment order (SlabDqOrder): float4 n of thread (warp, lane)
// at group n * 4 + warp. Straight from registers: 16-byte reductions, 512
// contiguous bytes a warp. (The writer warps' bulk reduce-add instead:
// 0.99-1.02x the time at head_dim 128, 1.00-1.09x at 64 on the H100, session
// 21; 0.935-0.972x and 0.959-0.989x without a mask on an H200, session 39,
// with 80-row blocks at 128, and 0.965-0.990x causal, session 40: backward_dq_add.)
template <int kValues>
__device__ __forceinline__ void add_dq_slab(float* slab, int warp, int lane, const float (&acc_dq)[kValues]) {
#pragma unroll
  for (int n = 0; n < kValues / 4; ++n)
    sm80::red_add_f32x4(slab + ((n * 4 + warp) * 32 + lane) * 4, acc_dq[n * 4], acc_dq[n * 4 + 1],
                        acc_dq[n * 4 + 2], acc_dq[n * 4 + 3]);
}
// The same slab into shared memory, for the writer warp (DqAdd::writer*).
template <int kValues>
__device__ __forceinline__ void store_dq_slab(float* staged, int warp, int lane, const float (&acc_dq)[kValues]) {
#pragma unroll
  for (int n = 0; n < kValues / 4; ++n)
    *reinterpret_cast<float4*>(staged + ((n * 4 + warp) * 32 + lane) * 4) =
        make_float4(acc_dq[n * 4], acc_dq[n * 4 + 1], acc_dq[n * 4 + 2], acc_dq[n * 4 + 3]);
}

// One dQ slab of a step (slab: its index in the query block) out of a
// consumer's registers: added with red.global.add, or staged for the
// consumer's writer warp, which adds it (in its turn: writer_in_order);
// staging_busy: wait until the writer has read the previous slab out of the buffer.
template <class Tr, DqAdd kDq>
__device__ __forceinline__ void dq_slab_out(const AttentionBackwardParams& p, const BackwardSequenceView& view,
                                            unsigned char* smem, int n_block, int batch, int head, int m0, int slab,
                                            bool staging_busy, int consumer, int warp, int lane,
                                            const float (&acc_dq)[Tr::kDqSlabFloats / 128]) {
  static_cast<void>(n_block), static_cast<void>(batch);  // the cuda-gdb stop's condition names them
  // cuda-gdb: this step's dQ slab `slab` of query block m0 / kBM, head `head` (fa3_wgmma_sm90_bwd_locate.cpp).
  if constexpr (kDq != DqAdd::registers) {
    if (staging_busy) sm90::named_barrier_sync(Tr::kDqEmptyBarrier + consumer, 128 + 32);
    store_dq_slab(reinterpret_cast<float*>(smem + Tr::kDqStageOffset + consumer * Tr::kDqStageStride), warp, lane,
                  acc_dq);
    sm90::fence_proxy_async_shared();
    sm90::named_barrier_arrive(Tr::kDqFullBarrier + consumer, 128 + 32);
  } else {
    static_cast<void>(staging_busy), static_cast<void>(smem), static_cast<void>(consumer);
    add_dq_slab(p.dq_accum + view.dq_accum_offset + head * p.dq_accum_head_stride +
                    static_cast<int64_t>(m0) * p.dq_accum_row_stride + slab * Tr::kDqSlabFloats,
                warp, lane, acc_dq);
  }
}

// The epilogue: dK * scale and dV of this thread's keys (zeros for a key
// block no query row sees), columns column0 .. + kKeyGradColumns, 4-byte
// stores of the keys < seqlen_k.
template <class Tr, typename Element>
__device__ __forceinline__ void store_key_gradients(const AttentionBackwardParams& p,
                                                    const BackwardSequenceView& view, int kv_head, int n0,
                                                    int key_row0, int column0, int quad_col, int tile,
                                                    const float (&acc_dk)[Tr::kKeyGradColumns / 2],
                                                    const float (&acc_dv)[Tr::kKeyGradColumns / 2]) {
  static_cast<void>(tile);  // the cuda-gdb stop's condition names it
  Element* const dk_out = static_cast<Element*>(p.dk) + view.dk_offset + kv_head * p.dk_head_stride + column0;
  Element* const dv_out = static_cast<Element*>(p.dv) + view.dv_offset + kv_head * p.dv_head_stride + column0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + key_row0 + h * 8;
    if (key < view.seqlen_k) {
      // cuda-gdb: key `key`'s dK and dV sums over the walk, before the store (fa3_wgmma_sm90_bwd_locate.cpp).
#pragma unroll
      for (int n = 0; n < Tr::kKeyGradColumns / 8; ++n) {
        const int col = n * 8 + quad_col * 2;
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            sm80::pack2<Element>(acc_dk[n * 4 + h * 2] * p.softmax_scale, acc_dk[n * 4 + h * 2 + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            sm80::pack2<Element>(acc_dv[n * 4 + h * 2], acc_dv[n * 4 + h * 2 + 1]);
      }
    }
  }
}

// The epilogue where the kernel stages (backward_stages_key_gradients), of a
// block whose keys are all in the sequence and whose walk has steps
// (store_key_gradients otherwise). Once both consumers' GEMMs of the tile
// are done, K and V are read no more: each consumer stages dK * scale and dV
// of its keys and columns over its rows of the K and V tiles (stmatrix, the
// input dtype, their TMA layout: 64-column panels of 128-byte swizzled rows),
// and its first thread stores them with TMA (a 64-row box a panel), waits
// until they are read, and then releases K and V for the consumer's 128
// threads (kv_empty). Stored 4 bytes a thread at a
// time from registers instead, the stores took 6-12% of the backward's time
// at 1k and 3-4% at 4k (H200, session 43, timed by skipping them); this
// epilogue took 0.91-0.94x the backward's time at 1k and 0.96-0.99x at 4k
// (head dims 128 and 256; deterministic at 64: 0.93-0.98x).
template <class Tr, typename Element>
__device__ __forceinline__ void stage_key_gradients(unsigned char* smem, int consumer, int warp, int lane, int n0,
                                                    int key_row0, int column0, int tile, float scale,
                                                    const float (&acc_dk)[Tr::kKeyGradColumns / 2],
                                                    const float (&acc_dv)[Tr::kKeyGradColumns / 2]) {
  static_cast<void>(tile);  // the cuda-gdb stop's condition names it
  const uint32_t k_tile = sm90::smem_address(smem + Tr::kKOffset), v_tile = sm90::smem_address(smem + Tr::kVOffset);
  const int matrix = lane / 8, row = lane % 8;  // the 8 x 8 tile, and its row, whose address this lane gives
  const int first_row = (Tr::kSplitsHeadDim ? 0 : consumer * 64) + warp * 16;  // the warp's 16 rows of the block
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + key_row0 + h * 8;
    static_cast<void>(key);
    // cuda-gdb: key `key`'s dK and dV, staged for the TMA store (fa3_wgmma_sm90_bwd_locate.cpp).
#pragma unroll
    for (int n4 = 0; n4 < Tr::kKeyGradColumns / 32; ++n4) {
      uint32_t dk[4], dv[4];  // tile j: columns 8 (4 n4 + j).., rows h * 8.. of the warp's
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n4 * 4 + j;
        dk[j] = sm80::pack2<Element>(acc_dk[n * 4 + h * 2] * scale, acc_dk[n * 4 + h * 2 + 1] * scale);
        dv[j] = sm80::pack2<Element>(acc_dv[n * 4 + h * 2], acc_dv[n * 4 + h * 2 + 1]);
      }
      const int stored_row = first_row + h * 8 + row, column = column0 + (n4 * 4 + matrix) * 8;
      const uint32_t offset = (column / 64) * Tr::kBlockN * 128 + stored_row * 128 + ((column % 64 / 8) ^ row) * 16;
      sm90::stmatrix_x4(k_tile + offset, dk);
      sm90::stmatrix_x4(v_tile + offset, dv);
    }
  }
}
template <class Tr, typename Element>
__device__ __forceinline__ void store_key_gradients_by_tma(const BwdKernelArguments& args,
                                                           const BackwardSequenceView& view, unsigned char* smem,
                                                           uint64_t* kv_empty, int kv_head, int batch, int n0,
                                                           int key_row0, int column0, int consumer, int thread,
                                                           int tile, const float (&acc_dk)[Tr::kKeyGradColumns / 2],
                                                           const float (&acc_dv)[Tr::kKeyGradColumns / 2]) {
  sm90::named_barrier_sync(Tr::kKeysReadBarrier, 128 * Tr::kConsumers);
  stage_key_gradients<Tr, Element>(smem, consumer, thread / 32, thread % 32, n0, key_row0, column0, tile,
                                   args.params.softmax_scale, acc_dk, acc_dv);
  sm90::fence_proxy_async_shared();
  sm90::named_barrier_sync(Tr::kKeyGradsStagedBarrier + consumer, 128);
  if (thread == 0) {
    const int key_base = Tr::kSplitsHeadDim ? 0 : consumer * 64;
    const int row = view.k_row0 + n0 + key_base, batch_coordinate = args.params.is_varlen() ? 0 : batch;
#pragma unroll
    for (int panel = column0 / 64; panel < (column0 + Tr::kKeyGradColumns) / 64; ++panel) {
      const int offset = panel * Tr::kBlockN * 128 + key_base * 128;
      sm90::tma_store_4d(&args.dk_map, smem + Tr::kKOffset + offset, panel * 64, row, kv_head, batch_coordinate);
      sm90::tma_store_4d(&args.dv_map, smem + Tr::kVOffset + offset, panel * 64, row, kv_head, batch_coordinate);
    }
    sm90::bulk_commit_group();
    sm90::bulk_wait_group_read<0>();  // read: the producer may load the next tile's K and V over them
    sm90::mbarrier_arrive(kv_empty, 128);
  }
}

// Head dim split: a consumer's m64nBlockM accumulator into its swap buffer,
// or its partner's out of the other one: float4 g of thread t at g * 128 + t
// (each warp's 512 bytes contiguous: no bank conflicts).
template <int kValues>
__device__ __forceinline__ void store_swapped(float* buffer, int thread, const float (&acc)[kValues]) {
#pragma unroll
  for (int g = 0; g < kValues / 4; ++g)
    reinterpret_cast<float4*>(buffer)[g * 128 + thread] = make_float4(acc[g * 4], acc[g * 4 + 1], acc[g * 4 + 2],
                                                                      acc[g * 4 + 3]);
}
template <int kValues>
__device__ __forceinline__ void load_swapped(const float* buffer, int thread, float (&acc)[kValues]) {
#pragma unroll
  for (int g = 0; g < kValues / 4; ++g) {
    const float4 v = reinterpret_cast<const float4*>(buffer)[g * 128 + thread];
    acc[g * 4] = v.x, acc[g * 4 + 1] = v.y, acc[g * 4 + 2] = v.z, acc[g * 4 + 3] = v.w;
  }
}

// ---------------------------------------------------------------------------
// A consumer warpgroup: its keys of the block (Tr::kConsumerKeys) against every
// query block of the walk; with the head dim split, its half of the columns.
template <class Tr, typename Element, DqAdd kDq, bool kModified>
__device__ __forceinline__ void backward_consumer(const BwdKernelArguments& args,
                                                 unsigned char* smem, const BwdBarriers<Tr>& bar) {
  constexpr int kD = Tr::kHeadDim;
  constexpr int kBM = Tr::kBlockM;
  constexpr int kBN = Tr::kBlockN;
  constexpr bool kSplit = Tr::kSplitsHeadDim;
  constexpr int kGradColumns = Tr::kKeyGradColumns;
  static_assert(!kSplit || !kModified, "the head dim split has no score modification");
  constexpr bool kOrdered = kDq == DqAdd::writer_in_order;
  constexpr bool kStaged = kDq != DqAdd::registers;
  constexpr bool kStagesKeys = backward_stages_key_gradients(kD, kOrdered);  // the epilogue's kind (fa3_wgmma_sm90.h)
  const AttentionBackwardParams& p = args.params;
  uint64_t* kv_full = bar.kv_full;
  uint64_t* kv_empty = bar.kv_empty;
  uint64_t* q_full = bar.q_full;
  uint64_t* q_empty = bar.q_empty;
  uint64_t* do_full = bar.do_full;
  uint64_t* do_empty = bar.do_empty;
  float* const stats_smem = reinterpret_cast<float*>(smem + Tr::kStatsOffset);
  const uint32_t base = sm90::smem_address(smem);
  const uint32_t k_address = base + Tr::kKOffset, v_address = base + Tr::kVOffset;

  // Keys split: which 64 keys of the block; head dim split: which half of
  // the columns, and consumer 0 computes S^T, consumer 1 dP^T.
  const int consumer = threadIdx.x / 128 - 1;
  const int thread = threadIdx.x % 128;
  const int warp = thread / 32, lane = thread % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int key_row0 = (kSplit ? 0 : consumer * 64) + warp * 16 + quad_row;  // this thread's first key in the block
  const int grad_column0 = kSplit ? consumer * kGradColumns : 0;             // its first dK / dV column

  const int group = p.heads / p.kv_heads;
  const float scale_log2 = p.softmax_scale * kLog2e;

  float acc_s[kBM / 2], acc_dp[kBM / 2];
  uint32_t p_frag[kBM / 16][4], ds_frag[kBM / 16][4];
  float acc_dq[Tr::kDqSlabFloats / 128];
  float acc_dk[kGradColumns / 2], acc_dv[kGradColumns / 2];

  // S^T = K Q^T (or dP^T = V dO^T): 64 keys (this consumer's) x kBM queries.
  const auto issue_scores = [&](float (&acc)[kBM / 2], uint32_t keys, uint32_t queries) {
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      const uint32_t column_bytes = (ks % 4) * 32;
      const uint64_t desc_keys = sm90::make_smem_descriptor_sw128(
          keys + (ks / 4) * kBN * 128 + (kSplit ? 0 : consumer * 64 * 128) + column_bytes, 16, 1024);
      const uint64_t desc_queries = sm90::make_smem_descriptor_sw128(
          queries + (ks / 4) * kBM * 128 + column_bytes, 16, 1024);
      sm90::wgmma_ss<kBM, Element>(acc, desc_keys, desc_queries, ks > 0);
    }
    sm90::wgmma_commit();
  };
  // acc += frag^T-as-A x tile's columns grad_column0.. (dV += P^T dO, dK +=
  // dS^T Q): tile MN-major, 64-column panels kBM * 128 bytes apart.
  const auto issue_key_gradient = [&](float (&acc)[kGradColumns / 2], const uint32_t (&frag)[kBM / 16][4],
                                      uint32_t tile) {
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      const uint64_t desc = sm90::make_smem_descriptor_sw128(
          tile + grad_column0 / 64 * kBM * 128 + kk * 16 * 128, kBM * 128, 1024);
      sm90::wgmma_rs<kGradColumns, Element>(acc, frag[kk], desc, 1);
    }
    sm90::wgmma_commit();
  };
  // dQ slab slab_in_consumer of this consumer's (kDqSlabs: 2 at the head dim
  // split, along the columns) = dS K: A = dS^T buffer (keys as rows,
  // MN-major), B = K (MN-major). Transposed (kTransposedDq): dQ^T of the
  // consumer's 64 columns = K^T dS^T: A = K's column panel (MN-major), B = dS
  // (query rows, 64-key panels: K-major).
  static_assert(Tr::kDqSplitsColumns || Tr::kDqSlabs == 1, "several slabs a consumer lie along the columns");
  const int dq_query_panel = Tr::kDqSplitsColumns ? 0 : consumer;  // of the consumer's first slab
  const int dq_column_panel = Tr::kDqSplitsColumns ? consumer * Tr::kDqSlabs : 0;
  const auto issue_dq = [&](uint32_t ds_tile, int slab_in_consumer) {
    const int query_panel = dq_query_panel;
    const int column_panel = dq_column_panel + slab_in_consumer;
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      const uint64_t desc_k = sm90::make_smem_descriptor_sw128(
          k_address + column_panel * kBN * 128 + kk * 16 * 128, kBN * 128, 1024);
      if constexpr (Tr::kTransposedDq) {
        static_cast<void>(query_panel);
        const uint64_t desc_ds =
            sm90::make_smem_descriptor_sw128(ds_tile + (kk / 4) * kBM * 128 + (kk % 4) * 32, 16, 1024);
        sm90::wgmma_ss_a_mn_major<kBM, Element>(acc_dq, desc_k, desc_ds, kk > 0);
      } else {
        const uint64_t desc_ds = sm90::make_smem_descriptor_sw128(
            ds_tile + query_panel * kBN * 128 + kk * 16 * 128, kBN * 128, 1024);
        sm90::wgmma_ss_mn_major<64, Element>(acc_dq, desc_ds, desc_k, kk > 0);
      }
    }
    sm90::wgmma_commit();
  };
  // dS^T into a buffer: row = key, 64-query panels of 128-byte swizzled rows.
  // Head dim split: both consumers hold all of dS^T, each stores half the columns.
  // Transposed dQ: dS, row = query, the consumer's 64 keys its panel of
  // 128-byte swizzled rows; stmatrix.trans turns each 8 x 8 fragment tile
  // (keys x queries) into 8 query rows of 8 keys (16 bytes, one chunk each).
  const auto store_ds = [&](unsigned char* ds_tile) {
    if constexpr (Tr::kTransposedDq) {
      const uint32_t panel = sm90::smem_address(ds_tile) + consumer * kBM * 128;
      const int tile = lane / 8, row = lane % 8;  // this lane's address: tile `tile`'s stored row `row`
#pragma unroll
      for (int kk = 0; kk < kBM / 16; ++kk) {
        const int query = kk * 16 + (tile / 2) * 8 + row;  // query % 8 == row
        const int chunk = (2 * warp + tile % 2) ^ row;
        sm90::stmatrix_x4_trans(panel + query * 128 + chunk * 16, ds_frag[kk]);
      }
    } else {
#pragma unroll
      for (int n = 0; n < kBM / 8; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (kSplit && n / (kBM / 16) != consumer) continue;  // (n static: ds_frag stays in registers)
          const int key = key_row0 + h * 8;
          const int query = n * 8 + quad_col * 2;
          const int chunk = (query % 64) / 8 ^ (key % 8);
          *reinterpret_cast<uint32_t*>(ds_tile + (query / 64) * kBN * 128 + key * 128 + chunk * 16 +
                                       (query % 8) * 2) = ds_frag[n / 2][(n % 2) * 2 + h];
        }
    }
  };
  // Every consumer thread arrives, after its reads of the stage (BwdBarriers).
  const auto release = [&](uint64_t* barrier) { sm90::mbarrier_arrive(barrier); };
  constexpr bool kHandsOutTiles = kHandsOut<Tr, kDq>;
  uint32_t iteration = 0, kv_round = 0;  // ring slots and K/V rounds of the CTA so far (the producer's)
  // Whether this consumer staged a dQ slab before this step: in order (a CTA
  // a tile), earlier in the walk; in any order, earlier in the CTA's tiles.
  const auto staged_before = [&](int step) { return kOrdered ? step > 0 : iteration > 0; };
#pragma unroll 1
  for (uint32_t round = 0;; ++round) {
    int tile;
    if constexpr (kHandsOutTiles) {
      // The round's tile from the producer (its K and V landed with it).
      sm90::mbarrier_wait(kv_full, kv_round & 1);
      tile = *bar.tile;
      if (tile < 0) break;
    } else {
      tile = static_backward_tile(round);
      if (tile >= args.tiles) break;
    }
    const BackwardCta cta = backward_cta<kOrdered>(args, tile);
    const int kv_head = cta.kv_head, batch = cta.batch;
    const BackwardSequenceView view = backward_sequence_view(p, batch);
    const VisibleKeyMask mask{view.seqlen_q, view.seqlen_k, p.window_left, p.window_right};
    const int n_block = cta_key_block<kOrdered>(p, (view.seqlen_k + kBN - 1) / kBN, cta.key_index);
    if (n_block < 0) continue;  // past a shorter sequence's keys (never handed out)
    const int n0 = n_block * kBN;
    const QueryWalk walk = query_walk<Tr>(args, view, n_block);
    // The epilogue: staged over K and V and stored by TMA, which then releases
    // them (store_key_gradients_by_tma), or from registers where the kernel
    // does not stage (a persistent CTA at head_dim 64) or the block ends past
    // the sequence's keys (the walk's last step releases K and V), or walks
    // nothing (released at the round's start, or never loaded).
    const bool tile_stages_keys = kStagesKeys && walk.steps > 0 && n0 + kBN <= view.seqlen_k;
#pragma unroll
    for (int i = 0; i < kGradColumns / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
    if constexpr (kHandsOutTiles) {
      if (walk.steps == 0) release(kv_empty);  // handed out without K and V
    } else if (walk.steps > 0) {
      sm90::mbarrier_wait(kv_full, kv_round & 1);
    }
    // A round for the producer: every tile it hands out, else a tile with a step.
    if (kHandsOutTiles || walk.steps > 0) ++kv_round;
#pragma unroll 1
    for (int step = 0; step < walk.steps; ++step, ++iteration) {
      const int head = kv_head * group + walk.head_in_group(step);
      const int m0 = walk.query_block(step) * kBM;
      const auto [stage, phase] = sm90::RingSlot<Tr::kStages>(iteration);
      const sm90::RingSlot<Tr::kDoStages> do_slot(iteration);
      // (The keys split's rings turn together: the Q stage's own values.)
      const int do_stage = Tr::kDoStages == Tr::kStages ? stage : do_slot.stage;
      const uint32_t do_phase = Tr::kDoStages == Tr::kStages ? phase : do_slot.phase;
      const uint32_t q_tile = base + Tr::kQOffset + stage * Tr::kQTileBytes;
      const uint32_t do_tile = base + Tr::kDoOffset + do_stage * Tr::kQTileBytes;
      const int ds_buffer = iteration % 2;
      // The step's mask flag and stats rows, computed where they are first
      // needed (ahead of the GEMMs they cost the keys split 1-2%, H200,
      // session 29).
      const auto is_masked = [&] {
        return n0 + kBN > view.seqlen_k || mask.needs_mask(m0, m0 + kBM - 1, n0, n0 + kBN - 1);
      };
      const auto lse_rows_of_stage = [&] { return stats_smem + stage * Tr::kStatsFloats; };
      const auto d_rows_of_stage = [&](const float* lse_rows) {
        return Tr::kDoStages == Tr::kStages ? lse_rows + kBM : stats_smem + do_stage * Tr::kStatsFloats + kBM;
      };

      sm90::mbarrier_wait(&q_full[stage], phase);
      if constexpr (kSplit) {
        // One GEMM each (the same code, other operands), then P^T and dP^T
        // swapped through shared memory: both consumers then hold P^T and
        // dS^T of all 64 keys. Both read both buffers back, so no register
        // array depends on the consumer (ptxas spilled 504 bytes merging
        // the two branches' wgmma registers otherwise).
        float* const swapped = reinterpret_cast<float*>(smem + Tr::kSwapOffset);
        constexpr int kSwapFloats = Tr::kSwapBytes / 4;
        sm90::mbarrier_wait(&do_full[do_stage], do_phase);
        const bool scores = consumer == 0;
        issue_scores(acc_s, scores ? k_address : v_address, scores ? q_tile : do_tile);
        sm90::wgmma_wait<0>();
        sm90::fence_registers(acc_s);
        const bool masked = is_masked();
        const float* lse_rows = lse_rows_of_stage();
        const float* d_rows = d_rows_of_stage(lse_rows);
        if (scores)
          transposed_probabilities<Tr>(acc_s, lse_rows, scale_log2, masked, mask, n0 + key_row0, m0, quad_col);
        // Staged dQ: the swap buffer held the last step's second dQ slab.
        if (kStaged && staged_before(step)) sm90::named_barrier_sync(Tr::kDqEmptyBarrier + consumer, 128 + 32);
        store_swapped(swapped + consumer * kSwapFloats, thread, acc_s);
        sm90::named_barrier_sync(Tr::kSwappedBarrier, 128 * Tr::kConsumers);
        load_swapped(swapped, thread, acc_s);                 // P^T
        load_swapped(swapped + kSwapFloats, thread, acc_dp);  // dP^T
        transposed_score_gradients<Tr>(acc_s, acc_dp, d_rows, quad_col);
      } else {
        issue_scores(acc_s, k_address, q_tile);
        sm90::mbarrier_wait(&do_full[do_stage], do_phase);
        issue_scores(acc_dp, v_address, do_tile);

        sm90::wgmma_wait<1>();
        sm90::fence_registers(acc_s);
        const bool masked = is_masked();
        const float* lse_rows = lse_rows_of_stage();
        const float* d_rows = d_rows_of_stage(lse_rows);
        // P^T while dP^T may still run, then dS^T.
        const auto probabilities_then_gradients = [&] {
          transposed_probabilities<Tr>(acc_s, lse_rows, scale_log2, masked, mask, n0 + key_row0, m0, quad_col);
          sm90::wgmma_wait<0>();
          sm90::fence_registers(acc_dp);
          transposed_score_gradients<Tr>(acc_s, acc_dp, d_rows, quad_col);
        };
        if constexpr (kModified) {
          const auto modifier = score_modifier<true, true>(p, batch, head, view.seqlen_q, view.seqlen_k);
          if (modifier.has_softcap()) {
            // After dP: P and dS together, ds'/ds recovered from s' (no factors
            // live across the dP GEMM).
            sm90::wgmma_wait<0>();
            sm90::fence_registers(acc_dp);
            modified_probabilities_and_gradients<Tr>(acc_s, acc_dp, lse_rows, d_rows, scale_log2, masked, mask,
                                                     modifier, n0 + key_row0, m0, quad_col);
          } else {  // ALiBi alone: ds'/ds = 1, the plain order
#pragma unroll
            for (int h = 0; h < 2; ++h)
              modifier.template apply_column<kBM / 8>(n0 + key_row0 + h * 8, m0, quad_col * 2,
                                                      [&](int n, int e) -> float& { return acc_s[n * 4 + h * 2 + e]; });
            probabilities_then_gradients();
          }
        } else {
          probabilities_then_gradients();
        }
      }
      // P^T and dS^T as A fragments: k16 step kk takes query columns 16kk..16kk+15.
      sm90::accumulator_to_a_fragments<Element>(acc_s, p_frag);
      sm90::accumulator_to_a_fragments<Element>(acc_dp, ds_frag);
      unsigned char* ds_tile = smem + Tr::kDsOffset + ds_buffer * Tr::kDsTileBytes;
      store_ds(ds_tile);
      sm90::fence_proxy_async_shared();
      issue_key_gradient(acc_dv, p_frag, do_tile);
      sm90::named_barrier_sync(Tr::kDsStoredBarrier, 128 * Tr::kConsumers);  // both consumers' dS
      issue_dq(sm90::smem_address(ds_tile), 0);
      issue_key_gradient(acc_dk, ds_frag, q_tile);
      sm90::wgmma_wait<1>();  // dV and the first dQ slab done
      sm90::fence_registers(acc_dq);
      sm90::fence_registers(acc_dv);
      release(&do_empty[do_stage]);
      // The walk's last step reads K and V no more once its last dQ GEMM is
      // done (dK's reads Q and dS): unless the epilogue stages dK and dV over
      // them, the producer may load the next tile's under dK, the dQ slab and
      // the dK/dV stores (the persistent grid).
      const bool releases_keys = step + 1 == walk.steps && !tile_stages_keys;
      if (Tr::kDqSlabs == 1 && releases_keys) release(kv_empty);
#pragma unroll
      for (int i = 0; i < Tr::kDqSlabs; ++i) {
        if (i > 0) {  // the head dim split's second slab, in the same registers
          issue_dq(sm90::smem_address(ds_tile), i);
          sm90::wgmma_wait<0>();
          sm90::fence_registers(acc_dq);
          if (i == Tr::kDqSlabs - 1 && releases_keys) release(kv_empty);
        }
        // A staging buffer is busy until the writer has read the previous
        // slab, the last tile's too (at the head dim split the first slab's,
        // the swap buffer, was waited for before the swap store and is free
        // since the dS barrier).
        dq_slab_out<Tr, kDq>(p, view, smem, n_block, batch, head, m0, consumer * Tr::kDqSlabs + i,
                             kSplit ? i > 0 : staged_before(step), consumer, warp, lane, acc_dq);
      }
      sm90::wgmma_wait<0>();  // dK done
      sm90::fence_registers(acc_dk);
      release(&q_empty[stage]);
    }
    if (tile_stages_keys)
      store_key_gradients_by_tma<Tr, Element>(args, view, smem, kv_empty, kv_head, batch, n0, key_row0, grad_column0,
                                              consumer, thread, tile, acc_dk, acc_dv);
    else  // K and V released in the walk's last step, or at the round's start
      store_key_gradients<Tr, Element>(p, view, kv_head, n0, key_row0, grad_column0, quad_col, tile, acc_dk,
                                       acc_dv);
    if constexpr (kOrdered) break;  // a CTA a tile
  }
  // The writer in any order hands back every slab: take the CTA's last.
  if constexpr (kDq == DqAdd::writer)
    if (iteration > 0) sm90::named_barrier_sync(Tr::kDqEmptyBarrier + consumer, 128 + 32);
}

// kModified: score modifications (common/score_modification.h): S^T through
// the policy before the mask, dS^T times ds'/ds.
template <class Tr, typename Element, DqAdd kDq, bool kModified = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    fa3_backward_kernel(const __grid_constant__ BwdKernelArguments args) {
  extern __shared__ unsigned char smem_raw[];
  // Aligned by pointer arithmetic on smem_raw (not through an integer), so the
  // compiler keeps knowing the pointers below are shared: LDS/STS for the
  // stats, dS and the dQ staging, not generic LD/ST (SASS, session 21).
  unsigned char* smem = smem_raw + ((1024 - (sm90::smem_address(smem_raw) & 1023)) & 1023);
  const BwdBarriers<Tr> barriers(reinterpret_cast<uint64_t*>(smem + Tr::kBarrierOffset),
                                 reinterpret_cast<int*>(smem + Tr::kTileSlotOffset));
  constexpr bool kWriterTakesTiles = kHandsOut<Tr, kDq> && kDq == DqAdd::writer;
  if (threadIdx.x == 0) barriers.init(128 * Tr::kConsumers + (kWriterTakesTiles ? 32 * Tr::kConsumers : 0));
  __syncthreads();
  // The preprocess zeros the accumulator the writers and consumers add to.
  // Warp 0 (the producer thread; its other lanes leave) waits after its first
  // K/V loads: a wait on its other lanes would hold it at their reconvergence.
  if (threadIdx.x >= 32) sm80::pdl_wait_for_prerequisite_grid();
  if (threadIdx.x < 128) {
    sm90::setmaxnreg_decrease<Tr::kProducerRegisters>();
    if (threadIdx.x == 0) backward_producer<Tr, Element, kDq>(args, smem, barriers);
    else if (kDq != DqAdd::registers && threadIdx.x >= 32 && threadIdx.x < 32 * (1 + Tr::kConsumers)) {
      if constexpr (kDq == DqAdd::writer_in_order) backward_dq_writer_in_order<Tr>(args, smem, threadIdx.x / 32 - 1);
      else backward_dq_writer<Tr>(args, smem, barriers, threadIdx.x / 32 - 1);
    }
    return;
  }
  sm90::setmaxnreg_increase<Tr::kConsumerRegisters>();
  backward_consumer<Tr, Element, kDq, kModified>(args, smem, barriers);
}

// ---------------------------------------------------------------------------
// Host: the workspace (BackwardWorkspace at this tiling), then preprocess,
// main and convert kernels on params.stream.
// The preprocess's destination (backward_dq.cuh): D and the LSE in base 2
// (+inf past seqlen_q and for rows that saw no key: P = 0 there, never NaN;
// D 0 past seqlen_q) of every row of the sequence's padded query blocks.
struct PaddedRowStats {
  float* lse_log2;
  float* dsum;
  int64_t stats_rows;
  int block_m;
  // The padded rows are every row the main kernel adds dQ to (whole query
  // blocks) and the convert kernel reads: zeroing them here saves the memset's
  // launch and its own pass (FA3's preprocess does the same).
  bool zero_dq_accum = true;
  __device__ bool zeroes_dq_accum() const { return zero_dq_accum; }
  __device__ int rows(const AttentionBackwardParams&, const BackwardSequenceView& view) const {
    return (view.seqlen_q + block_m - 1) / block_m * block_m;
  }
  __device__ void store(const AttentionBackwardParams& p, const BackwardSequenceView& view, int batch, int head,
                        int row, float d) const {
    const int64_t at = head * stats_rows + padded_stats_row0(p, view.q_row0, batch, block_m) + row;
    const float lse = row < view.seqlen_q
                          ? p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + view.lse_row0 + row]
                          : -INFINITY;
    lse_log2[at] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    dsum[at] = d;
  }
  __device__ float load(const AttentionBackwardParams& p, const BackwardSequenceView& view, int batch, int head,
                        int row) const {  // D, for the sinks' gradient
    return dsum[head * stats_rows + padded_stats_row0(p, view.q_row0, batch, block_m) + row];
  }
};

template <class Tr, typename Element>
void launch_backward_typed(const AttentionBackwardParams& params) {
  AttentionBackwardParams p = params;
  const BackwardWorkspace workspace =
      backward_workspace(p, Tr::kBlockM, Tr::kBlockN, backward_schedules_dynamically<Tr>(p));
  fa2_mma_sm80::carve_backward_workspace(p, workspace.dq, workspace.total_bytes, "fa3_wgmma_sm90");
  unsigned char* const base = static_cast<unsigned char*>(p.workspace);
  const fa2_mma_sm80::BackwardWorkspace& dq = workspace.dq;
  const auto stream = static_cast<cudaStream_t>(p.stream);
  if (p.batch <= 0 || p.heads <= 0) return;
  const bool has_rows = p.seqlen_q > 0;
  const PaddedRowStats stats{reinterpret_cast<float*>(base + workspace.lse_log2_offset),
                             reinterpret_cast<float*>(base + workspace.dsum_offset), workspace.stats_rows,
                             Tr::kBlockM};
  // The accumulator starts at zero (the preprocess zeros it: stats.zero_dq_accum),
  // and so do the deterministic mode's semaphores after it (a memset, small).
  if (workspace.semaphore_bytes > 0)
    FLASHLAB_CUDA_CHECK(cudaMemsetAsync(base + workspace.semaphore_offset, 0, workspace.semaphore_bytes, stream));
  // The tile counter, where the grid has fewer CTAs than tiles to hand out.
  const DeviceLimits device = device_limits();
  const int tiles = backward_tiles(p, Tr::kBlockN);
  const int ctas = backward_grid_ctas<Tr>(p, tiles, device.multiprocessors);
  int* const tile_counter =
      workspace.tile_counter_bytes > 0 && ctas < tiles ? reinterpret_cast<int*>(base + workspace.tile_counter_offset)
                                                       : nullptr;
  if (tile_counter != nullptr) FLASHLAB_CUDA_CHECK(cudaMemsetAsync(tile_counter, 0, sizeof(int), stream));
  if (has_rows) {
    constexpr int kRows = kBwdAuxThreads / kPreprocessThreadsPerRow<Tr::kHeadDim>;
    const dim3 grid((workspace.query_blocks * Tr::kBlockM + kRows - 1) / kRows, p.heads, p.batch);
    backward_preprocess_kernel<Tr::kHeadDim, Element><<<grid, kBwdAuxThreads, 0, stream>>>(p, stats);
    FLASHLAB_CHECK_LAUNCH("fa3_wgmma_sm90 backward (preprocess)", p);
    launch_backward_sink_gradient(p, stats, "fa3_wgmma_sm90 backward (sink gradient)");
  }
  if (p.seqlen_k > 0) {
    BwdKernelArguments args;
    args.params = p;
    args.dq_semaphore = p.deterministic ? reinterpret_cast<int*>(base + workspace.semaphore_offset) : nullptr;
    args.query_blocks = workspace.query_blocks;
    args.rotates_walks = rotates_backward_walks(p, Tr::kBlockN, fa2_mma_sm80::multiprocessor_count());
    args.order = backward_key_block_order(p, Tr::kBlockN, device.multiprocessors, device.l2_bytes);
    args.lse_log2 = stats.lse_log2;
    args.dsum = stats.dsum;
    args.stats_rows = stats.stats_rows;
    args.q_map = make_tensor_map(p, tensor_operand(p, Operand::q), Tr::kBlockM);
    args.k_map = make_tensor_map(p, tensor_operand(p, Operand::k), Tr::kBlockN);
    args.v_map = make_tensor_map(p, tensor_operand(p, Operand::v), Tr::kBlockN);
    args.do_map = make_tensor_map(
        p, TensorOperand{p.dout, p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride, p.heads, true, "dout"},
        Tr::kBlockM);
    if (backward_stages_key_gradients(Tr::kHeadDim, p.deterministic)) {  // the TMA epilogue's: 64 keys a box
      args.dk_map = make_tensor_map(
          p, TensorOperand{p.dk, p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, p.kv_heads, false, "dk"}, 64);
      args.dv_map = make_tensor_map(
          p, TensorOperand{p.dv, p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride, p.kv_heads, false, "dv"}, 64);
    }
    const bool modified = p.modification.per_element();  // sinks alone: the plain kernel (the LSE has them)
    const DqAdd dq_add = backward_dq_add<Tr>(p);
    auto kernel = fa3_backward_kernel<Tr, Element, DqAdd::writer_in_order>;
    if constexpr (Tr::kWriterAddsDq)
      if (dq_add == DqAdd::writer) kernel = fa3_backward_kernel<Tr, Element, DqAdd::writer>;
    // The transposed dQ tiling runs only where the writer adds dQ
    // (backward_uses_wide_query_blocks: no mask, unmodified); the head dim
    // split takes no softcap or ALiBi (backward_unsupported_reason).
    if constexpr (!Tr::kTransposedDq) {
      if constexpr (!Tr::kWriterAddsDq)  // else only the modified kernels add from registers
        if (dq_add == DqAdd::registers) kernel = fa3_backward_kernel<Tr, Element, DqAdd::registers>;
      if constexpr (!Tr::kSplitsHeadDim)
        if (modified)
          kernel = p.deterministic ? fa3_backward_kernel<Tr, Element, DqAdd::writer_in_order, true>
                                   : fa3_backward_kernel<Tr, Element, DqAdd::registers, true>;
    }
    allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
    args.tiles = tiles;
    args.tile_counter = tile_counter;
    // A dependent of the preprocess only where there is one (no rows: the
    // kernel before may be anything, and its reads before the wait unordered).
    launch_kernel(kernel, dim3(ctas), dim3(Tr::kThreads), Tr::kSmemBytes, stream, has_rows, args);
    FLASHLAB_CHECK_LAUNCH("fa3_wgmma_sm90 backward", p);
  }
  if (has_rows) {
    const dim3 grid((p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM, p.heads, p.batch);
    launch_kernel(backward_convert_dq_kernel<SlabDqOrder<Tr>, Element>, grid, dim3(kConvertThreads), 0, stream,
                  true, p, 1, dq.dq_accum_slot_stride, static_cast<const int*>(nullptr));
    FLASHLAB_CHECK_LAUNCH("fa3_wgmma_sm90 backward (convert dq)", p);
  }
}

template <int HeadDim>
void launch_backward_at(const AttentionBackwardParams& params) {
  if constexpr (BackwardHeadDims::contains(HeadDim)) {
    with_bwd_traits<HeadDim>(params, [&](auto traits) {
      using Tr = decltype(traits);
      FLASHLAB_FP16_BF16_SWITCH(params.dtype, Element, [&] { launch_backward_typed<Tr, Element>(params); });
    });
  }
}

}  // namespace flashlab::fa3_wgmma_sm90
