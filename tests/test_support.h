#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "flashlab/harness/problem.h"

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

// A zero-filled CPU tensor, for validation tests that never reach a kernel.
at::Tensor cpu_tensor(at::IntArrayRef shape, at::ScalarType dtype = at::kHalf);

// Runs `call` and expects a c10::Error whose message holds every fragment.
void expect_rejected(const std::function<void()>& call, std::initializer_list<std::string> fragments);

}  // namespace flashlab::testing
