// fa3_wgmma_sm90's backward: where dK/dV of a key row and dQ of a query row
// live while fa3_backward_kernel runs (fa3_wgmma_sm90_bwd_kernel.cuh), for the
// backward tiling with_bwd_traits picks for the problem (KernelVariant::backward_locate).
// Host only, layout arithmetic:
//
//   tiles: key blocks of the longest sequence x kv heads x batch; the tile of
//   key index i of (batch, kv head) is KeyBlockOrder's (backward_key_block_order:
//   sections under a right-bounded mask in the default mode, which assume an
//   H100's SMs and L2 as the forward's locate does; else i + key blocks x (kv
//   head + kv heads x batch)), walked by CTA tile % grid (backward_grid_ctas:
//   persistent, an H100's SMs, or a CTA a tile), or, where the persistent grid
//   takes tiles from a counter (backward_schedules_dynamically), the tiles past
//   the grid's first by whichever CTA takes it (key_block_cta -1); key block n is key index n, or, deterministic under a
//   right-bounded mask (causal, windows), the sequence's key blocks - 1 - n. Consumer warpgroup
//   1 + (key % 128) / 64 owns the key (head dim split: 1 + column /
//   kKeyGradColumns, 64 keys a block), warp (key % 64) / 16 its 16-row slab:
//   acc_dk / acc_dv[n * 4 + h * 2 + e] hold column 8 n + 2 t + e (of the
//   consumer's columns) of the slab's row group + 8 h
//   (common/mma_accumulator_layout.h), dK unscaled.
//   dQ: the query block's 64 x 64 slabs (SlabDqOrder), kDqSlabs a consumer
//   in turn: acc_dq[n * 4 + slot] of thread (warp, lane) goes to accumulator
//   group slab * 32 + n * 4 + warp, float (group * 32 + lane) * 4 + slot. The
//   80-row tiling (head_dim 128 without a mask, default mode) computes dQ^T:
//   consumer w's slab is columns 64 w.. of all 80 rows, its accumulator's rows
//   the columns and its columns the rows (40 groups a slab).
#include <algorithm>
#include <cstdio>
#include <string>

#include "common/locate_layout.h"
#include "common/mma_accumulator_layout.h"
#include "common/sequence_view.h"
#include "common/visible_keys.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90_locate.h"

namespace flashlab::fa3_wgmma_sm90 {
namespace {

// A consumer thread's register slot: consumer warpgroup, warp, lane.
RegisterSlot consumer_slot(int consumer, int warp, int lane, const std::string& array, int index) {
  RegisterSlot slot;
  slot.thread[0] = 128 * (1 + consumer) + warp * 32 + lane;
  slot.warp = slot.thread[0] / 32;
  slot.lane = lane;
  slot.name = array + "[" + std::to_string(index) + "]";
  slot.index = {index};
  return slot;
}

template <class Tr>
BackwardElementLocation locate_backward_with(const AttentionBackwardParams& params, int batch, int head,
                                             int row, int col) {
  BackwardElementLocation location;
  location.source = kernel_source_beside(__FILE__, "fa3_wgmma_sm90_bwd_kernel.cuh");
  const SequenceView view = sequence_view(params, batch);
  const int group = params.heads / params.kv_heads, kv_head = head / group;
  const bool descending = params.deterministic && params.window_right >= 0;
  char scale_buffer[32];  // softmax_scale as cuda-gdb reads it back: 9 significant digits
  std::snprintf(scale_buffer, sizeof scale_buffer, "%.9g", params.softmax_scale);
  const std::string scale_text = scale_buffer;
  const int tiles = backward_tiles(params, Tr::kBlockN);
  location.grid[0] = backward_grid_ctas<Tr>(params, tiles, kLocateMultiprocessors);
  location.grid[1] = location.grid[2] = 1;
  location.block_threads[0] = Tr::kThreads;
  location.block_threads[1] = location.block_threads[2] = 1;
  location.block_q = Tr::kBlockM;
  location.block_k = Tr::kBlockN;
  const int key_blocks = (view.seqlen_k + Tr::kBlockN - 1) / Tr::kBlockN;
  const KeyBlockOrder order = backward_key_block_order(params, Tr::kBlockN, kLocateMultiprocessors, kLocateL2Bytes);
  const auto key_index_of = [&](int n_block) { return descending ? key_blocks - 1 - n_block : n_block; };
  const int query_blocks = (view.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  const bool rotated = rotates_backward_walks(params, Tr::kBlockN, fa2_mma_sm80::multiprocessor_count()) &&
                       key_blocks <= query_blocks;

  // dK / dV of key row `row`; the epilogue stages a block's dK and dV for TMA
  // where its walk has steps and its keys are all in the sequence.
  bool staged_keys = false;
  if (row < 0 || row >= view.seqlen_k) {
    location.keys_unavailable = "key row " + std::to_string(row) + " is past batch entry " +
                                std::to_string(batch) + "'s " + std::to_string(view.seqlen_k) + " keys";
  } else {
    location.key_block = row / Tr::kBlockN;
    location.key_block_tile =
        key_block_cta_index(key_index_of(location.key_block), batch * params.kv_heads + kv_head, order);
    // From the counter, tiles past the grid's first go to whichever CTA asks first (a launch
    // without query rows has no workspace and no counter: the static stride).
    const bool dynamic = backward_schedules_dynamically<Tr>(params) && params.seqlen_q > 0 &&
                         tiles > location.grid[0] && location.key_block_tile >= location.grid[0];
    location.key_block_cta[0] = dynamic ? -1 : location.key_block_tile % location.grid[0];
    location.key_block_cta[1] = location.key_block_cta[2] = 0;
    const int in_block = row % Tr::kBlockN;
    const int consumer = Tr::kSplitsHeadDim ? col / Tr::kKeyGradColumns : in_block / 64;
    const int warp = in_block % 64 / 16;
    const AccumulatorPosition position = accumulator_position(in_block % 16, col % 8);
    const int index = col % Tr::kKeyGradColumns / 8 * 4 + position.slot;
    location.dk = consumer_slot(consumer, warp, position.lane, "acc_dk", index);
    location.dv = consumer_slot(consumer, warp, position.lane, "acc_dv", index);
    location.key_note = "float32 sums over the walk, consumer warpgroup " + std::to_string(1 + consumer) +
                        (Tr::kSplitsHeadDim ? " (columns " + std::to_string(consumer * Tr::kKeyGradColumns) + ".." +
                                                  std::to_string((consumer + 1) * Tr::kKeyGradColumns - 1) + ")"
                                            : std::string()) +
                        "; stored as dK = acc_dk * softmax_scale, dV = acc_dv in the input dtype";
    const int n0 = location.key_block * Tr::kBlockN;
    const int keys_here = std::min(Tr::kBlockN, view.seqlen_k - n0);
    const KeyRange rows = visible_rows_of_keys(n0, n0 + keys_here - 1, view.seqlen_q, view.seqlen_k,
                                               params.window_left, params.window_right);
    staged_keys = backward_stages_key_gradients(Tr::kHeadDim, params.deterministic) && !rows.empty() &&
                  keys_here == Tr::kBlockN;
    location.key_note += staged_keys ? " (staged in shared memory over the block's K and V, stored by TMA)"
                                     : " (4-byte stores from registers)";
    if (rows.empty()) {
      location.walk_note = "no query row sees key block " + std::to_string(location.key_block) +
                           ": the block walks nothing and stores zeros";
    } else {
      const int first = rows.first / Tr::kBlockM, last = rows.last / Tr::kBlockM;
      const int start = location.key_block;  // a rotated walk's first query block
      const std::string blocks =
          rotated && start > 0 ? std::to_string(start) + ".." + std::to_string(last) + ", then " +
                                     std::to_string(first) + ".." + std::to_string(start - 1) +
                                     " (rotated: the deterministic mode's order without a mask)"
                               : std::to_string(first) + ".." + std::to_string(last) + " (ascending)";
      location.walk_note = "query blocks " + blocks + " of head " + std::to_string(kv_head * group) +
                           (group > 1 ? ", then of heads " + std::to_string(kv_head * group + 1) + ".." +
                                            std::to_string(kv_head * group + group - 1) + " in turn"
                                      : std::string()) +
                           ": " + std::to_string((last - first + 1) * group) + " steps";
    }
  }

  // cuda-gdb: the epilogue's store of the key row (also where the row has no query row to locate).
  if (location.keys_unavailable.empty()) {
    CudaGdbStop keys_stop;
    keys_stop.marker = staged_keys ? "cuda-gdb: key `key`'s dK and dV, staged" : "cuda-gdb: key `key`'s dK and dV sums";
    keys_stop.line_offset = 2;  // past the #pragma: the column loop
    // store_key_gradients' (stage_key_gradients') local `key`; the kv head and the batch entry through
    // the CTA's blockIdx, and its `tile` where the CTA walks several (its
    // kv_head argument reads <optimized out> in cuda-gdb, and p's members
    // through the reference cannot be named: the scale is printed as a number).
    keys_stop.condition = "key == " + std::to_string(row) +
                          (location.key_block_cta[0] >= 0
                               ? " && blockIdx.x == " + std::to_string(location.key_block_cta[0])
                               : std::string()) +
                          (location.grid[0] < tiles ? " && tile == " + std::to_string(location.key_block_tile)
                                                    : std::string()) +
                          " && threadIdx.x == " + std::to_string(location.dk.thread[0]);
    keys_stop.prints = {location.dk.name + " * " + scale_text, location.dv.name};
    keys_stop.what = "dK and dV of the key row and column as the kernel stores them (before rounding)";
    location.stops.push_back(keys_stop);
  }

  // dQ of query row `row`.
  if (row < 0 || row >= view.seqlen_q) {
    location.queries_unavailable = row_past_sequence(view, batch, row);
    return location;
  }
  location.query_block = row / Tr::kBlockM;
  const int m0 = location.query_block * Tr::kBlockM;
  const KeyRange keys = visible_keys_of_rows(m0, std::min(m0 + Tr::kBlockM, view.seqlen_q) - 1, view.seqlen_q,
                                             view.seqlen_k, params.window_left, params.window_right);
  location.dq_ordered = params.deterministic;
  if (!keys.empty()) {
    const int first = keys.first / Tr::kBlockN, last = keys.last / Tr::kBlockN;
    if (rotated) {
      location.adding_key_blocks.assign(last - first + 1, -1);
      for (int n = first; n <= last; ++n)
        location.adding_key_blocks[rotated_dq_rank(location.query_block, n, key_blocks, query_blocks)] = n;
    } else if (descending)
      for (int n = last; n >= first; --n) location.adding_key_blocks.push_back(n);
    else
      for (int n = first; n <= last; ++n) location.adding_key_blocks.push_back(n);
  }
  const int in_block = row % Tr::kBlockM;
  const int slab = Tr::kDqSplitsColumns ? col / 64 : in_block / 64;
  const FragmentOrigin slab_origin{Tr::kDqSplitsColumns ? 0 : slab * 64, Tr::kDqSplitsColumns ? slab * 64 : 0};
  const int r = in_block - slab_origin.row, c = col - slab_origin.col;
  // The accumulator's row and column: dQ^T's (column, row) where transposed.
  const int acc_row = Tr::kTransposedDq ? c : r, acc_col = Tr::kTransposedDq ? r : c;
  const int warp = acc_row / 16, n = acc_col / 8;
  const int dq_consumer = slab / Tr::kDqSlabs;
  const AccumulatorPosition position = accumulator_position(acc_row % 16, acc_col % 8);
  location.dq = consumer_slot(dq_consumer, warp, position.lane, "acc_dq", n * 4 + position.slot);
  const int fragment_group = slab * SlabDqOrder<Tr>::kGroups + n * 4 + warp;
  location.dq_accum_element = static_cast<int64_t>(m0) * params.head_dim + (fragment_group * 32 + position.lane) * 4 +
                              position.slot;
  location.dq_note =
      "float32, this step's " + std::string(Tr::kTransposedDq ? "dQ^T slab (its 64 columns x the block's " +
                                                                       std::to_string(Tr::kBlockM) + " rows)"
                                                                 : "slab") +
      " of the query block (unscaled: dq = softmax_scale * the sum); " +
      (backward_dq_add<Tr>(params) != DqAdd::registers
           ? "staged in shared memory and added by the slab's writer warp (threads " +
                 std::to_string(32 * (1 + dq_consumer)) + ".." + std::to_string(32 * (2 + dq_consumer) - 1) +
                 ") with a bulk reduce-add" +
                 std::string(params.deterministic ? " once the slab's semaphore reaches the block's rank"
                                                  : ", in whatever order the blocks reach it")
           : std::string("added with red.global.add.v4.f32 from these registers, in whatever order the blocks "
                         "reach it")) +
      "; element " + std::to_string(location.dq_accum_element) +
      " of the accumulator from the sequence's first row of this head (fragment order), "
      "converted by the convert kernel";

  // cuda-gdb: a step's dQ slab.
  if (!location.adding_key_blocks.empty()) {
    CudaGdbStop dq_stop;
    dq_stop.marker = "cuda-gdb: this step's dQ slab";
    dq_stop.condition = "n_block == " + std::to_string(location.adding_key_blocks.front()) + " && head == " +
                        std::to_string(head) + " && m0 == " + std::to_string(m0) + " && batch == " +
                        std::to_string(batch) + " && threadIdx.x == " + std::to_string(location.dq.thread[0]) +
                        (Tr::kDqSlabs > 1 ? " && slab == " + std::to_string(slab) : std::string());
    dq_stop.prints = {location.dq.name + " * " + scale_text};
    dq_stop.what = "key block " + std::to_string(location.adding_key_blocks.front()) +
                   "'s part of the dQ element (the key blocks' parts sum to it)";
    location.stops.push_back(dq_stop);
  }
  return location;
}

}  // namespace

BackwardElementLocation locate_backward(const AttentionBackwardParams& params, int batch, int head, int row,
                                        int col) {
  BackwardElementLocation location;
  location.keys_unavailable = location.queries_unavailable =
      "fa3_wgmma_sm90 has no backward tiling for head_dim " + std::to_string(params.head_dim);
  FLASHLAB_HEAD_DIM_SWITCH(BackwardHeadDims, params.head_dim, kHeadDim, [&] {
    with_bwd_traits<kHeadDim>(params, [&](auto traits) {
      location = locate_backward_with<decltype(traits)>(params, batch, head, row, col);
    });
  });
  return location;
}

}  // namespace flashlab::fa3_wgmma_sm90
