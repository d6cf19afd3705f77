// Coverage floors: how many cases of each matrix (kernel_cases.h) a registered
// kernel must take on a compute capability 9.0 device. A kernel whose
// unsupported_reason grows stricter loses cases silently (the generators only
// emit what the kernel takes); the CPU test CoverageFloors.HoldForEveryRegisteredKernel
// counts them and fails below the floor, and fails for a kernel without one.
#pragma once

#include <string>
#include <vector>

#include "kernel_cases.h"

namespace flashlab::testing {

struct CoverageFloor {
  std::string kernel;
  // Minimum cases per matrix (case_matrices()); -1: not set, which fails.
  int correctness = -1, head_dims = -1, sliding_window = -1, varlen = -1, large_scores = -1,
      properties = -1, sanitizer = -1;
  // The backward matrices (0 for a kernel without a backward pass).
  int backward = -1, backward_head_dims = -1, backward_sliding_window = -1, backward_varlen = -1,
      backward_query_blocks = -1, backward_persistent_grid = -1, backward_masked = -1, backward_determinism = -1, backward_sanitizer = -1;
  int score_modifications = -1, backward_score_modifications = -1;  // softcap / ALiBi / sinks matrices
  int fp8 = -1;  // the e4m3 forward's matrix (0 for a kernel without one)
  int compute_capability = 90;  // the device the counts are taken for

  int of(const std::string& matrix) const;  // -2 for a matrix without a field here
};

const std::vector<CoverageFloor>& coverage_floors();
const CoverageFloor* find_coverage_floor(const std::string& kernel);

// Cases of `kernel` per matrix at the floor's compute capability, and one line
// per matrix where the count is below the floor (empty: the floor holds).
std::vector<std::pair<std::string, int>> coverage_counts(const KernelVariant& kernel,
                                                         int compute_capability = 90);
std::vector<std::string> coverage_shortfalls(const KernelVariant& kernel, const CoverageFloor& floor);
// The table line that would pin today's counts for `kernel`.
std::string coverage_floor_line(const KernelVariant& kernel, int compute_capability = 90);

}  // namespace flashlab::testing
