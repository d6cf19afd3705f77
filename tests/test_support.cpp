#include "test_support.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <utility>

#include "flashlab/harness/backward_check.h"

namespace flashlab::testing {

uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* pinned = std::getenv("FLASHLAB_TEST_SEED")) return static_cast<uint64_t>(std::strtoull(pinned, nullptr, 10));
    return static_cast<uint64_t>(std::random_device{}() % 1000000);
  }();
  return seed;
}

namespace {

// Prints the run's seed once per test process, before any test.
class SeedReport : public ::testing::Environment {
 public:
  void SetUp() override {
    std::cout << "flashlab test seed " << test_seed() << " (FLASHLAB_TEST_SEED=" << test_seed()
              << " replays this run)" << std::endl;
  }
};
[[maybe_unused]] ::testing::Environment* const seed_report =
    ::testing::AddGlobalTestEnvironment(new SeedReport);

}  // namespace

uint64_t case_seed(const std::string& case_name) {
  return test_seed() + std::hash<std::string>{}(case_name) % 1000;
}

int device_compute_capability() {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 10 * major + minor;
}

void KernelCaseTest::SetUp() {
  FLASHLAB_REQUIRE_GPU();
  const KernelCase& kernel_case = GetParam();
  spec_ = kernel_case.spec;
  spec_.seed = case_seed(kernel_case.name);
  const KernelVariant* kernel = find_kernel(kernel_case.kernel);
  ASSERT_NE(kernel, nullptr) << kernel_case.kernel << " is not registered";
  // The generators kept only cases the kernel takes on some device; what is
  // left to ask is whether this device is one of them.
  const std::string reason =
      kernel_case.backward ? backward_unsupported_reason(*kernel, spec_, device_compute_capability())
                           : unsupported_reason(*kernel, spec_, device_compute_capability());
  if (!reason.empty()) GTEST_SKIP() << reason;
}

ReferenceProblem reference_problem(uint64_t seed, int batch, int seqlen_q, int seqlen_k, int heads, int kv_heads,
                                   int head_dim, double softmax_scale, int window_left, int window_right) {
  at::manual_seed(seed);
  ReferenceProblem problem;
  problem.q = at::randn({batch, seqlen_q, heads, head_dim}, at::kDouble);
  problem.k = at::randn({batch, seqlen_k, kv_heads, head_dim}, at::kDouble);
  problem.v = at::randn({batch, seqlen_k, kv_heads, head_dim}, at::kDouble);
  problem.dout = at::randn({batch, seqlen_q, heads, head_dim}, at::kDouble);
  problem.options.softmax_scale = softmax_scale;
  problem.options.window_left = window_left;
  problem.options.window_right = window_right;
  problem.options.compute_dtype = at::kDouble;
  return problem;
}

ProblemSpec steps_fixed_length_spec() {
  ProblemSpec spec;
  spec.kernel = "fa1_scalar";
  spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
  spec.seqlen_q = 37, spec.seqlen_k = 53;
  spec.head_dim = 40;
  spec.dtype = at::kHalf;
  spec.causal = true;
  spec.seed = test_seed();
  return spec;
}

ProblemSpec steps_varlen_spec(std::vector<int> seqlens_k) {
  ProblemSpec spec = steps_fixed_length_spec();
  spec.seqlens_q = {5, 0, 37, 1};
  spec.seqlens_k = std::move(seqlens_k);
  return spec;
}

at::Tensor cpu_tensor(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::zeros(shape, at::TensorOptions().dtype(dtype));
}

void expect_rejected(const std::function<void()>& call, std::initializer_list<std::string> fragments) {
  try {
    call();
  } catch (const c10::Error& error) {
    const std::string message = error.what_without_backtrace();
    for (const auto& fragment : fragments)
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "':\n" << message;
    return;
  }
  ADD_FAILURE() << "expected a c10::Error";
}

}  // namespace flashlab::testing
