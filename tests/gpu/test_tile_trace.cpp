// The tile-state diff: silent on every kernel that records states, and on
// each planted bug it names the key tile and the statistic where it starts
// (fa1's classic wrong-index bug: key tile 1, the running max; fa2's skipped
// rescale: key tile 1, the running sum), where the element diff can only say
// which elements are wrong.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/dev_kernels.h"
#include "flashlab/harness/problem.h"
#include "flashlab/harness/tile_trace.h"
#include "test_support.h"

namespace flashlab {
namespace {

ProblemSpec traced_problem(const std::string& kernel) {
  ProblemSpec spec;
  spec.kernel = kernel;
  spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
  spec.seqlen_q = 113, spec.seqlen_k = 203;  // several key tiles, ragged last tile
  spec.head_dim = 64;
  spec.dtype = at::kHalf;
  spec.seed = testing::test_seed();
  return spec;
}

TEST(TileTrace, RecordedStatesMatchForEveryTracingKernel) {
  FLASHLAB_REQUIRE_GPU();
  int traced = 0;
  for (const auto& kernel : registered_kernels()) {
    if (!kernel.supports_tile_trace) continue;
    if (!kernel.architectures.runs_on(testing::device_compute_capability())) continue;
    for (const bool causal : {false, true}) {
      ProblemSpec spec = traced_problem(kernel.name);
      spec.causal = causal;
      const TileTraceReport report = trace_tiles(spec, kernel);
      EXPECT_TRUE(report.matches()) << report.format();
      EXPECT_GT(report.recorded, 0);
      ++traced;
    }
  }
  EXPECT_GT(traced, 0) << "no registered kernel records tile states";
}

// A planted-bug kernel and where its bug must show: the first key tile whose
// recorded state departs and the statistic that does.
struct PlantedBug {
  std::string kernel;
  int64_t key_tile;
  std::string statistic;
};
void PrintTo(const PlantedBug& bug, std::ostream* out) { *out << bug.kernel; }

const PlantedBug kPlantedBugs[] = {
    // The running max stored at the neighbouring row's index after key tile 0.
    {"fa1_scalar_planted_bug", 1, "m"},
    // The rescale of l and O skipped on key tile 1 (block_k 128 at head_dim 64,
    // so seqlen_k 203 gives tiles 0 and 1): m is right, l is not.
    {"fa2_mma_sm80_planted_bug", 1, "l"},
};

class PlantedTileTrace : public ::testing::TestWithParam<PlantedBug> {};

TEST_P(PlantedTileTrace, DiffNamesTheTileAndStatistic) {
  FLASHLAB_REQUIRE_GPU();
  const PlantedBug& bug = GetParam();
  const KernelVariant* planted = find_any_kernel(bug.kernel);
  ASSERT_NE(planted, nullptr);
  if (!planted->architectures.runs_on(testing::device_compute_capability()))
    GTEST_SKIP() << bug.kernel << " does not run on this device";
  const ProblemSpec spec = traced_problem(planted->name);

  // The element diff sees that the output is wrong, but not why.
  const CheckResult elements = check_kernel(spec);
  EXPECT_FALSE(elements.out.passed());
  ASSERT_TRUE(elements.out.first_bad.has_value());
  EXPECT_NE(elements.out.format().find("bad elements span flat indices"), std::string::npos);

  const TileTraceReport report = trace_tiles(spec, *planted);
  ASSERT_TRUE(report.first_difference.has_value()) << report.format();
  EXPECT_EQ(report.first_difference->key_tile, bug.key_tile) << report.format();
  EXPECT_EQ(report.first_difference->statistic, bug.statistic) << report.format();
  EXPECT_NE(report.format().find("every state up to key tile " + std::to_string(bug.key_tile - 1) +
                                 " matches"),
            std::string::npos)
      << report.format();
}

TEST_P(PlantedTileTrace, BugIsInvisibleWithOneKeyTile) {
  FLASHLAB_REQUIRE_GPU();
  const PlantedBug& bug = GetParam();
  const KernelVariant* planted = find_any_kernel(bug.kernel);
  ASSERT_NE(planted, nullptr);
  if (!planted->architectures.runs_on(testing::device_compute_capability()))
    GTEST_SKIP() << bug.kernel << " does not run on this device";
  // With a single key tile the planted code never runs on a visited tile: the
  // bug hides, which is why the test matrix must include seqlens longer than
  // one tile.
  ProblemSpec spec = traced_problem(bug.kernel);
  spec.seqlen_k = 20;
  EXPECT_TRUE(check_kernel(spec).passed());
}

TEST_P(PlantedTileTrace, IsNotRegistered) {
  const PlantedBug& bug = GetParam();
  for (const auto& kernel : registered_kernels()) EXPECT_NE(kernel.name, bug.kernel);
  EXPECT_EQ(find_kernel(bug.kernel), nullptr);
  EXPECT_NE(find_any_kernel(bug.kernel), nullptr);
}

INSTANTIATE_TEST_SUITE_P(TileTrace, PlantedTileTrace, ::testing::ValuesIn(kPlantedBugs),
                         [](const ::testing::TestParamInfo<PlantedBug>& info) {
                           return info.param.kernel;
                         });

}  // namespace
}  // namespace flashlab
