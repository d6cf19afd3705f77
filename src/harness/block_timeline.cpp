// The block timeline's summary (include/flashlab/harness/block_timeline.h).
#include "flashlab/harness/block_timeline.h"

#include <algorithm>
#include <iomanip>
#include <map>
#include <sstream>

#include "flashlab/kernel_params.h"
#include "json_text.h"

namespace flashlab {

namespace {

// min, 10%, median, 90%, max of a non-empty list (nearest rank).
std::array<double, 5> five_points(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const auto at = [&](double fraction) {
    return values[static_cast<size_t>(fraction * static_cast<double>(values.size() - 1) + 0.5)];
  };
  return {values.front(), at(0.1), at(0.5), at(0.9), values.back()};
}

std::string five_points_text(const std::array<double, 5>& points) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(1);
  for (size_t i = 0; i < points.size(); ++i) text << (i > 0 ? " / " : "") << points[i];
  return text.str();
}

}  // namespace

BlockTimeline block_timeline_from_slots(const std::vector<uint64_t>& slots, int sm_count) {
  BlockTimeline timeline;
  timeline.grid_blocks = static_cast<int64_t>(slots.size()) / kBlockTimelineSlots;
  timeline.sm_count = sm_count;
  uint64_t first = 0;
  for (int64_t b = 0; b < timeline.grid_blocks; ++b) {
    const uint64_t start = slots[b * kBlockTimelineSlots];
    if (start != 0 && (first == 0 || start < first)) first = start;
  }
  for (int64_t b = 0; b < timeline.grid_blocks; ++b) {
    const uint64_t start = slots[b * kBlockTimelineSlots], end = slots[b * kBlockTimelineSlots + 1];
    if (start == 0) continue;
    if (end == 0) ++timeline.blocks_without_end;
    const auto since_first = [&](uint64_t ns) { return static_cast<double>(static_cast<int64_t>(ns - first)) * 1e-3; };
    timeline.records.push_back({b, static_cast<int>(slots[b * kBlockTimelineSlots + 2]), since_first(start),
                                end == 0 ? since_first(start) : since_first(end)});
  }
  return timeline;
}

BlockTimelineSummary summarize_block_timeline(const BlockTimeline& timeline) {
  BlockTimelineSummary summary;
  summary.grid_blocks = timeline.grid_blocks;
  summary.sm_count = timeline.sm_count;
  summary.blocks = static_cast<int64_t>(timeline.records.size());
  if (timeline.records.empty()) return summary;
  std::map<int, std::vector<std::pair<double, double>>> by_sm;
  std::vector<double> ends;
  for (const BlockRecord& record : timeline.records) {
    by_sm[record.sm].push_back({record.start_us, record.end_us});
    ends.push_back(record.end_us);
    summary.span_us = std::max(summary.span_us, record.end_us);
    summary.last_start_us = std::max(summary.last_start_us, record.start_us);
  }
  summary.block_end_us = five_points(ends);
  summary.sms_used = static_cast<int>(by_sm.size());
  std::vector<double> done;
  double busy = 0, first_done = 0, last_done = 0;
  for (auto& [sm, intervals] : by_sm) {
    summary.most_blocks_on_an_sm = std::max(summary.most_blocks_on_an_sm, static_cast<int>(intervals.size()));
    // The union of the SM's block intervals (blocks that share an SM overlap).
    std::sort(intervals.begin(), intervals.end());
    double covered_until = intervals.front().first, sm_done = 0;
    for (const auto& [start, end] : intervals) {
      busy += std::max(0.0, end - std::max(start, covered_until));
      covered_until = std::max(covered_until, end);
      sm_done = std::max(sm_done, end);
    }
    done.push_back(sm_done);
    if (summary.first_sm_done < 0 || sm_done < first_done) summary.first_sm_done = sm, first_done = sm_done;
    if (summary.last_sm_done < 0 || sm_done > last_done) summary.last_sm_done = sm, last_done = sm_done;
  }
  summary.sm_done_us = five_points(done);
  const int sms = std::max(summary.sm_count, summary.sms_used);
  summary.busy_fraction = summary.span_us > 0 ? busy / (sms * summary.span_us) : 1.0;
  return summary;
}

std::string format_block_timeline(const BlockTimelineSummary& summary) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(1);
  text << "block timeline (the split kernel, one launch after an L2 flush; %globaltimer, from the first "
          "block's start): "
       << summary.blocks << " of " << summary.grid_blocks << " blocks on " << summary.sms_used << " of "
       << summary.sm_count << " SMs (at most " << summary.most_blocks_on_an_sm << " on one), " << summary.span_us
       << " us first start to last end\n";
  if (summary.blocks == 0) return text.str();
  text << "  the last block starts at " << summary.last_start_us << " us; block ends (min / 10% / median / 90% / max) "
       << five_points_text(summary.block_end_us) << " us\n"
       << "  SMs done (their last block's end) " << five_points_text(summary.sm_done_us) << " us: SM "
       << summary.first_sm_done << " first, SM " << summary.last_sm_done << " last\n"
       << "  SMs busy " << std::setprecision(1) << 100.0 * summary.busy_fraction << "% of " << summary.sm_count
       << " x " << summary.span_us << " us (the rest: SMs without a block, or done before the last block)\n";
  return text.str();
}

std::string block_timeline_json(const BlockTimelineSummary& summary) {
  const auto points = [](const std::array<double, 5>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) list += (i > 0 ? ", " : "") + json::number(values[i]);
    return list + "]";
  };
  std::ostringstream text;
  text << "{\"blocks\": " << summary.blocks << ", \"grid_blocks\": " << summary.grid_blocks
       << ", \"sms_used\": " << summary.sms_used << ", \"sm_count\": " << summary.sm_count
       << ", \"most_blocks_on_an_sm\": " << summary.most_blocks_on_an_sm
       << ", \"span_us\": " << json::number(summary.span_us)
       << ", \"last_start_us\": " << json::number(summary.last_start_us)
       << ", \"block_end_us\": " << points(summary.block_end_us) << ", \"sm_done_us\": " << points(summary.sm_done_us)
       << ", \"first_sm_done\": " << summary.first_sm_done << ", \"last_sm_done\": " << summary.last_sm_done
       << ", \"busy_fraction\": " << json::number(summary.busy_fraction) << "}";
  return text.str();
}

std::string block_timeline_csv(const BlockTimeline& timeline) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(3) << "block,sm,start_us,end_us\n";
  for (const BlockRecord& record : timeline.records)
    text << record.block << "," << record.sm << "," << record.start_us << "," << record.end_us << "\n";
  return text.str();
}

}  // namespace flashlab
