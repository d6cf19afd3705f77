// The block timeline of a KV-cache launch (KvCacheParams::block_timeline,
// flashlab-run --kvcache --timeline): when each block of the split kernel
// started and ended and on which SM, and a summary of how evenly the grid
// kept the SMs busy. Host code; the device side is
// src/kernels/common/block_timeline.h.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace flashlab {

struct BlockRecord {
  int64_t block = 0;  // linear block index (x + y * X + z * X * Y)
  int sm = 0;
  double start_us = 0, end_us = 0;  // from the grid's first start
};

struct BlockTimeline {
  std::vector<BlockRecord> records;  // the blocks that wrote, in block order
  int64_t grid_blocks = 0;           // the blocks the launch had
  int64_t blocks_without_end = 0;    // wrote a start but no end (their end_us is their start_us)
  int sm_count = 0;                  // the device's SMs
};

// From the raw slots (kBlockTimelineSlots uint64 per block, zeroed before the
// launch: a block whose start is 0 did not write).
BlockTimeline block_timeline_from_slots(const std::vector<uint64_t>& slots, int sm_count);

struct BlockTimelineSummary {
  int64_t blocks = 0, grid_blocks = 0;
  int sms_used = 0, sm_count = 0, most_blocks_on_an_sm = 0;
  double span_us = 0;        // first start to last end
  double last_start_us = 0;  // the last block to start (later waves start late)
  // min, 10%, median, 90%, max
  std::array<double, 5> block_end_us{};
  std::array<double, 5> sm_done_us{};  // per SM that ran a block: its last block's end
  int first_sm_done = -1, last_sm_done = -1;
  // The time some block ran on an SM, summed over the SMs, over sm_count x
  // span: what a grid that ends unevenly (or leaves SMs without a block) loses.
  double busy_fraction = 0;
};

BlockTimelineSummary summarize_block_timeline(const BlockTimeline& timeline);
std::string format_block_timeline(const BlockTimelineSummary& summary);
std::string block_timeline_json(const BlockTimelineSummary& summary);
// "block,sm,start_us,end_us" and a line per record.
std::string block_timeline_csv(const BlockTimeline& timeline);

}  // namespace flashlab
