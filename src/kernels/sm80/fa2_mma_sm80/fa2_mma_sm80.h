// fa2_mma_sm80: what the host side needs to know about the FlashAttention-2
// forward and backward kernels on tensor cores (mma.sync m16n8k16, ldmatrix,
// cp.async): the head-dim list, the tile configurations and the launch
// entries. No device code: the kernel templates are fa2_mma_sm80_kernel.cuh
// and fa2_mma_sm80_bwd_kernel.cuh.
//
// Instantiations: CMake generates one fa2_mma_sm80_hdim<D>.cu per entry of
// HeadDims from fa2_mma_sm80_hdim.cu.in (the default tiling of that head dim,
// fp16 and bf16), and one fa2_mma_sm80_bwd_hdim<D>.cu from
// fa2_mma_sm80_bwd_hdim.cu.in (the backward's default tiling); the dispatch,
// the support checks, the tile shape and the messages all read the same list. Adding a head dim (a multiple of 32): add it
// to HeadDims.
#pragma once

#include <string>
#include <type_traits>

#include "common/smem_layout.h"
#include "common/static_switch.h"
#include "flashlab/kernel_params.h"
#include "flashlab/kernel_registry.h"

namespace flashlab::fa2_mma_sm80 {

using HeadDims = HeadDimList<32, 64, 96, 128, 256>;

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

// The default tile configuration of a head dim (what launches run), a rule so
// that every entry of HeadDims has one:
// - block_q 128 with 4 warps up to head_dim 128: two m16 slabs per warp let each
//   K/V fragment read from shared memory feed two MMAs (on H100, bf16, 8x16
//   heads, seqlen 4096, 20-50% faster than one slab per warp); above 128, block_q
//   64 (one slab per warp) so that O fits in registers;
// - block_k 128 at head_dim 64, 64 up to 128, 32 above (flashlab-bench --sweep);
// - Q in registers only at head_dim 32 (larger head dims spill);
// - K/V double-buffered with cp.async.
template <int HeadDim>
struct DefaultTraits {
  using type = Traits<HeadDim, (HeadDim <= 128 ? 128 : 64),
                      (HeadDim == 64 ? 128 : HeadDim <= 128 ? 64 : 32), 4, 2, (HeadDim <= 32)>;
};

// Empty when the kernel can run the problem (dtype, head_dim in HeadDims, GQA
// ratio, grid limits, 16-byte alignment), else the reason. Shared by every tile
// configuration, the tuning ones included. Host only.
std::string unsupported_reason(const AttentionParams& params);

// Launches configuration Tr for params.dtype (fp16 or bf16). Defined in
// fa2_mma_sm80_kernel.cuh and explicitly instantiated, one configuration per
// file: the generated fa2_mma_sm80_hdim<D>.cu for DefaultTraits<D>, the dev
// tuning files for the alternatives. This header declares it only, so the
// files that dispatch compile no kernel.
template <class Tr>
void launch(const AttentionParams& params);

// ---------------------------------------------------------------------------
// The backward pass (fa2_mma_sm80_bwd_kernel.cuh): one thread block per
// (key block of BlockN keys, kv head, batch) walks the BlockM-row query blocks
// that see its keys. Warp layouts of its five GEMMs (Warps warps):
//   S = Q K^T, dP = dO V^T  (BlockM x BlockN): BlockM/32 x rest, each 32 query rows x
//                           BlockN/(rest) keys;
//   dV += P^T dO, dK += dS^T Q (BlockN x HeadDim): BlockN/32 x rest, each 32 keys x
//                           HeadDim/(rest) columns, kept in registers over the whole walk;
//   dQ = dS K               (BlockM x HeadDim): min(BlockM/32, 4) x rest (min(BlockM/16, 4)
//                           where a warp's columns would not be whole 16-column blocks), each
//                           BlockM/that rows x HeadDim/(rest) columns, in chunks of at most 64 columns,
//                           added to the float32 accumulator in global memory.
// Shared memory: K, V (BlockN rows), QStages Q tiles, DoStages dO tiles
// (BlockM rows), all HeadDim + 8 elements a row, P, dS (BlockM x BlockN + 8),
// and the LSE and D of each Q stage's rows.
template <int HeadDim, int BlockM, int BlockN, int Warps, int QStages, int DoStages>
struct BwdTraits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kBlockM = BlockM;  // query rows per step of the walk
  static constexpr int kBlockN = BlockN;  // keys per thread block
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kQStages = QStages;    // 2: Q[i+1] loads during step i
  static constexpr int kDoStages = DoStages;  // 2: dO[i+1] too; 1: after dV's GEMM

  // Q and dO (cp.async tiles refilled every step): rows swizzled where they are
  // whole 128-byte groups (head_dim 64, 128, 256), else padded by 16 bytes (32,
  // 96). K, V (loaded once per key block) and P, dS (written by st.shared):
  // padded. Padded or swizzled, every ldmatrix phase hits 8 distinct bank groups.
  static constexpr int kSmemStride = HeadDim + 8;  // padded rows, in elements
  static constexpr int kPStride = BlockN + 8;      // P, dS
  static constexpr bool kSwizzled = HeadDim % 64 == 0;
  using KvLayout = sm80::PaddedRows<kSmemStride * 2>;
  using QLayout = std::conditional_t<kSwizzled, sm80::SwizzledRows<HeadDim * 2>, KvLayout>;
  using PLayout = sm80::PaddedRows<kPStride * 2>;

  // S / dP warp layout.
  static constexpr int kSdpWarpsM = BlockM / 32;  // 32 query rows a warp
  static constexpr int kSdpWarpsN = Warps / kSdpWarpsM;
  static constexpr int kSdpRows = BlockM / kSdpWarpsM;
  static constexpr int kSdpCols = BlockN / kSdpWarpsN;
  static constexpr int kSdpMT = kSdpRows / 16;
  static constexpr int kSdpNT = kSdpCols / 8;
  // dK / dV warp layout.
  static constexpr int kKvWarpsN = BlockN / 32;
  static constexpr int kKvWarpsD = Warps / kKvWarpsN;
  static constexpr int kKvCols = HeadDim / kKvWarpsD;
  static constexpr int kKvMT = 2;
  static constexpr int kKvNT = kKvCols / 8;
  // dQ warp layout, and the column chunk a warp accumulates at a time. FA2's:
  // 32 query rows a warp (at most 4 warps along the rows), the other warps
  // along head_dim; 16 rows a warp where that would leave a warp a head_dim
  // slice that is not whole 16-column blocks (head_dim 96). At 64 x 128, head_dim
  // 128, 32 x 32 a warp reads 16 KB of dS and K a step against 20 KB for 16 x 64.
  static constexpr int kDqRows32WarpsM = BlockM / 32 < 4 ? BlockM / 32 : 4;
  static constexpr int kDqWarpsM =
      kDqRows32WarpsM >= 1 && Warps % kDqRows32WarpsM == 0 &&
              HeadDim / (Warps / kDqRows32WarpsM) % 16 == 0
          ? kDqRows32WarpsM
          : (BlockM / 16 < 4 ? BlockM / 16 : 4);
  static constexpr int kDqWarpsD = Warps / kDqWarpsM;
  static constexpr int kDqRows = BlockM / kDqWarpsM;
  static constexpr int kDqMT = kDqRows / 16;
  static constexpr int kDqCols = HeadDim / kDqWarpsD;
  static constexpr int kDqChunkCols = kDqCols > 64 / kDqMT ? 64 / kDqMT : kDqCols;  // <= 32 accumulators
  static constexpr int kDqChunks = kDqCols / kDqChunkCols;
  static constexpr int kDqChunkNT = kDqChunkCols / 8;
  // dQ warp w's first row and column in the block.
  static constexpr int dq_row0(int warp) { return (warp / kDqWarpsD) * kDqRows; }
  static constexpr int dq_col0(int warp) { return (warp % kDqWarpsD) * kDqCols; }

  // Shared memory, byte offsets.
  static constexpr int kKVTileBytes = BlockN * KvLayout::kRowBytes;
  static constexpr int kQTileBytes = BlockM * QLayout::kRowBytes;
  static constexpr int kPTileBytes = BlockM * kPStride * 2;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = kKOffset + kKVTileBytes;
  static constexpr int kQOffset = kVOffset + kKVTileBytes;
  static constexpr int kDoOffset = kQOffset + QStages * kQTileBytes;
  static constexpr int kPOffset = kDoOffset + DoStages * kQTileBytes;
  static constexpr int kDsOffset = kPOffset + kPTileBytes;
  // The LSE and D of each Q stage's rows (float32), loaded with the Q tile.
  static constexpr int kRowStatsBytes = BlockM * 4;
  static constexpr int kLseOffset = kDsOffset + kPTileBytes;
  static constexpr int kDOffset = kLseOffset + QStages * kRowStatsBytes;
  static constexpr int kSmemBytes = kDOffset + QStages * kRowStatsBytes;

  static_assert(HeadDim % 32 == 0, "head_dim must be a multiple of 32");
  static_assert(BlockM % 32 == 0 && BlockN % 32 == 0, "blocks of whole 32-row warp slabs");
  static_assert(QStages == 1 || QStages == 2, "Q single or double buffered");
  static_assert(DoStages == 1 || DoStages == 2, "dO single or double buffered");
  static_assert(Warps % kSdpWarpsM == 0 && kSdpRows % 16 == 0 && kSdpCols % 16 == 0,
                "S/dP: whole m16 slabs and 16-key blocks per warp");
  static_assert(kSdpWarpsM * kSdpRows == BlockM && kSdpWarpsN * kSdpCols == BlockN,
                "S/dP warps tile the block exactly");
  static_assert(Warps % kKvWarpsN == 0 && kKvCols % 16 == 0 && kKvWarpsD * kKvCols == HeadDim,
                "dK/dV: 32 keys x 16-column blocks per warp, warps tile the block exactly");
  static_assert(Warps % kDqWarpsM == 0 && kDqRows % 16 == 0 && kDqCols % 16 == 0 &&
                    kDqWarpsM * kDqRows == BlockM && kDqWarpsD * kDqCols == HeadDim,
                "dQ: m16 slabs x 16-column blocks per warp, warps tile the block exactly");
  static_assert(kDqCols % kDqChunkCols == 0 && kDqChunkCols % 16 == 0, "whole dQ chunks");
  static_assert(BlockM % 16 == 0 && BlockN % 16 == 0, "k16 steps over the block");
  static_assert(2 * BlockM <= Warps * 32, "one thread per row copies the LSE, one the D");
  static_assert(kKOffset % 16 == 0 && kVOffset % 16 == 0 && kQOffset % 16 == 0 &&
                    kDoOffset % 16 == 0 && kPOffset % 16 == 0 && kDsOffset % 16 == 0,
                "16-byte aligned tiles (cp.async, ldmatrix)");
  static_assert(!kSwizzled || (kQOffset % 128 == 0 && kDoOffset % 128 == 0 && kQTileBytes % 128 == 0),
                "swizzled tiles start on 128-byte boundaries (SwizzledRows::advance XORs address bits 4-6)");
};

// The default backward tiling of a head dim (a rule so that every entry of
// HeadDims has one; FA2's tile sizes for devices with >= 144 KB of shared
// memory a block). 8 warps; every one fits the 163 KB an A100 block may opt into:
// - head_dim <= 64: 128 x 128 (query rows x keys), Q double-buffered, dO too at
//   32 (130 KB), single-buffered at 64 (160 KB);
// - 96 and 128: 64 x 128, Q double-buffered, dO double at 96 (139 KB), single
//   at 128 (154 KB; dK, dV: 2 x 64 floats a thread);
// - 256: 64 x 64, Q and dO single-buffered (151 KB).
// Alternatives compile from the same template (BwdTraits): e.g. 64 x 128 with
// both double-buffered at head_dim 64 is 107 KB.
template <int HeadDim>
struct DefaultBwdTraits {
  using type = BwdTraits<HeadDim, (HeadDim <= 64 ? 128 : 64), (HeadDim <= 128 ? 128 : 64), 8,
                         (HeadDim <= 128 ? 2 : 1), (HeadDim <= 32 || HeadDim == 96 ? 2 : 1)>;
};

// The key block a backward thread block takes in round `round` of its walk:
// `blocks` thread blocks per (kv head, batch) take one key block each per round.
// Default mode: blocks = key blocks, one round. Deterministic mode: blocks = dq
// accumulator slots, counted from either end in turn (zigzag: slot s takes
// s, 2S - 1 - s, 2S + s, ...), so under a causal mask, where the first key
// blocks see the most query rows, every two rounds give each slot the same work.
FLASHLAB_HOST_DEVICE constexpr int backward_key_block(int round, int block, int blocks) {
  return round * blocks + (round % 2 == 0 ? block : blocks - 1 - block);
}

// Empty when the backward can run the problem (everything unsupported_reason
// checks, plus dout/dq/dk/dv alignment and the shared memory of the device's
// compute capability when known), else the reason. Host only.
std::string backward_unsupported_reason(const AttentionBackwardParams& params);

// Where softmax_d and the float32 dq accumulator live in params.workspace, and
// how many dq accumulator slots there are: 1 by default (atomic adds from every
// key block), in deterministic mode one per split of the key blocks (each
// thread block owns one slot and adds to it in a fixed order; the convert
// kernel sums the slots in slot order; the count depends on the problem and the
// current device's SM count). block_m, block_n: the tiling's kBlockM, kBlockN.
//
// A slot of the accumulator is (heads, rows, head_dim) with each sequence's
// rows padded to whole block_m-row query blocks (a batch of equal lengths:
// seqlen_q rounded up per sequence; varlen: sequence b starts at its first
// packed row + b * block_m), and every block_m x head_dim block of one head is
// stored in the order of the main kernel's dQ fragments (dq_fragment_group in
// fa2_mma_sm80_bwd_kernel.cuh), not row-major, so that a warp's reduction of
// one fragment covers 512 contiguous bytes. Host only.
struct BackwardWorkspace {
  size_t softmax_d_offset = 0, softmax_d_bytes = 0;
  size_t dq_accum_offset = 0, dq_accum_bytes = 0;
  int dq_accum_slots = 1;
  int64_t dq_accum_slot_stride = 0;  // elements between slots
  // Deterministic mode without a left window bound (every key block's visible
  // query rows run to the sequence's end): int32 (batch, slots), the first
  // query block each slot touched (INT_MAX: none). The main kernel stores a
  // slot's first contribution to a query block instead of adding it, so the
  // accumulator is not zeroed (slots x dq's float32 size of writes saved); the
  // convert kernel reads slot s of query block m only from that block on.
  size_t slot_first_offset = 0, slot_first_bytes = 0;
  // Elements between heads and between rows; between sequences (varlen: the
  // padding added per sequence on top of its packed rows).
  int64_t dq_accum_batch_stride = 0, dq_accum_row_stride = 0, dq_accum_head_stride = 0;
  size_t total_bytes = 0;
};
BackwardWorkspace backward_workspace(const AttentionBackwardParams& params, int block_m,
                                     int block_n);
// The same for the default tiling of params.head_dim (the registry's hook).
size_t backward_workspace_bytes(const AttentionBackwardParams& params);
// A launch's copy of the block pointed into the caller's workspace: throws
// (naming `kernel`) unless params.workspace holds total_bytes, then sets
// softmax_d, dq_accum and the accumulator strides from `workspace`. Host only;
// shared with fa3_wgmma_sm90's backward, which lays its accumulator out the same.
void carve_backward_workspace(AttentionBackwardParams& params, const BackwardWorkspace& workspace,
                              size_t total_bytes, const char* kernel);

// Launches the backward with configuration Tr for params.dtype: the
// preprocess, main and convert kernels on params.stream. Defined in
// fa2_mma_sm80_bwd_kernel.cuh, instantiated in the generated
// fa2_mma_sm80_bwd_hdim<D>.cu for DefaultBwdTraits<D>.
template <class Tr>
void launch_backward(const AttentionBackwardParams& params);

// ---------------------------------------------------------------------------
// Decoding with a KV cache (fa2_mma_sm80_splitkv_kernel.cuh): split-KV. One
// thread block per (split, tile of 16 packed rows, kv head x batch); a packed
// row is one (query row, query head of the kv head's group), so the group's
// heads share each K/V read. Each warp walks its own 16-key chunks of the
// split (chunks w, w + Warps, ...) through its own cp.async ring of Stages
// (K, V) chunk pairs, keeping its own online-softmax state; the warps' states
// merge in shared memory at the end. Partial outputs (float32, normalized) and
// LSEs of each split go to the workspace and a combine kernel weighs them by
// their LSEs; with one split the block writes out and lse itself.
template <int HeadDim, int Warps, int Stages, bool QInRegs>
struct SplitKvTraits {
  static constexpr int kHeadDim = HeadDim;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = Warps * 32;
  static constexpr int kStages = Stages;
  static constexpr bool kQInRegs = QInRegs;
  static constexpr int kBlockRows = 16;  // packed rows per block (one m16 slab)
  static constexpr int kChunkKeys = 16;  // keys per warp step (the k16 of P V)
  static constexpr int kSmemStride = HeadDim + 8;  // Q: 16 bytes of padding per row
  // K/V chunks (streamed through every warp's ring): rows swizzled where they
  // are whole 128-byte groups, so each cp.async fills whole segments; padded
  // otherwise (head_dim 32, 96).
  using KvLayout = std::conditional_t<HeadDim % 64 == 0, sm80::SwizzledRows<HeadDim * 2>,
                                      sm80::PaddedRows<kSmemStride * 2>>;
  static constexpr int kChunkBytes = kChunkKeys * KvLayout::kRowBytes;
  static constexpr int kQBytes = kBlockRows * kSmemStride * 2;
  static constexpr int kRingBytes = Warps * Stages * 2 * kChunkBytes;  // K and V
  // The warps' (m, l, O) merge reuses the ring: per warp m and l (16 each),
  // then O as 16 rows of HeadDim float32 padded by 8 floats, so that the
  // rows of an accumulator fragment (8 apart in the row index) and the rows a
  // warp reads back fall in different banks.
  static constexpr int kMergeRowFloats = HeadDim + 8;
  static constexpr int kMergeWarpFloats = 2 * kBlockRows + kBlockRows * kMergeRowFloats;
  static constexpr int kMergeBytes = Warps * kMergeWarpFloats * 4;
  static constexpr int kSmemBytes = kQBytes + (kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes);
  static_assert(HeadDim % 32 == 0, "head_dim a multiple of 32");
  static_assert(Stages >= 2, "at least double buffering per warp");
  static_assert(kQBytes % 128 == 0 && kChunkBytes % 128 == 0,
                "K/V chunks start on 128-byte boundaries (SwizzledRows::advance XORs address bits 4-6)");
};

// Split-KV tilings, chosen per launch (kvcache_tiling; measurements: H100,
// d128, bf16, 32/8 heads, one query row, session 13 unless said):
// - narrow: 8 warps x 2 stages (1 block per SM at head_dim 128): the most
//   warps on one block's keys, one chunk in flight a warp. Where one split
//   fills the GPU and the cache is long (batch 32 from 8k keys).
// - wide: 4 warps x 3 stages (2 blocks per SM at 128), two chunks in flight
//   a warp and half the warps to merge. Where one split fills the GPU and the
//   cache is short (a second resident block streams while the other is in its
//   prologue or epilogue; batch 32 x 1k: 49.8 against 53.7 us narrow), and
//   where the keys are split, one block per SM (batch 1, 16 splits: 15.2 /
//   20.7 / 52.6 us at 4k / 8k / 32k keys against 15.7 / 21.2 / 53.4 narrow).
// - deep: 8 warps x 3 stages (1 block per SM, 196 KB at 128): two chunks in
//   flight a warp, for one split on part of the GPU (batch 8 x 1k / 4k / 8k,
//   64 blocks: 17.9 / 50.3 / 94.4 us against 21.3 / 52.9 / 96.3 for two
//   narrow splits and the combine).
// At head_dim 256 all three are 4 warps x 3 stages. Below 128 a chunk holds
// fewer bytes and the deep ring grows to keep head_dim 128's bytes in flight
// a warp, up to 5 stages (H100, 32/8 heads, d64, bf16, session 14: batch 8 x
// 1k / 8k / 32k 14.9 / 55.4 / 189 -> 12.1 / 50.1 / 180 us); wide and narrow
// keep theirs: a 5-stage wide ring made batch 1 3% slower (16 splits), a
// 3-stage narrow one batch 32 x 8k / 32k (187-194 / 742-786 us against 181 /
// 716). Q fragments in registers up to 128.
template <int HeadDim>
inline constexpr int kDeepStages = HeadDim >= 128 ? 3 : (1 + 256 / HeadDim < 5 ? 1 + 256 / HeadDim : 5);
template <int HeadDim>
struct NarrowSplitKvTraits {
  using type = SplitKvTraits<HeadDim, (HeadDim <= 128 ? 8 : 4), (HeadDim <= 128 ? 2 : 3), (HeadDim <= 128)>;
};
template <int HeadDim>
struct WideSplitKvTraits {
  using type = SplitKvTraits<HeadDim, 4, 3, (HeadDim <= 128)>;
};
template <int HeadDim>
struct DeepSplitKvTraits {
  using type = SplitKvTraits<HeadDim, (HeadDim <= 128 ? 8 : 4), kDeepStages<HeadDim>, (HeadDim <= 128)>;
};
enum class KvTiling { kNarrow, kWide, kDeep };
// Calls f with a value of the traits type of `tiling` at HeadDim: the one
// dispatch on the tiling (the launch and the host heuristic both use it).
template <int HeadDim, class F>
void with_split_kv_traits(KvTiling tiling, F&& f) {
  switch (tiling) {
    case KvTiling::kWide: return f(typename WideSplitKvTraits<HeadDim>::type{});
    case KvTiling::kDeep: return f(typename DeepSplitKvTraits<HeadDim>::type{});
    case KvTiling::kNarrow: break;
  }
  f(typename NarrowSplitKvTraits<HeadDim>::type{});
}
// The longest cache (capacity, keys) the wide tiling takes when one split
// fills the GPU.
inline constexpr int kWideTilingMaxKeys = 4096;

// The most splits a launch takes, and the page-size rule of a paged cache.
inline constexpr int kMaxKvSplits = 128;
inline constexpr int kPageSizeMultiple = 16;  // a warp's 16-key chunk never crosses a page

// Host side of the KV-cache path (fa2_mma_sm80_kvcache.cpp).
std::string kvcache_unsupported_reason(const KvCacheParams& params);
int kvcache_num_splits(const KvCacheParams& params);  // the heuristic (num_splits 0)
int kvcache_max_splits(const KvCacheParams& params);
size_t kvcache_workspace_bytes(const KvCacheParams& params);
// The splits a launch uses: params.num_splits, or the heuristic for 0.
int kvcache_splits_used(const KvCacheParams& params);
TileShape kvcache_tile_shape(const KvCacheParams& params);
// The tiling a launch uses (the rule: fa2_mma_sm80_kvcache.cpp).
KvTiling kvcache_tiling(const KvCacheParams& params);
// Blocks of kv heads a launch groups as one thread-block cluster (sm_90;
// 1: a plain launch), the split kernel running one block per SM. The rule:
// fa2_mma_sm80_kvcache.cpp.
int kvcache_cluster_size(const KvCacheParams& params, int num_splits);
// The launch in words: tiling, grid, clusters, combine (the registry's
// kvcache_launch_summary).
std::string kvcache_launch_summary(const KvCacheParams& params);
// The registry's launch hook: launch_kvcache_tiled for params.head_dim.
void kvcache_launch(const KvCacheParams& params);

// Appends k_new / v_new (if any), runs the split kernel and, with more than
// one split, the combine kernel; configuration Tr, params.dtype. Defined in
// fa2_mma_sm80_splitkv_kernel.cuh.
template <class Tr>
void launch_kvcache(const KvCacheParams& params, int num_splits);
// launch_kvcache with the given tiling of HeadDim; instantiated in the
// generated fa2_mma_sm80_splitkv_hdim<D>.cu.
template <int HeadDim>
void launch_kvcache_tiled(const KvCacheParams& params, int num_splits, KvTiling tiling);

// Multiprocessors of the current device (132 when there is none to ask) and
// the shared memory one multiprocessor holds, in bytes (228 KB when unknown).
int multiprocessor_count();
int shared_memory_per_multiprocessor();

}  // namespace flashlab::fa2_mma_sm80
