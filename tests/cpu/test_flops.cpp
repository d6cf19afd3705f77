// The benchmark's FLOP counts per direction and its --direction names.
#include <gtest/gtest.h>

#include "flashlab/harness/arguments.h"
#include "flashlab/harness/flops.h"

namespace flashlab {
namespace {

ProblemSpec bench_spec(bool causal) {
  ProblemSpec spec;
  spec.batch = 8, spec.heads = 16, spec.kv_heads = 16;
  spec.seqlen_q = spec.seqlen_k = 4096;
  spec.head_dim = 128;
  spec.causal = causal;
  return spec;
}

TEST(Flops, ForwardIsTwoMatmulsHalvedWhenCausal) {
  const double full = 4.0 * 8 * 16 * 4096.0 * 4096.0 * 128;
  EXPECT_DOUBLE_EQ(attention_flops(bench_spec(false)), full);
  EXPECT_DOUBLE_EQ(attention_flops(bench_spec(false), Direction::forward), full);
  EXPECT_DOUBLE_EQ(attention_flops(bench_spec(true)), full / 2);
}

TEST(Flops, BackwardIsTwoAndAHalfForwardsAndBothAreThreeAndAHalf) {
  for (const bool causal : {false, true}) {
    const double forward = attention_flops(bench_spec(causal));
    EXPECT_DOUBLE_EQ(attention_flops(bench_spec(causal), Direction::backward), 2.5 * forward);
    EXPECT_DOUBLE_EQ(attention_flops(bench_spec(causal), Direction::forward_backward), 3.5 * forward);
  }
}

TEST(Flops, DirectionNamesParseBack) {
  for (const auto& [name, direction] : direction_choices()) {
    EXPECT_EQ(direction_name(direction), name);
    EXPECT_EQ(parse_choice("--direction", name, direction_choices()), direction);
  }
  EXPECT_EQ(direction_choices().size(), 3u);
  try {
    parse_choice("--direction", "sideways", direction_choices());
    ADD_FAILURE() << "expected an ArgumentError";
  } catch (const ArgumentError& error) {
    EXPECT_STREQ(error.what(), "unknown --direction 'sideways'; accepted: fwd, bwd, fwdbwd");
  }
}

}  // namespace
}  // namespace flashlab
