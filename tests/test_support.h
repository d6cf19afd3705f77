#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/harness/problem.h"
#include "kernel_cases.h"

// GPU tests start with this: without a usable device they are reported
// skipped, with the reason, instead of passing without checking anything.
#define FLASHLAB_REQUIRE_GPU()                                                   \
  do {                                                                           \
    const std::string flashlab_reason_ = ::flashlab::cuda_unavailable_reason(); \
    if (!flashlab_reason_.empty()) GTEST_SKIP() << flashlab_reason_;            \
  } while (0)

namespace flashlab::testing {

// A float64 problem for the reference's CPU tests: q (batch, seqlen_q,
// heads, head_dim), k and v (batch, seqlen_k, kv_heads, head_dim) and dout
// like q, normal(0, 1) from torch's CPU generator seeded with `seed` (drawn
// in that order), and float64 reference options with the scale and window.
struct ReferenceProblem {
  at::Tensor q, k, v, dout;
  ReferenceOptions options;
};
ReferenceProblem reference_problem(uint64_t seed, int batch, int seqlen_q, int seqlen_k, int heads, int kv_heads,
                                   int head_dim, double softmax_scale, int window_left, int window_right);

// A fresh seed per test run, printed by the test so a failure can be replayed
// (FLASHLAB_TEST_SEED=N pins it).
uint64_t test_seed();

// The seed of one case: the run's seed plus a hash of the case's name, so cases
// differ from each other and a run replays with FLASHLAB_TEST_SEED.
uint64_t case_seed(const std::string& case_name);

// The compute capability of device 0 (90 for sm_90); 0 without a device.
int device_compute_capability();

// Base of the parameterized GPU fixtures (one per property): skips without a
// GPU, or when the case's kernel does not run on this device's architecture
// (the coverage floors count what runs on compute capability 9.0), and hands
// the test the case's spec with its seed.
class KernelCaseTest : public ::testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override;
  ProblemSpec spec_;
};

// The small CPU problem the forward and backward check-steps tests share:
// fa1_scalar, causal fp16 GQA (4 heads over 2), lengths off the tile sizes.
ProblemSpec steps_fixed_length_spec();

// Its varlen form: query lengths {5, 0, 37, 1} (an empty and a one-row
// sequence) over the given key lengths.
ProblemSpec steps_varlen_spec(std::vector<int> seqlens_k);

// A zero-filled CPU tensor, for validation tests that never reach a kernel.
at::Tensor cpu_tensor(at::IntArrayRef shape, at::ScalarType dtype = at::kHalf);

// Strict checks (attention.h, "Values on the device") on or off while it lives.
class StrictChecksScope {
 public:
  explicit StrictChecksScope(bool on) : before_(strict_checks()) { set_strict_checks(on); }
  ~StrictChecksScope() { set_strict_checks(before_); }
  StrictChecksScope(const StrictChecksScope&) = delete;
  StrictChecksScope& operator=(const StrictChecksScope&) = delete;

 private:
  bool before_;
};

// Runs `call` and expects a c10::Error whose message holds every fragment.
void expect_rejected(const std::function<void()>& call, std::initializer_list<std::string> fragments);

}  // namespace flashlab::testing
