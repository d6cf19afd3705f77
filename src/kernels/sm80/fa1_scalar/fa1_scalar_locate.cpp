// fa1_scalar: where out[batch, row, head, col] and the row's online-softmax
// state live while fa1_scalar_kernel runs (see fa1_scalar_kernel.cuh and its
// launch_with_head_dim): grid (ceil(seqlen_q / 64), heads, batch), 64 threads,
// thread threadIdx.x owns row query_tile * 64 + threadIdx.x of its (batch,
// head); its O is accumulator[col] (unnormalized), its m and l are row_max
// and row_sum (copied into running_max and running_sum at the cuda-gdb stop,
// the values the trace stores). Host only.
#include "sm80/fa1_scalar/fa1_scalar_locate.h"

#include <string>

#include "common/locate_layout.h"

namespace flashlab::fa1_scalar {

ElementLocation locate(const AttentionParams& params, int batch, int head, int row, int col) {
  const TileShape tiles = launch_tiles();
  ElementLocation location;
  location.source = kernel_source_beside(__FILE__, "fa1_scalar_kernel.cuh");
  const SequenceView view = sequence_view(params, batch);
  location.unavailable = row_past_sequence(view, batch, row);
  if (!location.unavailable.empty()) return location;
  location.grid[0] = (params.seqlen_q + tiles.block_q - 1) / tiles.block_q;
  location.grid[1] = params.heads;
  location.grid[2] = params.batch;
  location.block_threads[0] = tiles.block_q;
  location.block_threads[1] = location.block_threads[2] = 1;
  location.query_block = row / tiles.block_q;
  location.row_in_block = row % tiles.block_q;
  location.block[0] = location.query_block;
  location.block[1] = head;
  location.block[2] = batch;
  location.block_note = "blockIdx = (query tile, head, batch)";

  RegisterSlot thread;
  thread.thread[0] = location.row_in_block;
  thread.warp = location.row_in_block / 32;
  thread.lane = location.row_in_block % 32;
  RegisterSlot out = thread, m = thread, l = thread;
  out.name = "accumulator[" + std::to_string(col) + "]";
  out.index = {col};
  m.name = "row_max";
  l.name = "row_sum";
  location.out = {out};
  location.row_max = {m};
  location.row_sum = {l};
  location.out_note = "float32, unnormalized (out = accumulator[col] / row_sum after the last tile)";
  location.state_note =
      "m in natural-log units of the scaled scores (with a sink, from the sink's logit); l relative to "
      "exp(m) (the sink's term joins it after the last tile)";

  // The key tiles the block visits (fa1_scalar_kernel: block_keys), ascending.
  locate_key_tiles(location, params, view, row, tiles.block_q, tiles.block_k,
                   /*last_tile_first=*/false);

  // Present in every build: the trace store is guarded by params.trace.enabled().
  CudaGdbStop stop;
  stop.marker = "cuda-gdb: the online-softmax state";
  stop.line_offset = 1;
  stop.condition = "key_tile == {tile} && threadIdx.x == " + std::to_string(location.row_in_block) +
                   " && blockIdx.x == " + std::to_string(location.block[0]) +
                   " && blockIdx.y == " + std::to_string(head) +
                   " && blockIdx.z == " + std::to_string(batch);
  stop.prints = {"key_tile", "my_row", "running_max", "running_sum",
                 "accumulator[" + std::to_string(col) + "]"};
  stop.what = "the row's state after key tile {tile}";
  location.stops = {stop};
  return location;
}

}  // namespace flashlab::fa1_scalar
