// Every registered kernel against the reference, over every forward case matrix
// of kernel_cases.h: odd and unequal seqlens, causal on and off, MHA/GQA/MQA,
// bshd and packed-qkv layouts, each dtype and head dim the kernel takes,
// sliding windows, variable-length batches, scores of magnitude ~1e4. One test
// body; the matrices only generate cases (those each kernel declares support
// for; the coverage floors in coverage_floors.cpp keep that honest).
#include <gtest/gtest.h>

#include "flashlab/harness/problem.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

class Forward : public KernelCaseTest {};

TEST_P(Forward, MatchesReference) {
  const CheckResult result = check_kernel(spec_);
  EXPECT_EQ(result.kernel, GetParam().kernel) << result.format();
  EXPECT_TRUE(result.passed()) << result.format();
  if (GetParam().max_abs_error)
    EXPECT_LT(result.out.max_abs_error, *GetParam().max_abs_error)
        << GetParam().max_abs_error_reason << "\n" << result.format();
}

const auto case_name = [](const auto& info) { return info.param.name; };

INSTANTIATE_TEST_SUITE_P(Correctness, Forward, ::testing::ValuesIn(correctness_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, Forward, ::testing::ValuesIn(head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(SlidingWindow, Forward, ::testing::ValuesIn(window_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Varlen, Forward, ::testing::ValuesIn(varlen_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LargeScores, Forward, ::testing::ValuesIn(large_score_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(ScoreModifications, Forward, ::testing::ValuesIn(score_modification_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Fp8, Forward, ::testing::ValuesIn(fp8_cases()), case_name);

}  // namespace
}  // namespace flashlab::testing
