// Decoding with a KV cache: every registered kernel whose kvcache_launch is
// set, over the matrices of kvcache_cases.h (one fixture per property):
//   KvCache.MatchesReference              out/lse within the forward's pass rule,
//                                         the caches bitwise as expected
//   KvCachePagedAndContiguous.SameOutputBitwise
//                                         a paged cache and its contiguous twin
//                                         (same keys, capacity, splits): bitwise
//                                         equal out, lse and cache rows
//   KvCacheSplits.EverySplitCountMatchesReference
//                                         num_splits 1..16, 24, ..., the maximum
//   KvCacheAppend.WritesExactlyTheNewRows appended rows bitwise k_new/v_new,
//                                         nothing else in either cache written
//   KvCacheTimeline.RecordsEveryBlockOnce the block timeline (--timeline): a
//                                         start and an end for every block of
//                                         the split kernel's grid, on real SMs
//   KvCacheTimeline.WritesNoSlotPastItsCapacity
//                                         blocks past block_timeline_blocks
//                                         leave their slots alone
// and the strict checks of attention_with_kvcache that read values on the host
// (lengths, pages), which come after the device check: a rejected call
// writes nothing.
#include <ATen/ATen.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "flashlab/harness/kvcache_check.h"
#include "kvcache_cases.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

class KvCacheCaseTest : public ::testing::TestWithParam<KvCacheCase> {
 protected:
  void SetUp() override {
    FLASHLAB_REQUIRE_GPU();
    spec_ = GetParam().spec;
    spec_.seed = case_seed(GetParam().name);
    kernel_ = find_kernel(GetParam().kernel);
    ASSERT_NE(kernel_, nullptr) << GetParam().kernel << " is not registered";
    const std::string reason = kvcache_unsupported_reason(*kernel_, spec_, device_compute_capability());
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
  std::string replay() const {
    return "replay: flashlab-run " + kvcache_run_arguments(spec_) + " --seed " + std::to_string(spec_.seed);
  }
  KvCacheSpec spec_;
  const KernelVariant* kernel_ = nullptr;
};

class KvCache : public KvCacheCaseTest {};
class KvCachePagedAndContiguous : public KvCacheCaseTest {};
class KvCacheSplits : public KvCacheCaseTest {};
class KvCacheAppend : public KvCacheCaseTest {};
class KvCacheCpuReference : public KvCacheCaseTest {};
class KvCacheTimeline : public KvCacheCaseTest {};

TEST_P(KvCache, MatchesReference) {
  const KvCacheCheckResult result = check_kvcache(spec_);
  EXPECT_EQ(result.kernel, GetParam().kernel) << result.format();
  EXPECT_TRUE(result.passed()) << replay() << "\n" << result.format();
}

// One call through the check's steps, keeping its tensors.
struct KvCacheRun {
  KvCacheTensors inputs;
  ForwardOutputs outputs;
  KvCacheExpected expected;
  KvCacheComparison comparison;
  int num_splits = 0;
};

KvCacheRun run_steps(const KernelVariant& kernel, const KvCacheSpec& spec) {
  KvCacheRun run;
  run.inputs = make_kvcache_inputs(spec, at::Device(at::kCUDA, 0));
  KvCacheCall call = call_against_reference(spec, run.inputs);
  run.num_splits = kvcache_splits(kernel, call.params);
  run.outputs = std::move(call.outputs);
  run.expected = std::move(call.expected);
  run.comparison = compare_kvcache(spec, run.inputs, run.outputs, run.expected, kvcache_tolerance(spec, run.expected));
  return run;
}

std::string reports(const KvCacheComparison& comparison) {
  return comparison.out.format() + comparison.lse.format() + comparison.k_cache.format() +
         comparison.v_cache.format();
}
bool passed(const KvCacheComparison& c) {
  return c.out.passed() && c.lse.passed() && c.k_cache.passed() && c.v_cache.passed();
}

// Bitwise: the kernel reads the same keys in the same 16-key chunks and splits
// whichever way they are stored, so nothing in its arithmetic may differ.
TEST_P(KvCachePagedAndContiguous, SameOutputBitwise) {
  KvCacheSpec contiguous = spec_;
  contiguous.page_size = 0;
  contiguous.capacity = spec_.resolved_capacity();
  ASSERT_TRUE(spec_.paged());
  const KvCacheRun paged_run = run_steps(*kernel_, spec_);
  const KvCacheRun contiguous_run = run_steps(*kernel_, contiguous);
  EXPECT_TRUE(passed(paged_run.comparison)) << replay() << "\n" << reports(paged_run.comparison);
  EXPECT_TRUE(passed(contiguous_run.comparison)) << "contiguous twin\n" << reports(contiguous_run.comparison);
  ASSERT_EQ(paged_run.num_splits, contiguous_run.num_splits) << "the two layouts should split alike";
  EXPECT_TRUE(at::equal(paged_run.outputs.out, contiguous_run.outputs.out))
      << "out differs, max "
      << (paged_run.outputs.out.to(at::kFloat) - contiguous_run.outputs.out.to(at::kFloat)).abs().max().item<float>()
      << "\n" << replay();
  // -inf (rows without keys) equals -inf; a NaN would already have failed above.
  EXPECT_TRUE(at::equal(paged_run.outputs.lse, contiguous_run.outputs.lse)) << replay();
  const std::vector<int64_t> keys = paged_run.inputs.key_lengths();
  for (int64_t b = 0; b < spec_.batch; ++b) {
    EXPECT_TRUE(at::equal(cache_rows(paged_run.inputs.k_cache, paged_run.inputs.block_table, b, keys[b]),
                          cache_rows(contiguous_run.inputs.k_cache, {}, b, keys[b])))
        << "k rows of sequence " << b;
    EXPECT_TRUE(at::equal(cache_rows(paged_run.inputs.v_cache, paged_run.inputs.block_table, b, keys[b]),
                          cache_rows(contiguous_run.inputs.v_cache, {}, b, keys[b])))
        << "v rows of sequence " << b;
  }
}

TEST_P(KvCacheSplits, EverySplitCountMatchesReference) {
  const KvCacheTensors inputs = make_kvcache_inputs(spec_, at::Device(at::kCUDA, 0));
  const KvCacheParams params = kvcache_params(spec_, inputs);
  const KvCacheTensors before = copy_caches(inputs);
  const KvCacheExpected expected = reference_kvcache(spec_, before, params);
  const ForwardTolerance tolerance = kvcache_tolerance(spec_, expected);
  ASSERT_NE(kernel_->kvcache_max_splits, nullptr);
  const std::vector<int> counts = kvcache_split_counts(kernel_->kvcache_max_splits(params));
  ASSERT_GE(counts.size(), 2u);
  for (const int splits : counts) {
    KvCacheSpec spec = spec_;
    spec.num_splits = splits;
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    // Each call appends again: start every one from the same caches.
    inputs.k_cache.copy_(before.k_cache);
    inputs.v_cache.copy_(before.v_cache);
    const ForwardOutputs outputs = poisoned_kvcache_outputs(spec, inputs);
    run_kvcache(spec, inputs, outputs);
    FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(kvcache_splits(*kernel_, kvcache_params(spec, inputs)), splits);
    const KvCacheComparison comparison = compare_kvcache(spec, inputs, outputs, expected, tolerance);
    EXPECT_TRUE(passed(comparison)) << replay() << " --num-splits " << splits << "\n" << reports(comparison);
  }
}

TEST_P(KvCacheAppend, WritesExactlyTheNewRows) {
  ASSERT_GT(spec_.seqlen_new, 0);
  const KvCacheCheckResult result = check_kvcache(spec_);
  const int64_t appended = int64_t{spec_.batch} * spec_.seqlen_new * spec_.kv_heads * spec_.head_dim;
  for (const CacheComparison* cache : {&result.k_cache, &result.v_cache}) {
    SCOPED_TRACE(cache->name);
    EXPECT_EQ(cache->appended_elements, appended);
    EXPECT_EQ(cache->appended_differing, 0) << replay() << "\n" << cache->format();
    EXPECT_EQ(cache->other_differing, 0) << replay() << "\n" << cache->format();
  }
  EXPECT_TRUE(result.out.passed() && result.lse.passed()) << replay() << "\n" << result.format();
}

// The KV-cache racecheck runs take their references from the CPU
// (--cpu-reference): they must be the device's, so a clean racecheck run checks
// what the GPU run checks. The caches bitwise, the float32 output and LSE to
// float32 rounding (the matmuls sum in another order), and the check passes.
TEST_P(KvCacheCpuReference, MatchesTheDeviceReference) {
  const KvCacheTensors inputs = make_kvcache_inputs(spec_, at::Device(at::kCUDA, 0));
  const KvCacheParams params = kvcache_params(spec_, inputs);
  const KvCacheTensors before = copy_caches(inputs);
  KvCacheSpec on_cpu = spec_;
  on_cpu.cpu_reference = true;
  const KvCacheExpected device = reference_kvcache(spec_, before, params);
  const KvCacheExpected host = reference_kvcache(on_cpu, before, params);
  ASSERT_EQ(host.reference.output.out.device(), device.reference.output.out.device());
  // Rows past a sequence's keys hold NaN (never read): equal as NaN on both sides.
  const auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return at::equal(at::isnan(a), at::isnan(b)) && at::equal(a.nan_to_num(0), b.nan_to_num(0));
  };
  EXPECT_TRUE(same(host.reference.k_cache, device.reference.k_cache));
  EXPECT_TRUE(same(host.reference.v_cache, device.reference.v_cache));
  EXPECT_TRUE(at::equal(host.reference.appended, device.reference.appended));
  const auto max_difference = [](const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor finite = at::isfinite(b);
    return at::where(finite, a - b, at::zeros_like(a)).abs().max().item<double>();
  };
  EXPECT_LE(max_difference(host.reference.output.out, device.reference.output.out), 1e-5);
  EXPECT_LE(max_difference(host.reference.output.lse, device.reference.output.lse), 1e-5);
  // Rows without keys: -inf on both.
  EXPECT_TRUE(at::equal(at::isfinite(host.reference.output.lse), at::isfinite(device.reference.output.lse)));
  const KvCacheCheckResult result = check_kvcache(on_cpu);
  EXPECT_TRUE(result.passed()) << "replay: flashlab-run " << kvcache_run_arguments(on_cpu) << " --seed "
                               << on_cpu.seed << "\n" << result.format();
}

TEST_P(KvCacheTimeline, RecordsEveryBlockOnce) {
  if (!kernel_->supports_block_timeline) GTEST_SKIP() << kernel_->name << " records no block timeline";
  CheckOptions options;
  options.block_timeline = true;
  const KvCacheCheckResult result = check_kvcache(spec_, options);
  ASSERT_TRUE(result.block_timeline.has_value());
  const BlockTimeline& timeline = *result.block_timeline;
  EXPECT_EQ(timeline.grid_blocks, kvcache_grid_blocks(spec_, result.num_splits, result.tiles));
  EXPECT_EQ(static_cast<int64_t>(timeline.records.size()), timeline.grid_blocks) << "blocks that wrote no start";
  EXPECT_EQ(timeline.blocks_without_end, 0);
  for (const BlockRecord& record : timeline.records) {
    SCOPED_TRACE("block " + std::to_string(record.block));
    EXPECT_GE(record.start_us, 0.0);
    EXPECT_GE(record.end_us, record.start_us);
    EXPECT_GE(record.sm, 0);
    EXPECT_LT(record.sm, timeline.sm_count);
  }
  const BlockTimelineSummary summary = summarize_block_timeline(timeline);
  EXPECT_GT(summary.busy_fraction, 0.0);
  EXPECT_LE(summary.busy_fraction, 1.0);
  EXPECT_TRUE(result.passed()) << replay() << " --timeline\n" << result.format();
}

TEST_P(KvCacheTimeline, WritesNoSlotPastItsCapacity) {
  if (!kernel_->supports_block_timeline) GTEST_SKIP() << kernel_->name << " records no block timeline";
  const KvCacheTensors inputs = make_kvcache_inputs(spec_, at::Device(at::kCUDA, 0));
  const ForwardOutputs outputs = poisoned_kvcache_outputs(spec_, inputs);
  KvCacheParams params = kvcache_params(spec_, inputs, outputs.out, outputs.lse);
  const int64_t grid = kvcache_grid_blocks(spec_, kvcache_splits(*kernel_, params), kernel_->kvcache_tile_shape(params));
  const int64_t capacity = grid / 2;
  // -1 in every slot of the whole grid; the blocks from `capacity` on must leave theirs.
  const at::Tensor slots = at::full({grid * kBlockTimelineSlots}, -1, inputs.q.options().dtype(at::kLong));
  params.block_timeline = reinterpret_cast<uint64_t*>(slots.data_ptr<int64_t>());
  params.block_timeline_blocks = capacity;
  run_kvcache_kernel(*kernel_, params);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const at::Tensor written = slots.cpu().view({grid, kBlockTimelineSlots});
  const at::Tensor untouched = at::full({kBlockTimelineSlots}, -1, written.options());
  for (int64_t block = 0; block < grid; ++block) {
    SCOPED_TRACE("block " + std::to_string(block) + " of " + std::to_string(grid) + ", capacity " +
                 std::to_string(capacity));
    const at::Tensor row = written[block];
    if (block < capacity) {
      EXPECT_NE(row[0].item<int64_t>(), -1);
      EXPECT_NE(row[1].item<int64_t>(), -1);
    } else {
      EXPECT_TRUE(at::equal(row, untouched));
    }
  }
}

const auto case_name = [](const auto& info) { return info.param.name; };

INSTANTIATE_TEST_SUITE_P(KvCacheReference, KvCache, ::testing::ValuesIn(kvcache_reference_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheScoreModifications, KvCache, ::testing::ValuesIn(kvcache_modification_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheLayouts, KvCachePagedAndContiguous, ::testing::ValuesIn(kvcache_layout_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheSplits, KvCacheSplits, ::testing::ValuesIn(kvcache_split_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheAppend, KvCacheAppend, ::testing::ValuesIn(kvcache_append_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheTimeline, KvCacheTimeline, ::testing::ValuesIn(kvcache_layout_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(KvCacheCpuReference, KvCacheCpuReference, ::testing::ValuesIn(kvcache_sanitizer_cases()),
                         case_name);

// ---------------------------------------------------------------------------
// The value checks (on the host, after the device check): a small problem,
// two sequences of 5 and 20 cached rows, one appended, capacity 32.

KvCacheSpec small_problem(int page_size) {
  KvCacheSpec spec;
  spec.batch = 2, spec.heads = 8, spec.kv_heads = 2;
  spec.seqlen_q = 1, spec.head_dim = 64;
  spec.dtype = at::kHalf;
  spec.cache_seqlens = {5, 20};
  spec.seqlen_new = 1;
  spec.capacity = 32;
  spec.page_size = page_size;
  spec.seed = test_seed();
  return spec;
}

at::Tensor bits(const at::Tensor& cache) { return cache.view(at::kShort); }

// In strict mode the call is rejected with every fragment, and neither the
// caches nor out were written. (By default the kernels check the values:
// tests/gpu/test_device_values.cpp.)
void expect_rejected_untouched(const KvCacheSpec& spec, const KvCacheTensors& inputs,
                               std::initializer_list<std::string> fragments) {
  const StrictChecksScope strict(true);
  const KvCacheTensors before = copy_caches(inputs);
  const ForwardOutputs outputs = poisoned_kvcache_outputs(spec, inputs);
  expect_rejected([&] { run_kvcache(spec, inputs, outputs); }, fragments);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_TRUE(at::equal(bits(inputs.k_cache), bits(before.k_cache))) << "k_cache written by a rejected call";
  EXPECT_TRUE(at::equal(bits(inputs.v_cache), bits(before.v_cache))) << "v_cache written by a rejected call";
  EXPECT_TRUE(at::isnan(outputs.out).all().item<bool>()) << "out written by a rejected call";
}

TEST(KvCacheValidationOnDevice, LengthBeyondTheCapacityWritesNothing) {
  FLASHLAB_REQUIRE_GPU();
  const KvCacheSpec spec = small_problem(0);
  const KvCacheTensors inputs = make_kvcache_inputs(spec, at::Device(at::kCUDA, 0));
  inputs.cache_seqlens[1].fill_(32);
  expect_rejected_untouched(spec, inputs,
                            {"sequence 1 would hold cache_seqlens[1] + new rows = 32 + 1 = 33 keys",
                             "its cache holds 32"});
}

TEST(KvCacheValidationOnDevice, NegativeLengthWritesNothing) {
  FLASHLAB_REQUIRE_GPU();
  const KvCacheSpec spec = small_problem(16);
  const KvCacheTensors inputs = make_kvcache_inputs(spec, at::Device(at::kCUDA, 0));
  inputs.cache_seqlens[0].fill_(-3);
  expect_rejected_untouched(spec, inputs, {"cache_seqlens[0] must be >= 0; got -3"});
}

TEST(KvCacheValidationOnDevice, PageOutOfRangeWritesNothing) {
  FLASHLAB_REQUIRE_GPU();
  const KvCacheSpec spec = small_problem(16);
  const KvCacheTensors inputs = make_kvcache_inputs(spec, at::Device(at::kCUDA, 0));
  const int64_t num_pages = inputs.k_cache.size(0);
  // Sequence 1 (21 keys after the append) uses entries 0 and 1.
  inputs.block_table[1][1].fill_(num_pages);
  expect_rejected_untouched(spec, inputs,
                            {"block_table[1][1] = " + std::to_string(num_pages) + " is not a page of the cache (0 to " +
                                 std::to_string(num_pages - 1) + ")"});
  inputs.block_table[1][1].fill_(-1);
  expect_rejected_untouched(spec, inputs, {"block_table[1][1] = -1 is not a page of the cache"});
}

// Entries past a sequence's keys are neither checked nor followed: -1 there
// (as a serving engine may leave them) gives the same result.
TEST(KvCacheValidationOnDevice, EntriesPastTheKeysAreNotRead) {
  FLASHLAB_REQUIRE_GPU();
  const KvCacheSpec spec = small_problem(16);
  KvCacheTensors inputs = make_kvcache_inputs(spec, at::Device(at::kCUDA, 0));
  // Sequence 0 (6 keys) uses entry 0 only.
  inputs.block_table[0][1].fill_(-1);
  const KvCacheCall call = call_against_reference(spec, inputs);
  const KvCacheComparison comparison =
      compare_kvcache(spec, inputs, call.outputs, call.expected, kvcache_tolerance(spec, call.expected));
  EXPECT_TRUE(passed(comparison)) << spec.describe() << "\n" << reports(comparison);
}

}  // namespace
}  // namespace flashlab::testing
