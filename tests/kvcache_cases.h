// The KV-cache test matrices, generated from the registry like kernel_cases.h:
// every registered kernel whose kvcache_launch is set gets each case its
// kvcache_unsupported_reason accepts. Read by the GPU fixtures
// (tests/gpu/test_kvcache.cpp) and the CPU coverage test. No GoogleTest here.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "flashlab/harness/kvcache_check.h"
#include "kernel_cases.h"

namespace flashlab::testing {

struct KvCacheCase {
  std::string name;  // the GoogleTest parameter name: kernel first, then the problem
  std::string kernel;
  KvCacheSpec spec;  // spec.kernel == kernel; spec.seed is set by the test
};
void PrintTo(const KvCacheCase& kernel_case, std::ostream* stream);

using KvCacheCaseGenerator = std::vector<KvCacheCase> (*)(int compute_capability, const Kernels& kernels);

// Against the reference (check_kvcache): per-sequence cache lengths 0, 1, 7,
// 113, 1023, 4097 and the full capacity; seqlen_q 1 and 4; GQA 32/8, MQA and
// MHA; head dims 64, 128, 256; fp16 and bf16; causal and not; a sliding
// window; contiguous and paged (pages of 16 and 256) caches; appends of 0, 1
// and 4 rows; caches without cache_seqlens (full).
std::vector<KvCacheCase> kvcache_reference_cases(int compute_capability = 0,
                                                 const Kernels& kernels = registered_kernels());
// Paged specs whose contiguous twin (page_size 0, same capacity and seed) must
// give bitwise the same out, lse and cache rows.
std::vector<KvCacheCase> kvcache_layout_cases(int compute_capability = 0,
                                              const Kernels& kernels = registered_kernels());
// One problem per case run at every split count of kvcache_split_counts.
std::vector<KvCacheCase> kvcache_split_cases(int compute_capability = 0,
                                             const Kernels& kernels = registered_kernels());
// Appends: one row, rows across page boundaries, more rows than a page, into
// an empty cache and up to the capacity.
std::vector<KvCacheCase> kvcache_append_cases(int compute_capability = 0,
                                              const Kernels& kernels = registered_kernels());

// score modifications on the KV-cache path: each one, paged with 3 splits and
// contiguous in one
std::vector<KvCacheCase> kvcache_modification_cases(int compute_capability = 0,
                                                    const Kernels& kernels = registered_kernels());
// compute-sanitizer over the KV-cache path (flashlab-run --kvcache): small
// problems, head_dim 128, ragged lengths with an empty cache, appends (one
// across a page boundary, one filling the cache) and num_splits > 1, so the
// append, split and combine kernels all run; paged (pages of 16) and contiguous.
std::vector<KvCacheCase> kvcache_sanitizer_cases(int compute_capability = 0,
                                                 const Kernels& kernels = registered_kernels());

struct KvCacheCaseMatrix {
  std::string name;  // also the GoogleTest instantiation name
  KvCacheCaseGenerator generate;
};
const std::vector<KvCacheCaseMatrix>& kvcache_case_matrices();

// 1 to 16, then 24, 32, 48, 64, 96, 128, ... below max_splits, and max_splits.
std::vector<int> kvcache_split_counts(int max_splits);

// flashlab-run options that give the spec (no seed).
std::string kvcache_run_arguments(const KvCacheSpec& spec);

}  // namespace flashlab::testing
