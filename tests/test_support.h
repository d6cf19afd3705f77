#pragma once

#include <gtest/gtest.h>

#include <string>

#include "flashlab/problem.h"

// GPU tests start with this: without a usable device they are reported
// skipped, with the reason, instead of passing without checking anything.
#define FLASHLAB_REQUIRE_GPU()                                                   \
  do {                                                                           \
    const std::string flashlab_reason_ = ::flashlab::cuda_unavailable_reason(); \
    if (!flashlab_reason_.empty()) GTEST_SKIP() << flashlab_reason_;            \
  } while (0)

namespace flashlab::testing {

// A fresh seed per test run, printed by the test so a failure can be replayed
// (FLASHLAB_TEST_SEED=N pins it).
uint64_t test_seed();

}  // namespace flashlab::testing
