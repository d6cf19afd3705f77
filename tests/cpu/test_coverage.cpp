// The test matrices' coverage, counted on the CPU from the same generators the
// GPU fixtures and the sanitizer use: every registered kernel keeps its floor of
// cases (an over-strict unsupported_reason cannot shrink coverage unnoticed),
// the sanitizer covers every head dim and 16-bit dtype of every kernel within
// its time budget (and every backward and KV-cache path, with the kernels the
// sanitizer's name filter keeps), and the probed head dims include every one a
// kernel lists.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "coverage_floors.h"
#include "kernel_cases.h"
#include "kvcache_cases.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

TEST(CoverageFloors, HoldForEveryRegisteredKernel) {
  ASSERT_FALSE(registered_kernels().empty());
  for (const auto& kernel : registered_kernels()) {
    const CoverageFloor* floor = find_coverage_floor(kernel.name);
    if (floor == nullptr) {
      ADD_FAILURE() << "kernel " << kernel.name
                    << " has no coverage floor. Add one line to coverage_floors() in "
                       "tests/coverage_floors.cpp, after checking these counts (cases it takes on "
                       "compute capability 9.0) against what the kernel claims to support:\n      "
                    << coverage_floor_line(kernel);
      continue;
    }
    std::cout << "coverage " << coverage_floor_line(kernel, floor->compute_capability) << "\n";
    for (const std::string& shortfall : coverage_shortfalls(kernel, *floor)) ADD_FAILURE() << shortfall;
  }
}

TEST(CoverageFloors, EveryMatrixHasAFloorField) {
  const CoverageFloor floor;
  for (const auto& matrix : case_matrices())
    EXPECT_NE(floor.of(matrix.name), -2) << "add a field for matrix " << matrix.name
                                         << " to CoverageFloor (tests/coverage_floors.h)";
}

// An over-strict copy of each registered kernel: rejects single-row queries on
// top of what the kernel rejects.
std::string (*wrapped_reason)(const AttentionParams&) = nullptr;
std::string reject_single_row(const AttentionParams& params) {
  if (params.seqlen_q == 1) return "rejects seqlen_q 1";
  return wrapped_reason(params);
}

TEST(CoverageFloors, CatchAKernelThatTurnsOverStrict) {
  int checked = 0;
  for (const auto& kernel : registered_kernels()) {
    const CoverageFloor* floor = find_coverage_floor(kernel.name);
    if (floor == nullptr) continue;  // HoldForEveryRegisteredKernel reports it
    EXPECT_TRUE(coverage_shortfalls(kernel, *floor).empty());
    KernelVariant strict = kernel;
    wrapped_reason = kernel.unsupported_reason;
    strict.unsupported_reason = reject_single_row;
    const std::vector<std::string> shortfalls = coverage_shortfalls(strict, *floor);
    ASSERT_FALSE(shortfalls.empty()) << kernel.name << ": dropping seqlen_q 1 went unnoticed";
    EXPECT_NE(shortfalls.front().find("Correctness"), std::string::npos) << shortfalls.front();
    EXPECT_NE(shortfalls.front().find("below its floor"), std::string::npos) << shortfalls.front();
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

// The same for the backward: a copy whose backward rejects single-row queries.
std::string (*wrapped_backward_reason)(const AttentionBackwardParams&) = nullptr;
std::string backward_rejects_single_row(const AttentionBackwardParams& params) {
  if (params.seqlen_q == 1) return "backward rejects seqlen_q 1";
  return wrapped_backward_reason == nullptr ? std::string() : wrapped_backward_reason(params);
}

TEST(CoverageFloors, CatchABackwardThatTurnsOverStrict) {
  int checked = 0;
  for (const auto& kernel : registered_kernels()) {
    const CoverageFloor* floor = find_coverage_floor(kernel.name);
    if (floor == nullptr || kernel.backward_launch == nullptr) continue;
    KernelVariant strict = kernel;
    wrapped_backward_reason = kernel.backward_unsupported_reason;
    strict.backward_unsupported_reason = backward_rejects_single_row;
    const std::vector<std::string> shortfalls = coverage_shortfalls(strict, *floor);
    ASSERT_FALSE(shortfalls.empty()) << kernel.name << ": dropping backward seqlen_q 1 went unnoticed";
    // The forward matrices keep their counts; the backward correctness matrix drops below.
    EXPECT_NE(shortfalls.front().find("BackwardCorrectness"), std::string::npos) << shortfalls.front();
    EXPECT_NE(shortfalls.front().find("below its floor"), std::string::npos) << shortfalls.front();
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no registered kernel has a backward pass";
}

TEST(KernelCases, BackwardCasesAreMarkedAndCoverTheIssuesMatrix) {
  // Every backward matrix marks its cases; together they meet seqlens 1, 7,
  // 113, 1023 (and unequal pairs), causal and not, kv heads 8/2/1, both
  // layouts and both 16-bit dtypes for each kernel with a backward.
  for (const auto& kernel : registered_kernels()) {
    if (kernel.backward_launch == nullptr) continue;
    std::set<int> seqlens, kv_heads;
    std::set<std::string> seen;
    bool unequal = false;
    for (const auto& matrix : case_matrices()) {
      if (matrix.name.rfind("Backward", 0) != 0) continue;
      for (const auto& kernel_case : matrix.generate(0, {kernel})) {
        EXPECT_TRUE(kernel_case.backward) << kernel_case.name;
        const ProblemSpec& spec = kernel_case.spec;
        if (!spec.is_varlen()) seqlens.insert({spec.seqlen_q, spec.seqlen_k});
        unequal |= !spec.is_varlen() && spec.seqlen_q != spec.seqlen_k;
        kv_heads.insert(spec.kv_heads);
        seen.insert(dtype_label(spec.dtype));
        seen.insert(spec.causal ? "causal" : "not causal");
        seen.insert(spec.layout == Layout::packed_qkv ? "packed" : "bshd");
        if (spec.window_left >= 0 || spec.window_right > 0) seen.insert("window");
        if (spec.is_varlen()) seen.insert("varlen");
      }
    }
    for (const int length : {1, 7, 113, 1023}) EXPECT_TRUE(seqlens.count(length)) << kernel.name << " seqlen " << length;
    EXPECT_TRUE(unequal) << kernel.name;
    EXPECT_EQ(kv_heads, (std::set<int>{1, 2, 8})) << kernel.name;
    for (const char* property : {"fp16", "bf16", "causal", "not causal", "packed", "bshd", "window", "varlen"})
      EXPECT_TRUE(seen.count(property)) << kernel.name << " has no backward case with " << property;
  }
  for (const auto& matrix : case_matrices())
    if (matrix.name.rfind("Backward", 0) != 0)
      for (const auto& kernel_case : matrix.generate(0, registered_kernels()))
        EXPECT_FALSE(kernel_case.backward) << matrix.name << ": " << kernel_case.name;
}

TEST(KernelCases, BackwardDeterminismCasesSayHowManyRuns) {
  // Every case at least 10 runs; each kernel with a backward has a 50-run case
  // and the batch-60 stress case.
  std::map<std::string, std::pair<int, int>> fifty_and_stress;
  for (const auto& kernel_case : backward_determinism_cases()) {
    EXPECT_GE(kernel_case.runs, 10) << kernel_case.name;
    auto& [fifty, stress] = fifty_and_stress[kernel_case.kernel];
    fifty += kernel_case.runs == 50;
    stress += kernel_case.spec.batch == 60;
  }
  EXPECT_FALSE(fifty_and_stress.empty());
  for (const auto& [kernel, counts] : fifty_and_stress) {
    EXPECT_GE(counts.first, 1) << kernel << ": no 50-run determinism case";
    EXPECT_GE(counts.second, 1) << kernel << ": no batch-60 stress case";
  }
}

TEST(KernelCases, NamesAreUniqueIdentifiersPerMatrix) {
  const std::regex identifier("[A-Za-z0-9_]+");
  for (const auto& matrix : case_matrices()) {
    std::set<std::string> names;
    for (const auto& kernel_case : matrix.generate(0, registered_kernels())) {
      EXPECT_TRUE(std::regex_match(kernel_case.name, identifier)) << kernel_case.name;
      EXPECT_TRUE(names.insert(kernel_case.name).second) << matrix.name << ": " << kernel_case.name << " twice";
      EXPECT_EQ(kernel_case.spec.kernel, kernel_case.kernel);
    }
    EXPECT_FALSE(names.empty()) << matrix.name;
  }
}

TEST(SanitizerCases, CoverEveryHeadDimAndHalfPrecisionDtypeOfEveryKernel) {
  // Every head dim that is a multiple of 32 (each instantiation; fa1 pads the
  // others up to one of those) in both 16-bit dtypes.
  const std::vector<KernelCase> cases = sanitizer_cases();
  for (const auto& kernel : registered_kernels()) {
    int taken = 0;
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const int head_dim : supported_head_dims(kernel, dtype)) {
        if (head_dim % 32 != 0) continue;
        ++taken;
        const bool covered = std::any_of(cases.begin(), cases.end(), [&](const KernelCase& c) {
          return c.kernel == kernel.name && c.spec.dtype == dtype && c.spec.head_dim == head_dim;
        });
        EXPECT_TRUE(covered) << kernel.name << " " << dtype_label(dtype) << " head_dim " << head_dim
                             << " has no sanitizer case";
      }
    EXPECT_GT(taken, 0) << kernel.name << " takes neither fp16 nor bf16 at any probed head dim";
  }
}

// How big a sanitizer case is: (all query rows) x (all key rows) x heads, an
// upper bound of the scores it computes (varlen: the packed rows).
int64_t score_elements(const ProblemSpec& spec) {
  int64_t query_rows = 0, key_rows = 0;
  if (spec.is_varlen()) {
    for (const int length : spec.seqlens_q) query_rows += length;
    for (const int length : spec.key_seqlens()) key_rows += length;
  } else {
    query_rows = int64_t{spec.batch} * spec.seqlen_q;
    key_rows = int64_t{spec.batch} * spec.seqlen_k;
  }
  return query_rows * key_rows * spec.heads;
}

TEST(SanitizerCases, StayWithinTheTimeBudget) {
  // Every case is one flashlab-run process under each tool (a few seconds
  // each under memcheck, mostly start-up): keep problems tiny and the list
  // short enough for 3 minutes a tool on an H100.
  const std::vector<KernelCase> cases = sanitizer_cases();
  EXPECT_LE(cases.size(), 45u) << "sanitizer runs per tool; trim the shapes or the fp32/varlen extras";
  for (const auto& kernel_case : cases) {
    EXPECT_LE(score_elements(kernel_case.spec), 1 << 18) << kernel_case.name << " is not tiny";
  }
}

TEST(SanitizerCases, ArgumentLinesNameTheProblem) {
  for (const auto& kernel_case : sanitizer_cases()) {
    const std::string line = flashlab_run_arguments(kernel_case.spec);
    EXPECT_EQ(line.rfind("--kernel " + kernel_case.kernel + " ", 0), 0u) << line;
    EXPECT_NE(line.find("--head-dim " + std::to_string(kernel_case.spec.head_dim)), std::string::npos) << line;
    EXPECT_NE(line.find(std::string("--dtype ") + dtype_label(kernel_case.spec.dtype)), std::string::npos) << line;
  }
}

TEST(SanitizerCases, CoverEveryBackwardAtHeadDims64And128AndItsDeterministicMode) {
  // Every kernel with a backward: --backward at head dims 64 and 128 (where its
  // backward takes them), each case tiny, and at least two --deterministic
  // cases (a causal one, and one without a mask: fa3's rotated walks; the
  // head_dim 256 case is one too where the kernel takes it).
  const std::vector<KernelCase> cases = backward_sanitizer_cases();
  int kernels = 0;
  for (const auto& kernel : registered_kernels()) {
    if (kernel.backward_launch == nullptr) {
      for (const auto& kernel_case : cases) EXPECT_NE(kernel_case.kernel, kernel.name) << kernel_case.name;
      continue;
    }
    ++kernels;
    std::set<int> head_dims;
    int deterministic = 0;
    for (const auto& kernel_case : cases) {
      if (kernel_case.kernel != kernel.name) continue;
      EXPECT_TRUE(kernel_case.backward) << kernel_case.name;
      const std::string line = flashlab_run_arguments(kernel_case);
      EXPECT_EQ(line.rfind("--kernel " + kernel.name + " ", 0), 0u) << line;
      EXPECT_NE(line.find(" --backward"), std::string::npos) << line;
      EXPECT_EQ(line.find(" --deterministic") != std::string::npos, kernel_case.deterministic) << line;
      head_dims.insert(kernel_case.spec.head_dim);
      deterministic += kernel_case.deterministic;
    }
    for (const int head_dim : {64, 128}) EXPECT_TRUE(head_dims.count(head_dim)) << kernel.name << " head_dim " << head_dim;
    EXPECT_EQ(deterministic, 2 + static_cast<int>(head_dims.count(256))) << kernel.name << ": --deterministic sanitizer cases";
  }
  EXPECT_GT(kernels, 0) << "no registered kernel has a backward pass";
  // A backward run costs about two or three forward runs under each tool
  // (20 since session 29: the head_dim 256 case of fa2 and fa3, tiny; 23 since
  // session 37: fa3's 80-row query blocks, on every kernel; run_sanitizer.sh's
  // backward budget rose with it; 26 since session 39: more tiles than SMs;
  // 32 since session 41: the same under masks, fa3's tile counter).
  EXPECT_LE(cases.size(), 32u) << "backward sanitizer runs per tool";
  for (const auto& kernel_case : cases) {
    EXPECT_LE(score_elements(kernel_case.spec), 1 << 17) << kernel_case.name << " is not tiny";
  }
}

TEST(SanitizerCases, RunTheAppendSplitAndCombineKernelsOfEveryKvCachePath) {
  // Every kernel with a KV-cache path: a paged case with an empty cache, an
  // append across a page boundary and num_splits > 1, at head_dim 128.
  const std::vector<KvCacheCase> cases = kvcache_sanitizer_cases();
  int kernels = 0;
  for (const auto& kernel : registered_kernels()) {
    if (kernel.kvcache_launch == nullptr) continue;
    ++kernels;
    bool paged_across_a_page = false, contiguous = false;
    for (const auto& kernel_case : cases) {
      if (kernel_case.kernel != kernel.name) continue;
      const KvCacheSpec& spec = kernel_case.spec;
      EXPECT_EQ(spec.invalid_reason(), "") << kernel_case.name;
      EXPECT_EQ(spec.head_dim, 128) << kernel_case.name;
      EXPECT_GT(spec.num_splits, 1) << kernel_case.name << ": the combine kernel must run";
      EXPECT_GT(spec.seqlen_new, 0) << kernel_case.name << ": the append kernel must run";
      EXPECT_LE(int64_t{spec.batch} * spec.heads * spec.seqlen_q * spec.resolved_capacity(), 1 << 16)
          << kernel_case.name << " is not tiny";
      const std::string line = kvcache_run_arguments(spec);
      EXPECT_EQ(line.rfind("--kvcache --kernel " + kernel.name + " ", 0), 0u) << line;
      EXPECT_NE(line.find(" --num-splits " + std::to_string(spec.num_splits)), std::string::npos) << line;
      const bool empty = std::count(spec.cache_seqlens.begin(), spec.cache_seqlens.end(), 0) > 0;
      bool crosses = false;
      for (const int length : spec.cache_seqlens)
        crosses |= spec.paged() && length / spec.page_size != (length + spec.seqlen_new - 1) / spec.page_size;
      paged_across_a_page |= spec.paged() && empty && crosses;
      contiguous |= !spec.paged();
    }
    EXPECT_TRUE(paged_across_a_page) << kernel.name << ": no paged sanitizer case with an empty cache and an "
                                                       "append across a page boundary";
    EXPECT_TRUE(contiguous) << kernel.name << ": no contiguous KV-cache sanitizer case";
  }
  EXPECT_GT(kernels, 0) << "no registered kernel has a KV-cache path";
  EXPECT_LE(cases.size(), 6u) << "KV-cache sanitizer runs per tool";
}

TEST(SanitizerCases, KernelsLiveInTheNamespaceTheKernelNameFilterKeeps) {
  // run_sanitizer.sh instruments only kernels whose names hold "flashlab"
  // (--kernel-name kns=flashlab): every __global__ in src/kernels must sit inside
  // namespace flashlab, or its runs would pass with nothing checked.
  const std::filesystem::path root = std::filesystem::path(FLASHLAB_SOURCE_DIR) / "src" / "kernels";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  int kernels = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const std::string extension = entry.path().extension().string();
    if (extension != ".cu" && extension != ".cuh" && extension != ".in") continue;
    std::ifstream file(entry.path());
    const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    const size_t opened = text.find("namespace flashlab");
    for (size_t at = text.find("__global__"); at != std::string::npos; at = text.find("__global__", at + 1)) {
      // Skip mentions in comments: the line up to the word has no "//".
      const size_t line_start = text.rfind('\n', at) + 1;
      if (text.substr(line_start, at - line_start).find("//") != std::string::npos) continue;
      ++kernels;
      EXPECT_TRUE(opened != std::string::npos && opened < at)
          << entry.path() << ": a __global__ outside namespace flashlab at offset " << at
          << "; compute-sanitizer's --kernel-name kns=flashlab would skip it";
    }
  }
  EXPECT_GE(kernels, 9) << "the forward, backward and KV-cache kernels";
}

TEST(ProbeHeadDims, IncludeEveryHeadDimOfAKernelWithAList) {
  // A kernel that takes a short list of head dims must have each of them
  // probed, or the matrices and the sanitizer would never see it. Kernels that
  // take a whole range (fa1_scalar: 1 to 128) are probed at representatives.
  const std::vector<int>& probed = probe_head_dims();
  for (const auto& kernel : registered_kernels())
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      std::vector<int> taken;
      for (int head_dim = 1; head_dim <= 512; ++head_dim) {
        ProblemSpec spec;
        spec.kernel = kernel.name;
        spec.batch = 1, spec.heads = 2, spec.kv_heads = 1, spec.seqlen_q = 113, spec.seqlen_k = 203;
        spec.head_dim = head_dim;
        spec.dtype = dtype;
        if (unsupported_reason(kernel, spec).empty()) taken.push_back(head_dim);
      }
      if (taken.size() > 32) continue;  // a range
      for (const int head_dim : taken)
        EXPECT_NE(std::find(probed.begin(), probed.end(), head_dim), probed.end())
            << kernel.name << " takes head_dim " << head_dim << " (" << dtype_label(dtype)
            << "): add it to probe_head_dims() in tests/kernel_cases.cpp";
    }
}

}  // namespace
}  // namespace flashlab::testing
