// fa2_mma_sm80: where out[batch, row, head, col] and the row's online-softmax
// state live while fa2_forward_kernel runs (fa2_mma_sm80_kernel.cuh and its
// launch_forward), for the default tiling of the head dim. Host only.
//
//   grid (ceil(seqlen_q / kBlockQ), heads, batch), kThreads threads; the block
//   blockIdx.x computes query tile gridDim.x - 1 - blockIdx.x (highest first);
//   warp w owns rows w * kRowsPerWarp .. of the tile, kMTiles m16 slabs;
//   mma.sync m16n8 accumulators (common/mma_accumulator_layout.h): lane
//   4 * group + thread_in_group holds rows group and group + 8 of each slab,
//   columns 8 n + 2 thread_in_group + {0, 1} in acc_o[mt][n][h * 2 + {0, 1}];
//   row_max[mt][h] (raw score units) in all four lanes of the quad,
//   row_sum[mt][h] a per-lane partial sum (the quad is reduced after the last tile).
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_locate.h"

#include <string>

#include "common/locate_layout.h"
#include "common/mma_accumulator_layout.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab::fa2_mma_sm80 {
namespace {

// The traced build's state line (the line after the "cuda-gdb: the
// online-softmax state" marker in fa2_mma_sm80_kernel.cuh): the locals it
// names. One place to edit if the traced kernel names them differently.
constexpr const char* kTracedCondition =
    "tile == {tile} && row == {row} && batch == {batch} && head == {head}";
constexpr const char* kTracedPrints[] = {"tile", "row", "running_max", "running_sum"};

// A line inside the key-tile loop of every build (plain and traced), after the
// online-softmax update of the tile and before its O += P V.
constexpr const char* kLoopMarker = "for (int kk = 0; kk < kKSteps; ++kk)";

std::string replaced(std::string text, const std::string& name, int value) {
  for (size_t at; (at = text.find(name)) != std::string::npos;)
    text.replace(at, name.size(), std::to_string(value));
  return text;
}

template <class Tr>
ElementLocation locate_with(const AttentionParams& params, int batch, int head, int row, int col) {
  ElementLocation location;
  location.source = kernel_source_beside(__FILE__, "fa2_mma_sm80_kernel.cuh");
  const SequenceView view = sequence_view(params, batch);
  location.unavailable = row_past_sequence(view, batch, row);
  if (!location.unavailable.empty()) return location;
  location.grid[0] = (params.seqlen_q + Tr::kBlockQ - 1) / Tr::kBlockQ;
  location.grid[1] = params.heads;
  location.grid[2] = params.batch;
  location.block_threads[0] = Tr::kThreads;
  location.block_threads[1] = location.block_threads[2] = 1;
  location.query_block = row / Tr::kBlockQ;
  location.row_in_block = row % Tr::kBlockQ;
  location.block[0] = location.grid[0] - 1 - location.query_block;
  location.block[1] = head;
  location.block[2] = batch;
  location.block_note = "blockIdx = (gridDim.x - 1 - query tile, head, batch): the highest query tiles launch first";

  const int warp = location.row_in_block / Tr::kRowsPerWarp;
  const int mt = location.row_in_block % Tr::kRowsPerWarp / 16;
  const int row_in_slab = location.row_in_block % 16;
  const int n = col / 8;
  const AccumulatorPosition position = accumulator_position(row_in_slab, col % 8);
  const auto slot_of = [&](int lane) {
    RegisterSlot slot;
    slot.thread[0] = warp * 32 + lane;
    slot.warp = warp;
    slot.lane = lane;
    return slot;
  };
  RegisterSlot out = slot_of(position.lane);
  out.index = {mt, n, position.slot};
  out.name = "acc_o[" + std::to_string(mt) + "][" + std::to_string(n) + "][" +
             std::to_string(position.slot) + "]";
  location.out = {out};
  location.out_note =
      "float32, unnormalized and rescaled per tile (out = acc_o / l after the last tile)";
  const std::string state_index = "[" + std::to_string(mt) + "][" + std::to_string(position.h) + "]";
  locate_quad_row_state(location, slot_of, position.lane, state_index, {mt, position.h});
  location.state_note =
      "row_max is in raw score units (m = row_max * softmax_scale), the same in the quad's four "
      "lanes; row_sum is each lane's partial sum over its own columns: l is the sum over the four "
      "lanes (the kernel adds them after the last tile)";

  locate_key_tiles(location, params, view, row, Tr::kBlockQ, Tr::kBlockK,
                   /*last_tile_first=*/false);

  CudaGdbStop traced;
  traced.marker = "cuda-gdb: the online-softmax state";
  traced.needs_trace = true;
  traced.fixed_length_only = true;
  traced.condition = replaced(replaced(replaced(kTracedCondition, "{row}", row), "{batch}", batch),
                              "{head}", head);
  traced.focus_needed = false;
  for (const char* print : kTracedPrints) traced.prints.push_back(print);
  traced.what = "the row's m (natural-log units) and l after key tile {tile}, as --show-state gives them";

  CudaGdbStop loop;
  loop.marker = kLoopMarker;
  loop.line_offset = 0;
  loop.condition = "tile == {tile} && blockIdx.x == " + std::to_string(location.block[0]) +
                   " && blockIdx.y == " + std::to_string(head) + " && blockIdx.z == " +
                   std::to_string(batch) + " && threadIdx.x == " + std::to_string(out.thread[0]);
  loop.prints = {"tile", "row_max" + state_index, "row_max" + state_index + " * p.softmax_scale",
                 "row_sum" + state_index, out.name};
  loop.what =
      "after key tile {tile}'s softmax, before its P V: m, this lane's part of l, O rescaled "
      "(l: add row_sum" + state_index + " of the quad's four lanes)";
  location.stops = {traced, loop};
  return location;
}

}  // namespace

ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col) {
  ElementLocation location;
  location.unavailable = "fa2_mma_sm80 has no tiling for head_dim " + std::to_string(params.head_dim);
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    location = locate_with<typename DefaultTraits<kHeadDim>::type>(params, batch, head, row, col);
  });
  return location;
}

}  // namespace flashlab::fa2_mma_sm80
