// The KV-cache matrices are not empty by accident: some registered kernel has a
// KV-cache path, and each such kernel takes at least its floor of cases in
// every matrix on compute capability 9.0 and 8.0 (the generators drop what a
// kernel rejects, so a stricter kvcache_unsupported_reason would otherwise
// shrink the GPU tests silently). Also the split counts the split test walks.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "kvcache_cases.h"

namespace flashlab::testing {
namespace {

// Cases each kernel with a KV-cache path must take, per matrix. A kernel that
// gains the path fails here until it has a line (the message gives its counts).
const std::map<std::string, std::map<std::string, int>>& kvcache_floors() {
  static const std::map<std::string, std::map<std::string, int>> floors = {
      {"fa2_mma_sm80", {{"KvCacheReference", 14}, {"KvCacheLayouts", 3}, {"KvCacheSplits", 2}, {"KvCacheAppend", 4}, {"KvCacheSanitizer", 2}, {"KvCacheScoreModifications", 10}}},
  };
  return floors;
}

TEST(KvCacheCoverage, SomeRegisteredKernelHasAKvCachePath) {
  int kernels = 0;
  for (const auto& kernel : registered_kernels()) kernels += kernel.kvcache_launch != nullptr;
  EXPECT_GT(kernels, 0) << "no registered kernel sets kvcache_launch: the KV-cache GPU tests would have no case";
}

TEST(KvCacheCoverage, EveryKvCacheKernelMeetsItsFloors) {
  for (const auto& kernel : registered_kernels()) {
    if (kernel.kvcache_launch == nullptr) continue;
    SCOPED_TRACE(kernel.name);
    std::string counts;
    for (const int capability : {90, 80})
      for (const auto& matrix : kvcache_case_matrices())
        counts += " " + matrix.name + "@" + std::to_string(capability) + "=" +
                  std::to_string(matrix.generate(capability, {kernel}).size());
    const auto floors = kvcache_floors().find(kernel.name);
    ASSERT_NE(floors, kvcache_floors().end()) << kernel.name << " has no KV-cache floor line; its counts:" << counts;
    for (const int capability : {90, 80})
      for (const auto& matrix : kvcache_case_matrices()) {
        const auto floor = floors->second.find(matrix.name);
        ASSERT_NE(floor, floors->second.end()) << "no floor for " << matrix.name;
        EXPECT_GE(static_cast<int>(matrix.generate(capability, {kernel}).size()), floor->second)
            << matrix.name << " on compute capability " << capability << "; counts:" << counts;
      }
  }
}

TEST(KvCacheCoverage, CaseNamesAreUniqueAndSpecsValid) {
  for (const auto& matrix : kvcache_case_matrices()) {
    std::map<std::string, int> names;
    for (const auto& kernel_case : matrix.generate(0, registered_kernels())) {
      EXPECT_EQ(++names[kernel_case.name], 1) << matrix.name << ": " << kernel_case.name << " twice";
      EXPECT_EQ(kernel_case.spec.invalid_reason(), "") << kernel_case.name;
      EXPECT_EQ(kernel_case.spec.kernel, kernel_case.kernel);
    }
  }
}

TEST(KvCacheCoverage, SplitCounts) {
  EXPECT_EQ(kvcache_split_counts(128),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 48, 64, 96, 128}));
  EXPECT_EQ(kvcache_split_counts(20),
            (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 20}));
  EXPECT_EQ(kvcache_split_counts(4), (std::vector<int>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace flashlab::testing
