// The tile-state diff: silent on every kernel that records states, and on the
// planted classic bug it names key tile 1 and the running max, where the
// element diff can only say which elements are wrong.
#include <gtest/gtest.h>

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

TEST(TileTrace, NamesKeyTileOneAndRunningMaxOnThePlantedBug) {
  FLASHLAB_REQUIRE_GPU();
  const KernelVariant* planted = find_any_kernel("fa1_scalar_planted_bug");
  ASSERT_NE(planted, nullptr);
  const ProblemSpec spec = traced_problem(planted->name);

  // The element diff sees that the output is wrong, but not why.
  const CheckResult elements = check_kernel(spec);
  EXPECT_FALSE(elements.out.passed());
  ASSERT_TRUE(elements.out.first_bad.has_value());
  EXPECT_NE(elements.out.format().find("bad elements span flat indices"), std::string::npos);

  const TileTraceReport report = trace_tiles(spec, *planted);
  ASSERT_TRUE(report.first_difference.has_value()) << report.format();
  EXPECT_EQ(report.first_difference->key_tile, 1) << report.format();
  EXPECT_EQ(report.first_difference->statistic, "m") << report.format();
  EXPECT_NE(report.format().find("every state up to key tile 0 matches"), std::string::npos);
}

TEST(TileTrace, PlantedBugIsInvisibleWithOneKeyTile) {
  FLASHLAB_REQUIRE_GPU();
  // With a single key tile the stored max is never read back: the bug hides,
  // which is why the test matrix must include seqlens longer than one tile.
  ProblemSpec spec = traced_problem("fa1_scalar_planted_bug");
  spec.seqlen_k = 20;
  EXPECT_TRUE(check_kernel(spec).passed());
}

TEST(TileTrace, PlantedKernelIsNotRegistered) {
  for (const auto& kernel : registered_kernels()) EXPECT_NE(kernel.name, "fa1_scalar_planted_bug");
  EXPECT_EQ(find_kernel("fa1_scalar_planted_bug"), nullptr);
}

}  // namespace
}  // namespace flashlab
