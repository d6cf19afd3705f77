// fa3_wgmma_sm90: what the host side needs to know about the Hopper forward
// kernel (TMA, wgmma, warp specialization): its head-dim list, its tile
// configurations and the launch entry. No device code: the kernel template is
// fa3_wgmma_sm90_kernel.cuh.
//
// Instantiations: CMake generates one fa3_wgmma_sm90_hdim<D>.cu per entry of
// HeadDims from fa3_wgmma_sm90_hdim.cu.in (the default tiling of that head dim,
// fp16 and bf16, plain and traced); the dispatch, the support check, the tile
// shape and the messages read the same list. Adding a head dim (a multiple of
// 64: whole 128-byte swizzle rows): add it to HeadDims.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing links libcuda)

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/static_switch.h"
#include "common/mma_accumulator_layout.h"  // FragmentOrigin
#include "common/sequence_view.h"          // padded_sequence_start
#include "common/tile_scheduler.h"
#include "flashlab/kernel_params.h"
#include "flashlab/kernel_registry.h"  // TileShape
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"  // fa2_mma_sm80::BackwardWorkspace

namespace flashlab::fa3_wgmma_sm90 {

using HeadDims = HeadDimList<64, 128, 256>;
// The head dims the backward has code for (fa3_wgmma_sm90_bwd_kernel.cuh);
// the generated backward file of another forward head dim instantiates nothing.
using BackwardHeadDims = HeadDimList<64, 128, 256>;

// ElementBytes: 2 for fp16 / bf16, 1 for e4m3 (FP8: the V tile is V^T, keys
// contiguous, in key panels of kVtPanelKeys: 128-byte rows where BlockN is a
// multiple of 128, else 64-byte rows, each swizzled by its row width). Q and K
// are column panels of 128-byte rows, 128-byte swizzled; a head dim of 64
// bytes (e4m3 at head_dim 64) is one panel of 64-byte rows, 64-byte swizzled.
template <int HeadDim, int BlockN, int Stages, bool Pingpong = true, int Consumers = 2, int ElementBytes = 2>
struct Traits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kElementBytes = ElementBytes;
  static constexpr int kConsumers = Consumers;  // consumer warpgroups, 64 query rows each
  static constexpr int kBlockM = 64 * Consumers;
  static constexpr int kBlockN = BlockN;
  static constexpr int kStages = Stages;
  static constexpr bool kPingpong = Pingpong;  // consumers take turns issuing GEMMs
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kPanelBytes = HeadDim * ElementBytes < 128 ? HeadDim * ElementBytes : 128;  // = the swizzle
  static constexpr int kPanelElements = kPanelBytes / ElementBytes;  // elements of a panel row
  static constexpr int kPanels = HeadDim / kPanelElements;           // column panels of Q and K
  // FP8 V^T: head_dim rows of kVtPanelKeys keys a panel (one TMA box each), kVtPanels a tile.
  static constexpr int kVtPanelKeys = BlockN % 128 == 0 ? 128 : 64;
  static constexpr int kVtPanels = BlockN / kVtPanelKeys;
  static constexpr int kQTileBytes = kBlockM * HeadDim * ElementBytes;
  static constexpr int kKVTileBytes = kBlockN * HeadDim * ElementBytes;
  // setmaxnreg moves registers within the CTA's launch allocation (65536 /
  // threads, in steps of 8): what the producer gives up, the consumers share.
  // Asking for more than that makes setmaxnreg.inc wait forever.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  // The FP8 producer spilled 72 bytes at 24 at head_dim 128 (ptxas, sm_90a),
  // none at 40; at 256 the consumers need every register of 240 (232: 228
  // bytes of consumer spills), so its producer keeps 24 and spills 84-108 bytes.
  // The 192-key tile (head_dim 128) gives the consumers 240 too, for S's and
  // P's 40 more (they spill 128 / 192 bytes, static / dynamic schedule; at
  // 232, 168 / 76); its 2-9% gain was measured with these.
  static constexpr int kProducerRegisters = ElementBytes == 1 && HeadDim <= 128 && BlockN == 128 ? 40 : 24;
  static constexpr int kConsumerRegisters =
      (kLaunchRegisters * kThreads - kProducerRegisters * 128) / (128 * Consumers) / 8 * 8;
  // Steady-state steps with the mask decided at compile time (masked and
  // unmasked runs of key tiles), so no branch separates issuing P V from
  // waiting for it and the softmax overlaps P V: 2-5% at head_dim 128 on the
  // H100. With three consumers (160 registers) the overlap spills 232 bytes and
  // measured 1-8% slower at head_dim 64, so the mask stays a branch there.
  static constexpr bool kMaskFreeSteps = kConsumerRegisters >= 200;
  // Work tiles handed out at run time under masks and varlen (Schedule::dynamic)
  // by the two-consumer tilings (head_dim 128 and 256): their static
  // round-robin gives the same CTAs the longest tiles. ptxas -v: no new spills
  // there (d128 none, d256 64 bytes with either schedule); with three
  // consumers (160 registers, head_dim 64) the published tile's coordinates
  // spill 40 bytes, so head_dim 64 keeps the static order.
  static constexpr bool kDynamicSchedule = kConsumerRegisters >= 200;
  // Work tiles overlapped: a tile's last P V is issued together with the next
  // tile's first S, and its output is written while that S runs, so the
  // tensor cores do not idle over the epilogue, Q's arrival and the first
  // softmax. The next Q must have landed by then: two Q buffers, which fit
  // where shared memory allows it (head_dim 128 at 128 x 128: 192 KB), and the
  // extra live state needs the two-consumer register budget.
  static constexpr int kMaxSmemBytes = 227 * 1024;
  static constexpr int kBarrierBytes = 8 * (2 * 2 + 4 * kStages) + 8 * 2;
  static constexpr bool kOverlapWorkTiles =
      kConsumerRegisters >= 200 &&
      2 * kQTileBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + 1024 <= kMaxSmemBytes;
  static constexpr int kQBuffers = kOverlapWorkTiles ? 2 : 1;
  // Tiles, then the barriers (q_full/q_empty per Q buffer, four per K/V stage,
  // and a published work-tile index per Q buffer); +1024 so the base can be
  // aligned for the swizzle.
  static constexpr int kSmemBytes =
      kQBuffers * kQTileBytes + 2 * kStages * kKVTileBytes + kBarrierBytes + 1024;
  static_assert(kSmemBytes <= kMaxSmemBytes, "tiles exceed the shared memory of a block");

  static_assert(kPanelBytes == 128 || kPanelBytes == 64, "panel rows are 128- or 64-byte swizzle rows");
  static_assert(HeadDim % kPanelElements == 0, "head_dim must be whole panels");
  static_assert(BlockN % 16 == 0 && BlockN <= 256, "key tile is whole k16 steps, one TMA box");
  static_assert(ElementBytes == 2 || BlockN % 64 == 0, "an FP8 V^T tile is whole 64- or 128-key panels");
};

template <int HeadDim> struct DefaultTraits;
// The default tiling of a head dim, a rule so every entry of HeadDims has one
// (H100 smoke, bf16, 16k tokens): three consumers (192-row blocks) at head_dim
// 64 beat two by 17-36%; key tiles of 80 beat 64 above 128 by 2-11%; 176 beat
// 128 at head_dim 128 only at 16k non-causal, so 128 up to head_dim 128.
template <int HeadDim>
struct DefaultTraits {
  using type = Traits<HeadDim, (HeadDim <= 128 ? 128 : 80), 2, true, (HeadDim <= 64 ? 3 : 2)>;
};

// The FP8 (e4m3) tilings: 128 query rows (k32 wgmma steps) x 128 keys (one
// 128-key V^T panel), and at head_dim 128 from kFp8LongKeyTileKeys keys on 128
// x 192 (three 64-key V^T panels); Q and K rows of 64 bytes at head_dim 64
// (64-byte swizzle), whole 128-byte panels at 128 and 256. At head_dim 128 the
// softmax, not the matmuls, bounds FP8 (as many exponentials a FLOP as the
// MUFU issues), and a longer key tile spreads each tile's fixed work (row max
// shuffles, O's rescale, barriers) over more of them: 192 keys ran 2-9% faster
// than 128 at 4k and 16k, 3-7% slower at 1k, where the last of six tiles is
// two thirds padding (H200, session 36). 256 keys leave no registers (S 128 + P 32 + O 64
// of 240); at head_dim 256, O alone takes 128.
using Fp8HeadDims = HeadDimList<64, 128, 256>;
template <int HeadDim, int BlockN = 128>
struct Fp8Traits {
  using type = Traits<HeadDim, BlockN, 2, true, 2, 1>;
};
inline constexpr int64_t kFp8LongKeyTileKeys = 2048;
FLASHLAB_HOST_DEVICE constexpr bool fp8_uses_long_key_tile(int head_dim, int64_t seqlen_k) {
  return head_dim == 128 && seqlen_k >= kFp8LongKeyTileKeys;
}
// Calls f with the FP8 tiling of this problem (a Traits value, a tag): the one
// choice the launch, tile_shape and --locate share.
template <int HeadDim, class F>
decltype(auto) with_fp8_traits(const AttentionParams& params, F&& f) {
  if constexpr (HeadDim == 128) {
    if (fp8_uses_long_key_tile(params.head_dim, params.seqlen_k)) return f(typename Fp8Traits<HeadDim, 192>::type{});
  }
  return f(typename Fp8Traits<HeadDim>::type{});
}

// V^T for the FP8 forward (8-bit wgmma takes B K-major only): the kernel's V
// operand, (planes, kv_heads, head_dim, row_keys) with rows of fp8_vt_row_keys
// keys (a multiple of 16: TMA strides). Fixed length: a plane a batch entry,
// each row its keys then zeros up to fp8_vt_keys(seqlen_k). Variable length:
// one plane, sequence b's keys from fp8_vt_key0 on (a multiple of 16, the
// sequences one after the other with zeros to the next one's start, as the
// backward pads its statistics: padded_sequence_start), so a tile that runs
// past a sequence's end reads zeros or the next sequence's (masked) keys.
// Within each 16 keys, position 4t + b holds key 8 (b / 2) + 2t + b % 2: the keys a thread t of
// a quad holds in S's accumulator fragment (columns 2t, 2t + 1, 8 + 2t, 9 + 2t)
// are then the k32 A fragment's bytes 4t .. 4t + 3 (wgmma_fragment.h,
// accumulator_to_fp8_a_fragments), so P goes into the P V wgmma with no shuffle.
FLASHLAB_HOST_DEVICE constexpr int fp8_vt_key_of_position(int position) {
  const int t = (position % 16) / 4, b = position % 4;
  return position / 16 * 16 + 8 * (b / 2) + 2 * t + b % 2;
}
FLASHLAB_HOST_DEVICE constexpr int64_t fp8_vt_keys(int64_t seqlen_k) { return (seqlen_k + 15) / 16 * 16; }
// Where sequence `batch` (first key row k_row0 in the packed keys) starts in its V^T row.
FLASHLAB_HOST_DEVICE inline int64_t fp8_vt_key0(const AttentionParams& p, int64_t k_row0, int batch) {
  return p.is_varlen() ? padded_sequence_start(k_row0, batch, 16) : 0;
}
// A V^T row's length: every sequence's region fits (padded_sequence_start(total, batch) at most).
inline int64_t fp8_vt_row_keys(const AttentionParams& p) {
  return p.is_varlen() ? fp8_vt_keys(p.total_rows_k + 16 * static_cast<int64_t>(p.batch)) : fp8_vt_keys(p.seqlen_k);
}
inline int fp8_vt_planes(const AttentionParams& p) { return p.is_varlen() ? 1 : p.batch; }
inline int64_t fp8_vt_bytes(const AttentionParams& p) {
  return static_cast<int64_t>(fp8_vt_planes(p)) * p.kv_heads * p.head_dim * fp8_vt_row_keys(p);
}
// Where V^T starts in the FP8 forward's workspace (after the tile counter).
inline constexpr size_t kFp8VtOffset = 256;

// ---------------------------------------------------------------------------
// The backward's tiling (fa3_wgmma_sm90_bwd_kernel.cuh; the algorithm is
// described there). Two layouts of the two consumer warpgroups:
// - keys split (head_dim 64, 128): each consumer owns 64 of the block's 128
//   keys and accumulates their dK / dV over the whole head dim;
// - head dim split (SplitsHeadDim, head_dim 256, where one warpgroup's dK and
//   dV of 64 keys x 256 columns would take 256 registers a thread): both own
//   the block's 64 keys, one computes S^T and the other dP^T, they swap them
//   through shared memory, and each accumulates dK / dV / dQ of half the
//   columns.
// dQ leaves a query block in float32 slabs (deterministic mode: one semaphore
// each): 64 x 64, or block_m x 64 where the block's rows are no multiple of 64
// (dQ^T per consumer: its 64 columns x every row of the block). How many a
// block of block_m rows has.
FLASHLAB_HOST_DEVICE constexpr int dq_block_slabs(int block_m, int head_dim) {
  return block_m % 64 == 0 ? block_m * head_dim / (64 * 64) : head_dim / 64;
}

// How the backward kernel adds a step's dQ slab to the float32 accumulator:
// red.global.add.v4.f32 from the consumers' registers; staged in shared memory
// for a writer warp, which adds it with one bulk reduce-add (the consumers
// go on to the next step meanwhile); or so, in a fixed order (the
// deterministic mode's semaphores).
enum class DqAdd { registers, writer, writer_in_order };

template <int HeadDim, int BlockM, int Stages = 2, bool SplitsHeadDim = false>
struct BwdTraits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr bool kSplitsHeadDim = SplitsHeadDim;
  static constexpr int kBlockM = BlockM;  // query rows a step
  static constexpr int kBlockN = SplitsHeadDim ? 64 : 128;  // keys a CTA
  static constexpr int kStages = Stages;  // Q ring (with the rows' LSE)
  // dO ring (with the rows' D): one stage at the head-dim split, whose two
  // 32 KB dO stages and the swap buffers would not fit beside two Q stages.
  static constexpr int kDoStages = SplitsHeadDim ? 1 : Stages;
  static constexpr int kConsumers = 2;
  static constexpr int kThreads = 128 * (kConsumers + 1);
  static constexpr int kPanels = HeadDim / 64;  // 64-element (128-byte) column panels
  static constexpr int kQTileBytes = BlockM * HeadDim * 2;
  static constexpr int kKVTileBytes = kBlockN * HeadDim * 2;
  static constexpr int kDsTileBytes = kBlockN * BlockM * 2;
  // A consumer's keys (rows of its dK / dV) and dK / dV columns.
  static constexpr int kConsumerKeys = SplitsHeadDim ? kBlockN : kBlockN / kConsumers;
  static constexpr int kKeyGradColumns = SplitsHeadDim ? HeadDim / kConsumers : HeadDim;
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      (kLaunchRegisters * kThreads - kProducerRegisters * 128) / (128 * kConsumers) / 8 * 8;
  // dQ = dS K needs 64-row wgmma tiles: with 80-row blocks (FA3's at head_dim
  // 128 without a mask) each consumer computes dQ^T = K^T dS^T of its 64
  // columns instead (kTransposedDq), and dS is stored a row per query, keys
  // contiguous (stmatrix.trans), the K-major B of that GEMM. Otherwise dS^T is
  // stored keys as rows, the MN-major A of dQ = dS K.
  static constexpr bool kTransposedDq = BlockM % 64 != 0;
  // The default mode's kernels take their tiles from the producer, which
  // hands each out with its K and V (BwdBarriers::tile), so that a persistent
  // grid can take them from a counter where walks differ (causal, windows,
  // varlen; backward_schedules_dynamically). Not at the head dim split, where
  // the hand-out's code cost 0.7-1.7% without a mask and the counter gained
  // 0.2-0.8% under a causal mask (H200, session 42), nor at 80 rows, which run
  // without a mask only: those keep the static schedule's code.
  static constexpr bool kHandsOutTiles = !SplitsHeadDim && !kTransposedDq;
  // dQ goes out in slabs, kDqSlabs per consumer a step: 64 x 64 split along
  // the head dim when the block has 64 rows, along the rows when it has 128;
  // transposed, one block_m x 64 slab a consumer.
  static constexpr bool kDqSplitsColumns = BlockM != 128;
  // The default mode may stage dQ for the writer warps (backward_dq_add):
  // the keys split has staging buffers of its own; the head dim split stages
  // in its swap buffer, between swaps, and ran 0-2% slower so (H200, session
  // 39).
  static constexpr bool kWriterAddsDq = !SplitsHeadDim;
  static constexpr int kDqSlabFloats = kTransposedDq ? BlockM * 64 : 64 * 64;
  static constexpr int kDqBlockSlabs = dq_block_slabs(BlockM, HeadDim);
  static constexpr int kDqSlabs = kDqBlockSlabs / kConsumers;
  // Named barriers (0 is __syncthreads): both consumers' dS stored; consumer
  // w's slab staged (w's 128 threads arrive, w's writer warp syncs); the
  // writer has read w's slab (the writer arrives, w's threads sync); both
  // consumers' S^T / dP^T in the swap buffers (head dim split).
  static constexpr int kDsStoredBarrier = 1;
  static constexpr int kDqFullBarrier = 2;   // + consumer
  static constexpr int kDqEmptyBarrier = 4;  // + consumer
  static constexpr int kSwappedBarrier = 6;
  // The TMA epilogue's named barriers (backward_stages_key_gradients below):
  // both consumers' GEMMs of the tile done, so K and V are read no more;
  // consumer w's dK / dV staged over them.
  static constexpr int kKeysReadBarrier = 7;
  static constexpr int kKeyGradsStagedBarrier = 8;  // + consumer
  // Shared memory: K, V, Q and dO stages, dS buffers, per stage the LSE and D
  // of the rows, then the barriers; +1024 to align the base for the swizzle.
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVTileBytes;
  static constexpr int kQOffset = kVOffset + kKVTileBytes;
  static constexpr int kDoOffset = kQOffset + Stages * kQTileBytes;
  static constexpr int kDsOffset = kDoOffset + kDoStages * kQTileBytes;
  // Per ring stage the rows' LSE_log2 (with Q) then D (with dO), bulk-copied.
  static constexpr int kStatsOffset = kDsOffset + 2 * kDsTileBytes;
  static constexpr int kStatsFloats = 2 * BlockM;  // a stage's
  // Head dim split: S^T (consumer 0's P^T) and dP^T (consumer 1's), float32
  // in accumulator order, each thread's values where its partner reads them.
  static constexpr int kSwapOffset = kStatsOffset + Stages * kStatsFloats * 4;
  static constexpr int kSwapBytes = SplitsHeadDim ? kConsumerKeys * BlockM * 4 : 0;  // one consumer's
  // Deterministic mode: each consumer's dQ slab (float32, fragment order) for
  // its writer warp. The head dim split has no room for two more 16 KB
  // buffers (210 KB): a consumer stages its slabs in its own swap buffer,
  // free from the dS barrier until its next swap store (both consumers have
  // read both buffers by then), one slab at a time.
  static constexpr int kDqSlabBytes = kDqSlabFloats * 4;
  static constexpr int kDqStageOffset = SplitsHeadDim ? kSwapOffset : kSwapOffset + kConsumers * kSwapBytes;
  static constexpr int kDqStageStride = SplitsHeadDim ? kSwapBytes : kDqSlabBytes;  // between consumers' buffers
  static constexpr int kBarrierOffset =
      SplitsHeadDim ? kSwapOffset + kConsumers * kSwapBytes : kDqStageOffset + kConsumers * kDqSlabBytes;
  static constexpr int kBarriers = 2 + 4 * Stages;  // BwdBarriers: kv full/empty; q, do full/empty a stage
  // The tile the producer hands out with each K/V load (BwdBarriers::tile).
  static constexpr int kTileSlotOffset = kBarrierOffset + 8 * kBarriers;
  static constexpr int kSmemBytes = kTileSlotOffset + 16 + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "tiles exceed the shared memory of a block");
  static_assert(HeadDim % 64 == 0 && BlockM % 16 == 0 && BlockM <= 128, "whole panels, whole k16 steps");
  static_assert(BlockM % 64 == 0 || (HeadDim == 64 * kConsumers && !SplitsHeadDim),
                "a transposed dQ: 64 columns a consumer");
  static_assert(!SplitsHeadDim || (BlockM == 64 && HeadDim % 128 == 0), "split: 64-row blocks, whole panels a half");
  static_assert(kConsumerRegisters == 240, "two consumers at 240 registers");
  static_assert(kDqBlockSlabs * kDqSlabFloats == BlockM * HeadDim, "the dQ slabs tile the block");
  static_assert(!SplitsHeadDim || kSwapBytes == kDqSlabBytes, "a swap buffer holds one dQ slab");
};

// Whether a backward kernel's epilogue stages dK and dV over the tile's K and
// V and stores them by TMA (store_key_gradients_by_tma), which holds K and V
// until the stores have read them, or stores from registers, releasing K and
// V in the walk's last step, so that a persistent CTA's next K/V load
// overlaps dK and the stores. Staged at head dims 128 and 256 (64 KB a tile),
// and at 64 (32 KB) where a CTA takes one tile (the deterministic mode). A
// persistent CTA at 64 lost more to the later release than the stores cost
// at 4k (H200, session 43: 1.005-1.029x the time, 0.973-0.989x at 1k).
constexpr bool backward_stages_key_gradients(int head_dim, bool one_tile_a_cta) {
  return head_dim > 64 || one_tile_a_cta;
}

// FA3's sm90 tiles: 128 x 128 at head_dim 64, 64 x 128 at 128; at 256 64 x
// 64 with the head dim split (FA3: 64 x 80, dK / dV / dQ transposed).
template <int HeadDim>
struct DefaultBwdTraits {
  using type = BwdTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), 2, (HeadDim > 128)>;
};
// FA3's head_dim 128 tile without a mask: 80 query rows a step (dQ
// transposed), where the walks are whole (no causal or window bound, so no
// partly masked 80-row blocks), in both modes, without softcap or ALiBi
// (those keep 64 rows: their instantiations would double).
inline constexpr int kWideBackwardBlockM = 80;
inline bool backward_uses_wide_query_blocks(const AttentionBackwardParams& p) {
  return p.head_dim == 128 && p.window_left < 0 && p.window_right < 0 && !p.modification.per_element();
}
// How tiling Tr's kernel adds dQ for this problem: in order (the deterministic
// mode), else through the writer warps where no score modification runs (FA3's
// way; H200, against red.global.add in the same run: without a mask 0.923-0.955x
// the backward's time at head_dim 128 and 0.972-0.983x at 64, session 39; under
// a causal mask 0.965-0.980x at 128 and 0.973-0.990x at 64, session 40), else
// from the registers (softcap and ALiBi: their kernels would double).
template <class Tr>
DqAdd backward_dq_add(const AttentionBackwardParams& p) {
  if (p.deterministic) return DqAdd::writer_in_order;
  return Tr::kWriterAddsDq && !p.modification.per_element() ? DqAdd::writer : DqAdd::registers;
}
// Calls f with the backward tiling of this problem (a BwdTraits value, a tag):
// the one choice the launch, the workspace, backward_tile_shape and --locate share.
template <int HeadDim, class F>
decltype(auto) with_bwd_traits(const AttentionBackwardParams& params, F&& f) {
  if constexpr (HeadDim == 128) {
    if (backward_uses_wide_query_blocks(params)) return f(BwdTraits<HeadDim, kWideBackwardBlockM>{});
  }
  return f(typename DefaultBwdTraits<HeadDim>::type{});
}

// The accumulator's fragment order (backward_dq.cuh): a block is kDqBlockSlabs
// slabs (consumer w's are w * kDqSlabs ..), a slab kGroups groups of 128
// floats; group g of a slab = (n8 tile g / 4, warp g % 4): a wgmma
// accumulator's registers, four at a time, each warp's four values of one
// 8-column tile together (512 bytes). 64 x 64 slabs: n8 tiles of columns;
// transposed (dQ^T slabs, kTransposed): n8 tiles of rows, the warp's 16
// columns, value i of a lane at row + i % 2, column + 8 (i / 2).
template <class Tr>
struct SlabDqOrder {
  static constexpr int kBlockM = Tr::kBlockM;
  static constexpr int kHeadDim = Tr::kHeadDim;
  static constexpr bool kTransposed = Tr::kTransposedDq;
  static constexpr int kGroups = Tr::kDqSlabFloats / 128;  // a slab's
  FLASHLAB_HOST_DEVICE static FragmentOrigin origin(int group, int lane) {
    const int slab = group / kGroups, n = group % kGroups / 4, warp = group % 4;
    if constexpr (kTransposed) return {n * 8 + (lane % 4) * 2, slab * 64 + warp * 16 + lane / 4};
    const int row0 = Tr::kDqSplitsColumns ? 0 : slab * 64;
    const int col0 = Tr::kDqSplitsColumns ? slab * 64 : 0;
    return {row0 + warp * 16 + lane / 4, col0 + n * 8 + (lane % 4) * 2};
  }
};

// Empty when the kernel can run the problem (dtype, head_dim in HeadDims, GQA
// ratio, TMA alignment), else the reason. Host only.
std::string unsupported_reason(const AttentionParams& params);

// Host helpers of the launch, defined in fa3_wgmma_sm90.cu.
// The workspace a launch needs: the dynamic schedule's tile counter. Host only.
size_t workspace_bytes(const AttentionParams& params);

// A 4-D tensor map (head_dim, rows, heads, batch) over a (batch, rows, heads,
// head_dim) tensor of params' dtype with a box of panel_bytes (128 or 64: the
// swizzle too) x box_rows rows; varlen: the packed rows (total_rows_q or _k),
// batch extent 1. Defined in fa3_wgmma_sm90.cu.
struct TensorOperand {
  const void* base = nullptr;
  int64_t row_stride = 0, head_stride = 0, batch_stride = 0;
  int heads = 0;
  bool query_rows = true;  // rows are seqlen_q (q, out, dout) or seqlen_k (k, v)
  const char* name = "";
};
enum class Operand { q, k, v };
TensorOperand tensor_operand(const AttentionParams& params, Operand operand);
CUtensorMap make_tensor_map(const AttentionParams& params, const TensorOperand& operand, int box_rows,
                            int panel_bytes = 128);
// The FP8 forward's V^T (fp8_vt_key_of_position's layout at `vt`): boxes of
// panel_keys (Traits::kVtPanelKeys: 128 or 64) keys x head_dim rows, swizzled
// by the box's row bytes.
CUtensorMap make_vt_tensor_map(const AttentionParams& params, const void* vt, int panel_keys);
inline CUtensorMap make_tensor_map(const AttentionParams& params, Operand operand, int box_rows,
                                   int panel_bytes = 128) {
  return make_tensor_map(params, tensor_operand(params, operand), box_rows, panel_bytes);
}
// Per device, asked once: the launch path stays short because the benchmark's
// events time it too.
struct DeviceLimits {
  int multiprocessors = 0;
  int l2_bytes = 0;
};
DeviceLimits device_limits();

// The persistent grid's schedule and work-tile order: common/tile_scheduler.h
// (shared with the kernels to come: the Hopper backward walks the same way).
using ::flashlab::Schedule;
using ::flashlab::schedule;
using ::flashlab::unequal_work_tiles;
using ::flashlab::work_tile_at;
using ::flashlab::WorkTile;
using ::flashlab::key_block_order;
using ::flashlab::key_block_cta_at;
using ::flashlab::key_block_cta_index;
using ::flashlab::KeyBlockCta;
using ::flashlab::KeyBlockOrder;
using ::flashlab::kSectionedKeyBlocks;

// Launches configuration Tr for params.dtype (fp16 or bf16), the traced
// instantiation when params.trace is on. Defined in fa3_wgmma_sm90_kernel.cuh
// and explicitly instantiated per head dim (the generated files).
template <class Tr>
void launch(const AttentionParams& params);
// The e4m3 forward of head dim HeadDim (Fp8Traits; nothing outside Fp8HeadDims),
// instantiated per entry of HeadDims in the generated fa3_wgmma_sm90_fp8_hdim<D>.cu.
template <int HeadDim>
void launch_fp8_at(const AttentionParams& params);

// The backward (fa3_wgmma_sm90_bwd_kernel.cuh): its support check, its
// workspace (fa2_mma_sm80's BackwardWorkspace at its tiles), its tiles and the
// launch of the preprocess, main and convert kernels for head dim HeadDim
// (instantiated per entry of HeadDims in the generated
// fa3_wgmma_sm90_bwd_hdim<D>.cu; empty for head dims not in BackwardHeadDims).
std::string backward_unsupported_reason(const AttentionBackwardParams& params);
// The workspace: softmax_d and one float32 dq accumulator laid out as
// fa2_mma_sm80's (its deterministic slots are not used: the deterministic
// mode orders the additions with semaphores), then, in deterministic mode,
// int32 semaphores (batch, heads, query_blocks, dq_block_slabs: one a 64 x 64
// slab of the block). The preprocess zeros the accumulator's rows (PaddedRowStats);
// the semaphores are zeroed by a memset.
struct BackwardWorkspace {
  fa2_mma_sm80::BackwardWorkspace dq;
  // The rows' LSE in base 2 and D, float32 (heads, stats_rows) each, every
  // sequence's rows padded to whole query blocks starting on a block boundary
  // (padded_stats_row0), so the main kernel bulk-copies a block's with its Q
  // and dO tiles. Written by the preprocess, padding included.
  size_t lse_log2_offset = 0, dsum_offset = 0, stats_bytes = 0;
  int64_t stats_rows = 0;
  size_t semaphore_offset = 0, semaphore_bytes = 0;
  // backward_schedules_dynamically (tile_counter): the next tile's counter (int32), zeroed.
  size_t tile_counter_offset = 0, tile_counter_bytes = 0;
  int query_blocks = 0;  // ceil(seqlen_q / block_m), seqlen_q the longest sequence
  int dq_block_slabs = 0;  // dq_block_slabs(block_m, head_dim)
  size_t total_bytes = 0;
};
BackwardWorkspace backward_workspace(const AttentionBackwardParams& params, int block_m, int block_n,
                                     bool tile_counter);
// Where sequence `batch` starts in the padded statistics of a head: a multiple
// of block_m (FA3's rule for variable lengths: floor((first row + batch *
// block_m) / block_m) * block_m, so sequences never overlap).
FLASHLAB_HOST_DEVICE inline int64_t padded_stats_row0(const AttentionParams& params, int64_t q_row0, int batch,
                                                      int block_m) {
  if (params.is_varlen()) return padded_sequence_start(q_row0, batch, block_m);
  return static_cast<int64_t>(batch) * ((params.seqlen_q + block_m - 1) / block_m * block_m);
}
size_t backward_workspace_bytes(const AttentionBackwardParams& params);

// Deterministic mode's order of the dQ additions (fa3_wgmma_sm90_bwd_kernel.cuh,
// dq_rank). Without a mask every key block sees every query block, and where
// a sequence has no more key blocks than query blocks and every key-block CTA
// of a (kv head, batch) fits on the GPU at once (one CTA an SM), each CTA
// walks its query blocks rotated, from query block n_block (mod the count):
// stepping together, the key blocks then reach query block m in the order m,
// m - 1, .., 0, last key block, .., m + 1, and each finds its turn taken one
// step earlier. (Ascending ranks with every walk starting at query block 0
// made key block n wait n steps; rotated, a CTA waits for CTAs beside it, so
// every CTA it waits for runs: hence the SM-count condition.)
inline bool rotates_backward_walks(const AttentionBackwardParams& params, int block_n, int multiprocessors) {
  return params.deterministic && params.window_left < 0 && params.window_right < 0 &&
         (params.seqlen_k + block_n - 1) / block_n <= multiprocessors;
}
// The query blocks a backward CTA (one key block) walks, for each head of its
// kv head's group in turn: m_count blocks from m_begin, ascending, or, rotated
// (rotates_backward_walks), from m_begin + rotation, wrapping around.
struct QueryWalk {
  int m_begin = 0, m_count = 0, steps = 0, rotation = 0;  // steps = m_count x the group's heads
  bool rotated = false;
  // The query block (its index) and the group's head (0..group-1) of a step.
  FLASHLAB_HOST_DEVICE int query_block(int step) const {
    const int i = step % m_count + rotation;
    return m_begin + (i < m_count ? i : i - m_count);
  }
  FLASHLAB_HOST_DEVICE int head_in_group(int step) const { return step / m_count; }
};
// Key block n_block's place among the key blocks adding to query block
// m_block on rotated walks (n_key_blocks <= m_count, both blocks in range).
FLASHLAB_HOST_DEVICE constexpr int rotated_dq_rank(int m_block, int n_block, int n_key_blocks, int m_count) {
  const int steps_after = (m_block - n_block + m_count) % m_count;  // n_block reaches m_block this late
  const int nearest = m_block < n_key_blocks - 1 ? m_block : n_key_blocks - 1;
  if (steps_after <= m_block) {  // key blocks m_block - steps_after + 1 .. m_block came first
    const int ahead = nearest - m_block + steps_after;
    return ahead > 0 ? ahead : 0;
  }
  // all of 0 .. nearest, and the wrapped ones from m_count - (steps_after - m_block - 1) up
  const int wrapped = n_key_blocks - m_count + steps_after - m_block - 1;
  return nearest + 1 + (wrapped > 0 ? wrapped : 0);
}
// Which backward CTA takes which key block (KeyBlockOrder, common/tile_scheduler.h):
// sections in the default mode under a right-bounded mask, else the grid's own
// order (the deterministic mode's waits count on it: dq_rank). A pair's bytes
// in those sections: Q and dO of the kv head's query heads, and their float32
// dQ sums.
inline KeyBlockOrder backward_key_block_order(const AttentionBackwardParams& params, int block_n,
                                              int multiprocessors, int l2_bytes) {
  const int key_blocks = (params.seqlen_k + block_n - 1) / block_n;
  const int64_t pair_bytes = static_cast<int64_t>(params.heads / params.kv_heads) * params.seqlen_q *
                             params.head_dim * (2 * 2 + 4);
  return key_block_order(key_blocks, params.kv_heads * params.batch,
                         !params.deterministic && params.window_right >= 0, pair_bytes, multiprocessors, l2_bytes);
}
// The backward's tiles: a key block of the longest sequence, for each kv
// head and batch entry.
inline int backward_tiles(const AttentionBackwardParams& params, int block_n) {
  return (params.seqlen_k + block_n - 1) / block_n * params.kv_heads * params.batch;
}
// Its grid in the default mode: one CTA an SM, walking tiles back to back, so
// that a tile's epilogue overlaps the next tile's first loads. Where every
// tile walks as far (no mask bounds the walks, one sequence length) CTA c
// takes tiles c, c + grid, ...: 0.976-0.986x the time of a CTA a tile at 1k,
// no change beyond the spread at 4k and 16k (H200, session 38). Where walks
// differ (masks, variable lengths) a fixed stride is unbalanced (under a causal
// mask at 1k CTA c would walk key blocks c % 8 and c % 8 + 4 only): where the
// kernels hand tiles out (BwdTraits::kHandsOutTiles) each CTA takes its next
// from a counter (backward_schedules_dynamically), in the order the hardware
// would launch a CTA a tile (KeyBlockOrder's sections): causal 0.92-0.99x the
// time of a CTA a tile at head dims 64 and 128, 1k and 4k (H200, session 42).
// Otherwise, and in the deterministic mode (its waits count on the
// hardware's order), a CTA a tile.
template <class Tr>
bool backward_runs_persistent(const AttentionBackwardParams& params) {
  if (params.deterministic) return false;
  return Tr::kHandsOutTiles || (params.window_left < 0 && params.window_right < 0 && !params.is_varlen());
}
template <class Tr>
bool backward_schedules_dynamically(const AttentionBackwardParams& params) {
  return Tr::kHandsOutTiles && backward_runs_persistent<Tr>(params) &&
         (params.window_left >= 0 || params.window_right >= 0 || params.is_varlen());
}
template <class Tr>
int backward_grid_ctas(const AttentionBackwardParams& params, int tiles, int multiprocessors) {
  return backward_runs_persistent<Tr>(params) ? std::min(tiles, multiprocessors) : tiles;
}
TileShape backward_tile_shape(const AttentionBackwardParams& params);
template <int HeadDim>
void launch_backward_at(const AttentionBackwardParams& params);

}  // namespace flashlab::fa3_wgmma_sm90
