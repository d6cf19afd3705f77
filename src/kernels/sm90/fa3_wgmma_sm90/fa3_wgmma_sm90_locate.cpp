// fa3_wgmma_sm90: where out[batch, row, head, col] and the row's online-softmax
// state live while fa3_forward_kernel runs (fa3_wgmma_sm90_kernel.cuh), for the
// default tiling of the head dim. Host only.
//
//   persistent grid: CTA i takes work tiles i, i + grid, ... in the order of
//   work_tile_at (common/tile_scheduler.h), whose sections depend on the device's L2
//   and the grid on its SM count (schedule()); under masks and varlen, tilings
//   with kDynamicSchedule hand tiles out at run time (the traced build never);
//   warpgroup 0 produces; consumer warpgroup 1 + row_in_block / 64 owns the
//   row, its warp (row_in_block % 64) / 16 the 16-row slab; wgmma m64nN
//   accumulators follow the m16n8 per-warp pattern (common/mma_accumulator_layout.h):
//   acc_o[n * 4 + h * 2 + e] holds column 8 n + 2 thread_in_group + e of row
//   group + 8 h; row_max[h] (raw score units) in the quad's four lanes,
//   row_sum[h] per-lane partial sums.
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90_locate.h"

#include <string>

#include "common/locate_layout.h"
#include "common/mma_accumulator_layout.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"

namespace flashlab::fa3_wgmma_sm90 {
namespace {

template <class Tr>
ElementLocation locate_with(const AttentionParams& params, int batch, int head, int row, int col,
                            int multiprocessors, int l2_bytes) {
  ElementLocation location;
  location.source = kernel_source_beside(__FILE__, "fa3_wgmma_sm90_kernel.cuh");
  const SequenceView view = sequence_view(params, batch);
  location.unavailable = row_past_sequence(view, batch, row);
  if (!location.unavailable.empty()) return location;
  constexpr bool kFp8 = Tr::kElementBytes == 1;  // Fp8Traits: its tiles, P x 2^8, descales, no traced build
  const Schedule plan = schedule(params, Tr::kBlockM, Tr::kElementBytes, multiprocessors, l2_bytes);
  location.grid[0] = plan.grid;
  location.grid[1] = location.grid[2] = 1;
  location.block_threads[0] = Tr::kThreads;
  location.block_threads[1] = location.block_threads[2] = 1;
  location.query_block = row / Tr::kBlockM;
  location.row_in_block = row % Tr::kBlockM;

  // Invert work_tile_at: the index of (query block, head, batch) in the order.
  const int pair = batch * params.heads + head;
  const int section = pair / plan.section_heads;
  const int first_pair = section * plan.section_heads;
  const int left = params.heads * params.batch - first_pair;
  const int pairs_here = plan.section_heads < left ? plan.section_heads : left;
  const int within = (plan.num_q_blocks - 1 - location.query_block) * pairs_here + (pair - first_pair);
  const int index = section * plan.section_heads * plan.num_q_blocks + within;
  location.block[0] = index % plan.grid;
  location.block[1] = location.block[2] = 0;
  location.block_note =
      "persistent grid: work tile " + std::to_string(index) + " of " +
      std::to_string(plan.num_work_tiles) + ", the CTA's work tile number " +
      std::to_string(index / plan.grid) + " (counting from 0), sections of " +
      std::to_string(plan.section_heads) + " (batch, head) pairs; assumes " +
      std::to_string(plan.grid) + " CTAs (" + std::to_string(multiprocessors) + " SMs" +
      (params.sm_margin > 0 ? " less sm_margin " + std::to_string(params.sm_margin) : std::string()) + ") and " +
      std::to_string(l2_bytes >> 20) +
      " MB of L2 (an H100 SXM): on another GPU the CTA differs, the conditions below do not";
  if (Tr::kDynamicSchedule && plan.dynamic)
    location.block_note +=
        "; this problem's work tiles (unequal under its mask / varlen) are handed out at run "
        "time in the timed build, so this CTA holds for the tile-trace build only: in the timed "
        "build, stop on the batch/head/row condition below instead of the CTA";

  const int consumer = location.row_in_block / 64;
  const int warp = (location.row_in_block % 64) / 16;
  const int n = col / 8;
  const AccumulatorPosition position = accumulator_position(location.row_in_block % 16, col % 8);
  const auto slot_of = [&](int lane) {
    RegisterSlot slot;
    slot.thread[0] = 128 * (1 + consumer) + warp * 32 + lane;
    slot.warp = slot.thread[0] / 32;
    slot.lane = lane;
    return slot;
  };
  RegisterSlot out = slot_of(position.lane);
  out.index = {n * 4 + position.slot};
  out.name = "acc_o[" + std::to_string(n * 4 + position.slot) + "]";
  location.out = {out};
  location.out_note = std::string(kFp8 ? "float32, unnormalized (P x 2^8) and rescaled per tile (out = acc_o * "
                                           "v_descale / l after the last tile); "
                                         : "float32, unnormalized and rescaled per tile (out = acc_o / l after the "
                                           "last tile); ") +
                      "consumer warpgroup " + std::to_string(1 + consumer) + " (threads " +
                      std::to_string(128 * (1 + consumer)) + ".." +
                      std::to_string(128 * (2 + consumer) - 1) + ")";
  const std::string state_index = "[" + std::to_string(position.h) + "]";
  locate_quad_row_state(location, slot_of, position.lane, state_index, {position.h});
  location.state_note =
      kFp8 ? "row_max is in raw e4m3 score units (m = row_max * softmax_scale * fp8.qk, fp8.qk = q_descale * "
             "k_descale of the (batch, kv head)), the same in the quad's four lanes; row_sum is each lane's "
             "partial sum of P x 2^8: l is the sum over the four lanes / 256 (no traced build for e4m3)"
           : "row_max is in raw score units (m = row_max * softmax_scale), the same in the quad's four "
             "lanes; row_sum is each lane's partial sum: l is the sum over the four lanes (the traced "
             "build's `running_sum` at the state line is that sum)";

  // Visited from the last key tile down (key_tiles in the kernel).
  locate_key_tiles(location, params, view, row, Tr::kBlockM, Tr::kBlockN,
                   /*last_tile_first=*/true);

  // The traced instantiation's state line: the quad's first lane stops there.
  CudaGdbStop traced;
  traced.marker = "cuda-gdb: the online-softmax state";
  traced.needs_trace = true;
  traced.fixed_length_only = true;
  traced.condition = "tile == {tile} && row == " + std::to_string(row) + " && batch == " +
                     std::to_string(batch) + " && head == " + std::to_string(head);
  traced.focus_needed = false;
  traced.prints = {"tile", "row", "running_max", "running_sum"};
  traced.what = "the row's m (natural-log units) and l (the quad's sum) after key tile {tile}";

  // Every build: the steady-state loop, right after the tile's softmax (the
  // first visited tile's softmax is the prologue's: not this line).
  CudaGdbStop loop;
  loop.marker = "softmax(tile, bool(masked));";
  loop.line_offset = 1;
  loop.condition = "tile == {tile} && cur.work.q_block == " + std::to_string(location.query_block) +
                   " && cur.work.head == " + std::to_string(head) + " && cur.work.batch == " +
                   std::to_string(batch) + " && threadIdx.x == " + std::to_string(out.thread[0]);
  loop.prints = {"tile", "row_max" + state_index,
                 "row_max" + state_index + (kFp8 ? " * p.softmax_scale * fp8.qk" : " * p.softmax_scale"),
                 "row_sum" + state_index};
  loop.what = "after key tile {tile}'s softmax (any tile but the first visited): m and this "
              "lane's part of l (add row_sum" + state_index + " of the quad's four lanes)";
  location.stops = kFp8 ? std::vector<CudaGdbStop>{loop} : std::vector<CudaGdbStop>{traced, loop};
  return location;
}

}  // namespace

ElementLocation locate_on(const AttentionParams& params, int batch, int head, int row, int col,
                          int multiprocessors, int l2_bytes) {
  ElementLocation location;
  location.unavailable = "fa3_wgmma_sm90 has no tiling for head_dim " + std::to_string(params.head_dim);
  if (params.dtype == DataType::e4m3) {
    location.unavailable = "fa3_wgmma_sm90 takes e4m3 at head_dim " + Fp8HeadDims::text() + "; got " +
                           std::to_string(params.head_dim);
    FLASHLAB_HEAD_DIM_SWITCH(Fp8HeadDims, params.head_dim, kHeadDim, [&] {
      with_fp8_traits<kHeadDim>(params, [&](auto tiling) {
        location = locate_with<decltype(tiling)>(params, batch, head, row, col, multiprocessors, l2_bytes);
      });
    });
    return location;
  }
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    location = locate_with<typename DefaultTraits<kHeadDim>::type>(params, batch, head, row, col,
                                                                   multiprocessors, l2_bytes);
  });
  return location;
}

ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col) {
  return locate_on(params, batch, head, row, col, kLocateMultiprocessors, kLocateL2Bytes);
}

}  // namespace flashlab::fa3_wgmma_sm90
