#include "coverage_floors.h"

#include <algorithm>
#include <sstream>

namespace flashlab::testing {

// One line per registered kernel: the cases it ran when the line was written,
// counted at compute capability 9.0. Adding a kernel: run flashlab_cpu_tests
// --gtest_filter='CoverageFloors.*'; it prints the line for today's counts.
// Check those against what the kernel claims (dtypes, head dims, masks, varlen)
// before pasting it here; lower a count only with the reason in the commit.
const std::vector<CoverageFloor>& coverage_floors() {
  static const std::vector<CoverageFloor> floors = {
      {.kernel = "fa2_mma_sm80", .correctness = 192, .head_dims = 10, .sliding_window = 30, .varlen = 55, .large_scores = 24, .properties = 2, .sanitizer = 12, .backward = 24, .backward_head_dims = 10, .backward_sliding_window = 10, .backward_varlen = 17, .backward_query_blocks = 8, .backward_persistent_grid = 3, .backward_masked = 7, .backward_determinism = 4, .backward_sanitizer = 5, .score_modifications = 20, .backward_score_modifications = 20, .fp8 = 0},
      {.kernel = "fa3_wgmma_sm90", .correctness = 192, .head_dims = 6, .sliding_window = 30, .varlen = 54, .large_scores = 24, .properties = 2, .sanitizer = 9, .backward = 24, .backward_head_dims = 4, .backward_sliding_window = 10, .backward_varlen = 15, .backward_query_blocks = 8, .backward_persistent_grid = 7, .backward_masked = 7, .backward_determinism = 7, .backward_sanitizer = 5, .score_modifications = 20, .backward_score_modifications = 20, .fp8 = 19},
      {.kernel = "fa1_scalar", .correctness = 288, .head_dims = 14, .sliding_window = 30, .varlen = 78, .large_scores = 24, .properties = 3, .sanitizer = 11, .backward = 26, .backward_head_dims = 14, .backward_sliding_window = 10, .backward_varlen = 16, .backward_query_blocks = 8, .backward_persistent_grid = 2, .backward_masked = 7, .backward_determinism = 4, .backward_sanitizer = 5, .score_modifications = 25, .backward_score_modifications = 25, .fp8 = 0},
  };
  return floors;
}

namespace {

// Each matrix of case_matrices() and its field in CoverageFloor.
struct Field {
  const char* matrix;
  const char* field;
  int CoverageFloor::*member;
};
constexpr Field kFields[] = {
    {"Correctness", "correctness", &CoverageFloor::correctness},
    {"HeadDims", "head_dims", &CoverageFloor::head_dims},
    {"SlidingWindow", "sliding_window", &CoverageFloor::sliding_window},
    {"Varlen", "varlen", &CoverageFloor::varlen},
    {"LargeScores", "large_scores", &CoverageFloor::large_scores},
    {"Properties", "properties", &CoverageFloor::properties},
    {"Sanitizer", "sanitizer", &CoverageFloor::sanitizer},
    {"BackwardCorrectness", "backward", &CoverageFloor::backward},
    {"BackwardHeadDims", "backward_head_dims", &CoverageFloor::backward_head_dims},
    {"BackwardSlidingWindow", "backward_sliding_window", &CoverageFloor::backward_sliding_window},
    {"BackwardVarlen", "backward_varlen", &CoverageFloor::backward_varlen},
    {"BackwardQueryBlocks", "backward_query_blocks", &CoverageFloor::backward_query_blocks},
    {"BackwardPersistentGrid", "backward_persistent_grid", &CoverageFloor::backward_persistent_grid},
    {"BackwardMasked", "backward_masked", &CoverageFloor::backward_masked},
    {"BackwardDeterminism", "backward_determinism", &CoverageFloor::backward_determinism},
    {"BackwardSanitizer", "backward_sanitizer", &CoverageFloor::backward_sanitizer},
    {"ScoreModifications", "score_modifications", &CoverageFloor::score_modifications},
    {"BackwardScoreModifications", "backward_score_modifications", &CoverageFloor::backward_score_modifications},
    {"Fp8", "fp8", &CoverageFloor::fp8},
};

const Field* field_of(const std::string& matrix) {
  for (const Field& field : kFields)
    if (matrix == field.matrix) return &field;
  return nullptr;
}

}  // namespace

int CoverageFloor::of(const std::string& matrix) const {
  const Field* field = field_of(matrix);
  return field == nullptr ? -2 : this->*(field->member);
}

const CoverageFloor* find_coverage_floor(const std::string& kernel) {
  const auto& floors = coverage_floors();
  const auto found = std::find_if(floors.begin(), floors.end(),
                                  [&](const CoverageFloor& floor) { return floor.kernel == kernel; });
  return found == floors.end() ? nullptr : &*found;
}

std::vector<std::pair<std::string, int>> coverage_counts(const KernelVariant& kernel,
                                                         int compute_capability) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& matrix : case_matrices())
    counts.emplace_back(matrix.name,
                        static_cast<int>(matrix.generate(compute_capability, {kernel}).size()));
  return counts;
}

std::vector<std::string> coverage_shortfalls(const KernelVariant& kernel, const CoverageFloor& floor) {
  std::vector<std::string> shortfalls;
  for (const auto& [matrix, count] : coverage_counts(kernel, floor.compute_capability)) {
    const int minimum = floor.of(matrix);
    if (minimum == -2)
      shortfalls.push_back("matrix " + matrix + " has no field in CoverageFloor: add one");
    else if (minimum < 0)
      shortfalls.push_back(kernel.name + ": no floor set for matrix " + matrix + " (it has " +
                           std::to_string(count) + " cases)");
    else if (count < minimum)
      shortfalls.push_back(kernel.name + " takes " + std::to_string(count) + " " + matrix +
                           " cases on compute capability " + std::to_string(floor.compute_capability) +
                           ", below its floor of " + std::to_string(minimum) +
                           ": its unsupported_reason now rejects cases it ran before");
  }
  return shortfalls;
}

std::string coverage_floor_line(const KernelVariant& kernel, int compute_capability) {
  std::ostringstream line;
  line << "{.kernel = \"" << kernel.name << "\"";
  for (const auto& [matrix, count] : coverage_counts(kernel, compute_capability)) {
    const Field* field = field_of(matrix);
    line << ", ." << (field ? field->field : ("<no field for " + matrix + ">").c_str()) << " = " << count;
  }
  if (compute_capability != 90) line << ", .compute_capability = " << compute_capability;
  line << "},";
  return line.str();
}

}  // namespace flashlab::testing
