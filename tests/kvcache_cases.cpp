#include "kvcache_cases.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>
#include <utility>

namespace flashlab::testing {
namespace {

// Cache lengths before the append. "long": 0, odd lengths up to 4097 and the
// capacity (4352 rows: 17 pages of 256, 272 of 16) less the append, so the
// cache is full after it. "short": the same up to 113, capacity 512 (the
// head-dim sweep at 256 stays small).
constexpr int kLongCapacity = 4352, kShortCapacity = 512;
std::vector<int> long_lengths(int seqlen_new) { return {0, 1, 7, 113, 1023, 4097, kLongCapacity - seqlen_new}; }
std::vector<int> short_lengths(int seqlen_new) { return {0, 1, 7, 113, kShortCapacity - seqlen_new}; }

struct Shape {
  std::string label;
  at::ScalarType dtype;
  int head_dim, seqlen_q, heads, kv_heads;
  bool causal;
  int page_size, seqlen_new;
  bool long_cache;
  int window_left = -1, window_right = -1;
};

KvCacheSpec spec_of(const Shape& shape) {
  KvCacheSpec spec;
  spec.heads = shape.heads, spec.kv_heads = shape.kv_heads;
  spec.seqlen_q = shape.seqlen_q, spec.head_dim = shape.head_dim;
  spec.dtype = shape.dtype;
  spec.causal = shape.causal;
  spec.window_left = shape.window_left, spec.window_right = shape.window_right;
  spec.page_size = shape.page_size;
  spec.seqlen_new = shape.seqlen_new;
  spec.cache_seqlens = shape.long_cache ? long_lengths(shape.seqlen_new) : short_lengths(shape.seqlen_new);
  spec.batch = static_cast<int>(spec.cache_seqlens.size());
  spec.capacity = shape.long_cache ? kLongCapacity : kShortCapacity;
  return spec;
}

// Adds `<kernel>_<label>` when the kernel has a KV-cache path that takes the
// spec on a device of this compute capability (0: some device).
void add_if_supported(std::vector<KvCacheCase>& cases, const KernelVariant& kernel, const std::string& label,
                      KvCacheSpec spec, int compute_capability) {
  if (kernel.kvcache_launch == nullptr) return;
  spec.kernel = kernel.name;
  if (!kvcache_unsupported_reason(kernel, spec, compute_capability).empty()) return;
  cases.push_back({kernel.name + "_" + label, kernel.name, std::move(spec)});
}

}  // namespace

void PrintTo(const KvCacheCase& kernel_case, std::ostream* stream) {
  *stream << kernel_case.kernel << ": " << kernel_case.spec.describe();
}

std::vector<KvCacheCase> kvcache_reference_cases(int compute_capability, const Kernels& kernels) {
  const auto fp16 = at::kHalf, bf16 = at::kBFloat16;
  // label, dtype, head_dim, seqlen_q, heads, kv_heads, causal, page_size, seqlen_new, long cache, window
  const std::vector<Shape> shapes = {
      {"fp16_d64_q1_h32_8_contiguous", fp16, 64, 1, 32, 8, false, 0, 0, true},
      {"bf16_d64_q4_h32_8_causal_paged256_new4", bf16, 64, 4, 32, 8, true, 256, 4, true},
      {"bf16_d64_q4_h32_8_contiguous_new1", bf16, 64, 4, 32, 8, false, 0, 1, true},
      {"fp16_d128_q4_h32_8_causal_paged16_new1", fp16, 128, 4, 32, 8, true, 16, 1, true},
      {"bf16_d128_q1_h32_8_contiguous_new1", bf16, 128, 1, 32, 8, false, 0, 1, true},
      {"fp16_d256_q1_h32_8_paged256", fp16, 256, 1, 32, 8, false, 256, 0, false},
      {"bf16_d256_q4_h32_8_causal_contiguous_new4", bf16, 256, 4, 32, 8, true, 0, 4, false},
      {"bf16_d128_q4_h16_1_causal_paged256_new1", bf16, 128, 4, 16, 1, true, 256, 1, true},
      {"fp16_d64_q1_h8_1_contiguous", fp16, 64, 1, 8, 1, false, 0, 0, true},
      {"bf16_d128_q1_h8_8_paged16_new1", bf16, 128, 1, 8, 8, false, 16, 1, true},
      {"fp16_d128_q4_h32_8_window1000_0_paged256_new4", fp16, 128, 4, 32, 8, false, 256, 4, true, 1000, 0},
  };
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels) {
    for (const Shape& shape : shapes) add_if_supported(cases, kernel, shape.label, spec_of(shape), compute_capability);
    // No cache_seqlens: every sequence attends to its whole cache.
    for (const int page_size : {0, 16}) {
      KvCacheSpec full;
      full.batch = 3, full.heads = 32, full.kv_heads = 8;
      full.seqlen_q = 1, full.head_dim = 128;
      full.dtype = page_size == 0 ? fp16 : bf16;
      full.capacity = page_size == 0 ? 1023 : 1024;
      full.page_size = page_size;
      add_if_supported(cases, kernel,
                       std::string(dtype_label(full.dtype)) + "_d128_q1_h32_8_full_" +
                           (page_size == 0 ? "contiguous1023" : "paged16"),
                       full, compute_capability);
    }
    // 20 sequences x 8 kv heads: a block for every multiprocessor at one split,
    // on a short cache, so fa2_mma_sm80 takes its wide tiling (kvcache_tiling).
    KvCacheSpec many = spec_of({"", bf16, 128, 1, 32, 8, false, 0, 1, false});
    const std::vector<int> lengths = many.cache_seqlens;
    many.cache_seqlens.clear();
    for (int i = 0; i < 20; ++i) many.cache_seqlens.push_back(lengths[i % lengths.size()]);
    many.batch = 20;
    add_if_supported(cases, kernel, "bf16_d128_q1_h32_8_batch20_contiguous_new1", many, compute_capability);
    // 8 sequences x 8 kv heads: half the multiprocessors of an H100 hold enough
    // in flight for one split, so fa2_mma_sm80 takes its deep tiling.
    KvCacheSpec half = many;
    half.cache_seqlens.resize(8);
    half.batch = 8;
    add_if_supported(cases, kernel, "bf16_d128_q1_h32_8_batch8_contiguous_new1", half, compute_capability);
  }
  return cases;
}

std::vector<KvCacheCase> kvcache_layout_cases(int compute_capability, const Kernels& kernels) {
  const std::vector<Shape> shapes = {
      {"bf16_d128_q1_h32_8_paged256_new1", at::kBFloat16, 128, 1, 32, 8, false, 256, 1, true},
      {"fp16_d64_q4_h32_8_causal_paged16_new4_splits3", at::kHalf, 64, 4, 32, 8, true, 16, 4, true},
      {"bf16_d256_q1_h16_1_paged256", at::kBFloat16, 256, 1, 16, 1, false, 256, 0, false},
  };
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels)
    for (const Shape& shape : shapes) {
      KvCacheSpec spec = spec_of(shape);
      if (shape.label.find("splits3") != std::string::npos) spec.num_splits = 3;
      // The contiguous twin must be taken too.
      KvCacheSpec contiguous = spec;
      contiguous.page_size = 0;
      contiguous.kernel = kernel.name;
      if (kernel.kvcache_launch == nullptr ||
          !kvcache_unsupported_reason(kernel, contiguous, compute_capability).empty())
        continue;
      add_if_supported(cases, kernel, shape.label, spec, compute_capability);
    }
  return cases;
}

std::vector<KvCacheCase> kvcache_split_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels) {
    KvCacheSpec paged = spec_of({"", at::kHalf, 128, 1, 32, 8, false, 256, 1, true});
    paged.cache_seqlens = {0, 1, 113, 1023, 4097};
    paged.batch = 5;
    add_if_supported(cases, kernel, "fp16_d128_q1_h32_8_paged256_new1", paged, compute_capability);
    KvCacheSpec causal = spec_of({"", at::kBFloat16, 64, 4, 32, 8, true, 0, 4, true});
    causal.cache_seqlens = {7, 4097};
    causal.batch = 2;
    add_if_supported(cases, kernel, "bf16_d64_q4_h32_8_causal_contiguous_new4", causal, compute_capability);
  }
  return cases;
}

std::vector<KvCacheCase> kvcache_append_cases(int compute_capability, const Kernels& kernels) {
  struct Append {
    std::string label;
    Shape shape;
    std::vector<int> lengths;
    int capacity;
  };
  const std::vector<Append> appends = {
      // One row into an empty cache, mid-cache and into the last free row.
      {"fp16_d128_q1_h32_8_contiguous_new1", {"", at::kHalf, 128, 1, 32, 8, false, 0, 1, false}, {0, 5, 113, 255}, 256},
      // Four rows across page boundaries (254 + 4 and 508 + 4 cross a page of 256), to the capacity.
      {"bf16_d64_q4_h32_8_causal_paged256_new4", {"", at::kBFloat16, 64, 4, 32, 8, true, 256, 4, false}, {254, 0, 508, 1020}, 1024},
      // More rows than a page of 16 (33 rows span three or four pages), MQA.
      {"fp16_d64_q1_h8_1_paged16_new33", {"", at::kHalf, 64, 1, 8, 1, false, 16, 33, false}, {0, 15, 100, 127}, 160},
      // seqlen_new != seqlen_q, an odd capacity filled exactly.
      {"bf16_d256_q1_h16_4_contiguous_new7", {"", at::kBFloat16, 256, 1, 16, 4, false, 0, 7, false}, {1, 1016}, 1023},
  };
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels)
    for (const Append& append : appends) {
      KvCacheSpec spec = spec_of(append.shape);
      spec.cache_seqlens = append.lengths;
      spec.batch = static_cast<int>(append.lengths.size());
      spec.capacity = append.capacity;
      add_if_supported(cases, kernel, append.label, spec, compute_capability);
    }
  return cases;
}

std::vector<KvCacheCase> kvcache_sanitizer_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels) {
    // Paged: 14 + 3 rows cross the first page boundary; 2 causal query rows
    // against 8/2 heads; 3 splits of each sequence's keys (the empty one's too).
    KvCacheSpec paged = spec_of({"", at::kBFloat16, 128, 2, 8, 2, true, 16, 3, false});
    paged.cache_seqlens = {0, 14, 300};
    paged.batch = 3;
    paged.capacity = 512;
    paged.num_splits = 3;
    add_if_supported(cases, kernel, "bf16_d128_q2_h8_2_causal_paged16_new3_splits3", paged, compute_capability);
    // Contiguous: one row appended into the last free row of a 256-row cache, 2 splits.
    KvCacheSpec contiguous = spec_of({"", at::kHalf, 128, 1, 8, 2, false, 0, 1, false});
    contiguous.cache_seqlens = {255, 0, 7};
    contiguous.batch = 3;
    contiguous.capacity = 256;
    contiguous.num_splits = 2;
    contiguous.softcap = 1.5, contiguous.alibi = ProblemSpec::Alibi::per_batch, contiguous.sinks = true;
    add_if_supported(cases, kernel, "fp16_d128_q1_h8_2_contiguous_new1_splits2_softcap_alibi_sinks", contiguous,
                     compute_capability);
    // 8 sequences x 8 kv heads on a short cache: fa2_mma_sm80's deep tiling
    // (chosen from the shape; the heuristic would take one split), 2 splits.
    KvCacheSpec deep = spec_of({"", at::kBFloat16, 128, 1, 32, 8, false, 0, 1, false});
    deep.cache_seqlens = {255, 0, 7, 113, 200, 1, 64, 130};
    deep.batch = 8;
    deep.capacity = 256;
    deep.num_splits = 2;
    add_if_supported(cases, kernel, "bf16_d128_q1_h32_8_contiguous_new1_batch8_splits2", deep, compute_capability);
  }
  return cases;
}

std::vector<KvCacheCase> kvcache_modification_cases(int compute_capability, const Kernels& kernels) {
  // Each modification (score_modifications: ALiBi per batch entry is per
  // sequence here) on a paged cache with an append across a page boundary and
  // 3 splits (the sink joins once, in the combine), and on a contiguous one in
  // one split (the split kernel adds it); causal, GQA, an empty sequence.
  std::vector<KvCacheCase> cases;
  for (const auto& kernel : kernels)
    for (const ScoreModificationCase& m : score_modifications())
      for (const bool paged : {true, false}) {
        KvCacheSpec spec = spec_of({"", paged ? at::kBFloat16 : at::kHalf, 128, 2, 8, 2, true, paged ? 16 : 0, 3, false});
        spec.cache_seqlens = {0, 14, 300};
        spec.batch = 3;
        spec.capacity = 512;
        spec.num_splits = paged ? 3 : 1;
        m.apply(spec);
        add_if_supported(cases, kernel,
                         std::string(m.label) + (paged ? "_bf16_paged16_splits3" : "_fp16_contiguous_splits1") +
                             "_d128_q2_h8_2_causal_new3",
                         spec, compute_capability);
      }
  return cases;
}

const std::vector<KvCacheCaseMatrix>& kvcache_case_matrices() {
  static const std::vector<KvCacheCaseMatrix> matrices = {
      {"KvCacheReference", kvcache_reference_cases},
      {"KvCacheLayouts", kvcache_layout_cases},
      {"KvCacheSplits", kvcache_split_cases},
      {"KvCacheAppend", kvcache_append_cases},
      {"KvCacheSanitizer", kvcache_sanitizer_cases},
      {"KvCacheScoreModifications", kvcache_modification_cases},
  };
  return matrices;
}

std::vector<int> kvcache_split_counts(int max_splits) {
  std::vector<int> counts;
  for (int splits = 1; splits <= std::min(16, max_splits); ++splits) counts.push_back(splits);
  for (int splits = 24; splits < max_splits; splits = splits % 3 == 0 ? splits * 4 / 3 : splits * 3 / 2)
    counts.push_back(splits);  // 24, 32, 48, 64, 96, 128, ...
  if (max_splits > 16) counts.push_back(max_splits);
  return counts;
}

std::string kvcache_run_arguments(const KvCacheSpec& spec) {
  std::ostringstream text;
  text << "--kvcache --kernel " << spec.kernel << " --batch " << spec.batch << " --heads " << spec.heads
       << " --kv-heads " << spec.kv_heads << " --seqlen-q " << spec.seqlen_q << " --seqlen-k "
       << spec.resolved_capacity() << " --head-dim " << spec.head_dim << " --dtype " << dtype_label(spec.dtype);
  // A full cache (no cache_seqlens) as lengths equal to the capacity: the same keys.
  text << " --cache-seqlens ";
  if (spec.cache_seqlens.empty()) text << spec.resolved_capacity();
  for (size_t index = 0; index < spec.cache_seqlens.size(); ++index)
    text << (index == 0 ? "" : ",") << spec.cache_seqlens[index];
  if (spec.page_size > 0) text << " --page-size " << spec.page_size;
  if (spec.seqlen_new > 0) text << " --append " << spec.seqlen_new;
  if (spec.num_splits > 0) text << " --num-splits " << spec.num_splits;
  if (spec.causal) text << " --causal";
  if (spec.window_left >= 0) text << " --window-left " << spec.window_left;
  if (spec.window_right >= 0) text << " --window-right " << spec.window_right;
  if (spec.softmax_scale) text << " --softmax-scale " << *spec.softmax_scale;
  if (spec.cpu_reference) text << " --cpu-reference";
  if (spec.softcap != 0.0) text << " --softcap " << spec.softcap;
  if (spec.alibi != ProblemSpec::Alibi::none)
    text << " --alibi " << (spec.alibi == ProblemSpec::Alibi::per_head ? "per-head" : "per-batch");
  if (spec.sinks) text << " --sinks";
  return text.str();
}

}  // namespace flashlab::testing
