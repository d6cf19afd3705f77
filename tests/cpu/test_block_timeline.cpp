// The block timeline's host side (flashlab/harness/block_timeline.h): records
// from raw slots, the summary's figures and the CSV, on hand-made timelines.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flashlab/harness/block_timeline.h"
#include "flashlab/kernel_params.h"

namespace flashlab {
namespace {

// Raw slots of one block: start and end in ns, SM.
void add_block(std::vector<uint64_t>& slots, uint64_t start_ns, uint64_t end_ns, uint64_t sm) {
  slots.insert(slots.end(), {start_ns, end_ns, sm});
  static_assert(kBlockTimelineSlots == 3);
}

TEST(BlockTimeline, RecordsOnlyTheBlocksThatWroteFromTheFirstStart) {
  std::vector<uint64_t> slots;
  add_block(slots, 5'000'500, 5'010'500, 7);
  add_block(slots, 0, 0, 0);  // never started: not recorded
  add_block(slots, 5'000'000, 0, 3);  // started, no end
  const BlockTimeline timeline = block_timeline_from_slots(slots, 132);
  EXPECT_EQ(timeline.grid_blocks, 3);
  EXPECT_EQ(timeline.sm_count, 132);
  ASSERT_EQ(timeline.records.size(), 2u);
  EXPECT_EQ(timeline.records[0].block, 0);
  EXPECT_EQ(timeline.records[0].sm, 7);
  EXPECT_DOUBLE_EQ(timeline.records[0].start_us, 0.5);
  EXPECT_DOUBLE_EQ(timeline.records[0].end_us, 10.5);
  EXPECT_EQ(timeline.records[1].block, 2);
  EXPECT_DOUBLE_EQ(timeline.records[1].start_us, 0.0);
  EXPECT_DOUBLE_EQ(timeline.records[1].end_us, 0.0);
  EXPECT_EQ(timeline.blocks_without_end, 1);
}

// SM 0 runs two overlapping blocks (0-10 and 2-12 us: busy 12), SM 1 one
// (0-6 us), SM 2 none: busy 18 of 3 x 12 us.
BlockTimeline three_sms() {
  BlockTimeline timeline;
  timeline.grid_blocks = 4;
  timeline.sm_count = 3;
  timeline.records = {{0, 0, 0.0, 10.0}, {1, 1, 0.0, 6.0}, {2, 0, 2.0, 12.0}};
  return timeline;
}

TEST(BlockTimeline, SummaryCountsBlocksSmsAndTheBusyFraction) {
  const BlockTimelineSummary summary = summarize_block_timeline(three_sms());
  EXPECT_EQ(summary.blocks, 3);
  EXPECT_EQ(summary.grid_blocks, 4);
  EXPECT_EQ(summary.sms_used, 2);
  EXPECT_EQ(summary.most_blocks_on_an_sm, 2);
  EXPECT_DOUBLE_EQ(summary.span_us, 12.0);
  EXPECT_DOUBLE_EQ(summary.last_start_us, 2.0);
  EXPECT_DOUBLE_EQ(summary.busy_fraction, 18.0 / 36.0);
  // Block ends 6, 10, 12; SMs done at 12 (SM 0) and 6 (SM 1).
  EXPECT_DOUBLE_EQ(summary.block_end_us[0], 6.0);
  EXPECT_DOUBLE_EQ(summary.block_end_us[2], 10.0);
  EXPECT_DOUBLE_EQ(summary.block_end_us[4], 12.0);
  EXPECT_DOUBLE_EQ(summary.sm_done_us[0], 6.0);
  EXPECT_DOUBLE_EQ(summary.sm_done_us[4], 12.0);
  EXPECT_EQ(summary.first_sm_done, 1);
  EXPECT_EQ(summary.last_sm_done, 0);
}

TEST(BlockTimeline, ReportAndCsvNameWhatTheyShow) {
  const BlockTimeline timeline = three_sms();
  const std::string report = format_block_timeline(summarize_block_timeline(timeline));
  EXPECT_NE(report.find("3 of 4 blocks on 2 of 3 SMs (at most 2 on one)"), std::string::npos) << report;
  EXPECT_NE(report.find("SMs busy 50.0%"), std::string::npos) << report;
  EXPECT_EQ(block_timeline_csv(timeline),
            "block,sm,start_us,end_us\n0,0,0.000,10.000\n1,1,0.000,6.000\n2,0,2.000,12.000\n");
  EXPECT_NE(block_timeline_json(summarize_block_timeline(timeline)).find("\"busy_fraction\": 0.5"),
            std::string::npos);
}

TEST(BlockTimeline, NoRecordsSummarizeToNothing) {
  BlockTimeline timeline;
  timeline.grid_blocks = 8;
  timeline.sm_count = 132;
  const BlockTimelineSummary summary = summarize_block_timeline(timeline);
  EXPECT_EQ(summary.blocks, 0);
  EXPECT_EQ(summary.sms_used, 0);
  EXPECT_NE(format_block_timeline(summary).find("0 of 8 blocks"), std::string::npos);
}

}  // namespace
}  // namespace flashlab
