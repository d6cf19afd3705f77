// The KV-cache reference and the check's steps on the CPU (no kernel): the
// seeded inputs (poisoned rows, shuffled pages), the reference against a
// direct computation from the generator's values, paged and contiguous caches
// agreeing, empty caches, and the comparisons finding a missing append, a
// stray cache write and a wrong output where they are.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "flashlab/harness/kvcache_check.h"
#include "flashlab/harness/random_inputs.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

// Three sequences (an empty cache, one inside the first page, one over two
// pages), GQA 4/2, two query rows, causal, three appended rows; float32 so the
// reference is float64. Pages of 8 rows, capacity 48 (6 pages).
KvCacheSpec small_spec(int page_size) {
  KvCacheSpec spec;
  spec.batch = 3, spec.heads = 4, spec.kv_heads = 2;
  spec.seqlen_q = 2, spec.head_dim = 8;
  spec.dtype = at::kFloat;
  spec.causal = true;
  spec.cache_seqlens = {0, 5, 37};
  spec.seqlen_new = 3;
  spec.capacity = 48;
  spec.page_size = page_size;
  spec.seed = test_seed();
  return spec;
}

// The host generator's seeding takes a while: each layout is made once.
const KvCacheTensors& inputs_of(int page_size) {
  if (page_size == 0) {
    static const KvCacheTensors contiguous = make_kvcache_inputs(small_spec(0), at::kCPU);
    return contiguous;
  }
  static const KvCacheTensors paged = make_kvcache_inputs(small_spec(8), at::kCPU);
  return paged;
}

ReferenceOptions float64_options(const KvCacheSpec& spec) {
  ReferenceOptions options;
  options.softmax_scale = 1.0 / std::sqrt(static_cast<double>(spec.head_dim));
  options.window_left = spec.window_left;
  options.window_right = spec.causal ? 0 : spec.window_right;
  options.compute_dtype = at::kDouble;
  return options;
}

TEST(KvCacheInputs, RowsPastTheCachedKeysAreNaN) {
  const KvCacheSpec spec = small_spec(0);
  const KvCacheTensors& inputs = inputs_of(0);
  EXPECT_EQ(inputs.k_cache.sizes(), at::IntArrayRef({3, 48, 2, 8}));
  EXPECT_EQ(inputs.k_new.sizes(), at::IntArrayRef({3, 3, 2, 8}));
  for (int b = 0; b < spec.batch; ++b) {
    const int cached = spec.cache_seqlens[b];
    for (const at::Tensor* cache : {&inputs.k_cache, &inputs.v_cache}) {
      EXPECT_TRUE(at::isfinite((*cache)[b].narrow(0, 0, cached)).all().item<bool>()) << "sequence " << b;
      EXPECT_TRUE(at::isnan((*cache)[b].narrow(0, cached, 48 - cached)).all().item<bool>()) << "sequence " << b;
    }
  }
  EXPECT_TRUE(at::isfinite(inputs.q).all().item<bool>());
  EXPECT_TRUE(at::isfinite(inputs.k_new).all().item<bool>());
  EXPECT_EQ(inputs.cache_seqlens.scalar_type(), at::kInt);
}

TEST(KvCacheInputs, PagesAreAShuffleAndUnusedEntriesShareANaNPage) {
  const KvCacheSpec spec = small_spec(8);
  const KvCacheTensors& inputs = inputs_of(8);
  ASSERT_TRUE(inputs.paged());
  EXPECT_EQ(inputs.block_table.sizes(), at::IntArrayRef({3, 6}));
  EXPECT_EQ(inputs.k_cache.sizes(), at::IntArrayRef({3 * 6 + 1, 8, 2, 8}));
  EXPECT_EQ(inputs.capacity(), 48);
  const at::Tensor table = inputs.block_table.to(at::kLong);
  std::set<int64_t> used;
  std::set<int64_t> unused;
  for (int b = 0; b < spec.batch; ++b)
    for (int j = 0; j < 6; ++j) {
      const int64_t page = table[b][j].item<int64_t>();
      if (j * 8 < spec.cache_seqlens[b] + spec.seqlen_new) {
        EXPECT_TRUE(used.insert(page).second) << "page " << page << " used twice";
      } else {
        unused.insert(page);
      }
    }
  ASSERT_EQ(unused.size(), 1u) << "entries past the keys should share one page";
  const int64_t unused_page = *unused.begin();
  EXPECT_EQ(used.count(unused_page), 0u);
  EXPECT_TRUE(at::isnan(inputs.k_cache[unused_page]).all().item<bool>());
  // The logical rows are those of the contiguous inputs (same seed): the same keys.
  for (int b = 0; b < spec.batch; ++b) {
    const int64_t cached = spec.cache_seqlens[b];
    EXPECT_TRUE(at::equal(cache_rows(inputs.k_cache, inputs.block_table, b, cached),
                          cache_rows(inputs_of(0).k_cache, {}, b, cached)));
  }
  EXPECT_TRUE(at::equal(inputs.q, inputs_of(0).q));
  EXPECT_TRUE(at::equal(inputs.v_new, inputs_of(0).v_new));
}

// out and lse from the generator's values, one element at a time in double:
// the pool's order is q, logical k cache, logical v cache, k_new, v_new.
TEST(KvCacheReference, MatchesDirectComputation) {
  const KvCacheSpec spec = small_spec(8);
  const KvCacheReference reference = reference_attention_kvcache(inputs_of(8), float64_options(spec));
  const int64_t B = spec.batch, Sq = spec.seqlen_q, H = spec.heads, Hkv = spec.kv_heads, D = spec.head_dim;
  const int64_t capacity = 48, n = spec.seqlen_new;
  const at::Tensor pool =
      mt19937_normal({B * Sq * H * D + 2 * B * capacity * Hkv * D + 2 * B * n * Hkv * D}, spec.seed, at::kCPU)
          .to(at::kDouble);
  int64_t offset = 0;
  const auto take = [&](std::vector<int64_t> shape) {
    int64_t count = 1;
    for (const int64_t extent : shape) count *= extent;
    const at::Tensor part = pool.narrow(0, offset, count).view(shape);
    offset += count;
    return part;
  };
  const at::Tensor q = take({B, Sq, H, D}), k_cache = take({B, capacity, Hkv, D});
  const at::Tensor v_cache = take({B, capacity, Hkv, D}), k_new = take({B, n, Hkv, D});
  const at::Tensor v_new = take({B, n, Hkv, D});
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t cached = spec.cache_seqlens[b], keys = cached + n;
    const auto key = [&](int64_t j) { return j < cached ? k_cache[b][j] : k_new[b][j - cached]; };
    const auto value = [&](int64_t j) { return j < cached ? v_cache[b][j] : v_new[b][j - cached]; };
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        // Causal, bottom-right: query i sees keys 0 .. i + keys - Sq.
        const int64_t last = i + keys - Sq;
        std::vector<double> scores;
        for (int64_t j = 0; j <= last; ++j)
          scores.push_back((q[b][i][h] * key(j)[h / 2]).sum().item<double>() * scale);
        const double lse_got = reference.output.lse[b][h][i].item<double>();
        if (scores.empty()) {
          EXPECT_EQ(lse_got, -std::numeric_limits<double>::infinity());
          EXPECT_EQ(reference.output.out[b][i][h].abs().max().item<double>(), 0.0);
          continue;
        }
        double top = scores[0], sum = 0;
        for (const double s : scores) top = std::max(top, s);
        for (const double s : scores) sum += std::exp(s - top);
        EXPECT_NEAR(lse_got, top + std::log(sum), 1e-12) << "b " << b << " h " << h << " i " << i;
        at::Tensor out = at::zeros({D}, at::kDouble);
        for (int64_t j = 0; j <= last; ++j) out += std::exp(scores[j] - top) / sum * value(j)[h / 2];
        EXPECT_TRUE(at::allclose(reference.output.out[b][i][h], out, 0, 1e-12))
            << "b " << b << " h " << h << " i " << i;
      }
  }
}

TEST(KvCacheReference, PagedAndContiguousCachesGiveTheSameResult) {
  const KvCacheSpec spec = small_spec(8);
  const KvCacheReference paged = reference_attention_kvcache(inputs_of(8), float64_options(spec));
  const KvCacheReference contiguous = reference_attention_kvcache(inputs_of(0), float64_options(spec));
  EXPECT_TRUE(at::equal(paged.output.out, contiguous.output.out));
  EXPECT_TRUE(at::equal(paged.output.lse, contiguous.output.lse));
  const std::vector<int64_t> keys = inputs_of(8).key_lengths();
  for (int b = 0; b < spec.batch; ++b) {
    EXPECT_TRUE(at::equal(cache_rows(paged.k_cache, inputs_of(8).block_table, b, keys[b]),
                          cache_rows(contiguous.k_cache, {}, b, keys[b])));
    EXPECT_TRUE(at::equal(cache_rows(paged.v_cache, inputs_of(8).block_table, b, keys[b]),
                          cache_rows(contiguous.v_cache, {}, b, keys[b])));
  }
}

TEST(KvCacheReference, AppendWritesTheNewRowsAndNothingElse) {
  for (const int page_size : {0, 8}) {
    SCOPED_TRACE(page_size == 0 ? "contiguous" : "paged");
    const KvCacheTensors& before = inputs_of(page_size);
    const KvCacheReference reference = reference_attention_kvcache(before, float64_options(small_spec(page_size)));
    EXPECT_EQ(reference.appended.sum().item<int64_t>(), 3 * 3);  // 3 rows for each of 3 sequences
    const std::vector<int64_t> cached = before.cached_lengths();
    for (int b = 0; b < 3; ++b) {
      const at::Tensor rows = cache_rows(reference.k_cache, before.block_table, b, cached[b] + 3);
      EXPECT_TRUE(at::equal(rows.narrow(0, cached[b], 3), before.k_new[b])) << "sequence " << b;
      EXPECT_TRUE(at::equal(rows.narrow(0, 0, cached[b]), cache_rows(before.k_cache, before.block_table, b, cached[b])));
    }
    const CacheComparison unchanged_elsewhere =
        compare_cache("k_cache", reference.k_cache, before.k_cache, reference.appended, before.block_table,
                      before.key_lengths());
    EXPECT_EQ(unchanged_elsewhere.other_differing, 0);
    EXPECT_EQ(unchanged_elsewhere.appended_elements, 9 * 2 * 8);
    EXPECT_EQ(unchanged_elsewhere.appended_differing, 9 * 2 * 8);  // NaN before, keys after
  }
}

TEST(KvCacheReference, EmptyCacheGivesZeroAndMinusInfinity) {
  // No append: sequence 0 has no key at all; sequence 1 has four.
  KvCacheTensors inputs;
  inputs.q = at::randn({2, 3, 2, 4}, at::kDouble);
  inputs.k_cache = at::randn({2, 6, 1, 4}, at::kDouble);
  inputs.v_cache = at::randn({2, 6, 1, 4}, at::kDouble);
  inputs.cache_seqlens = at::tensor(std::vector<int>{0, 4}, at::kInt);
  ReferenceOptions options;
  options.compute_dtype = at::kDouble;
  const KvCacheReference reference = reference_attention_kvcache(inputs, options);
  EXPECT_TRUE(at::equal(reference.output.out[0], at::zeros({3, 2, 4}, at::kDouble)));
  EXPECT_TRUE((reference.output.lse[0] == -std::numeric_limits<double>::infinity()).all().item<bool>());
  EXPECT_TRUE(at::isfinite(reference.output.lse[1]).all().item<bool>());
  // Sequence 1 is plain attention over its first four keys.
  const ReferenceOutput direct = reference_attention(inputs.q.narrow(0, 1, 1), inputs.k_cache.narrow(0, 1, 1).narrow(1, 0, 4),
                                                     inputs.v_cache.narrow(0, 1, 1).narrow(1, 0, 4), options);
  EXPECT_TRUE(at::allclose(reference.output.out.narrow(0, 1, 1), direct.out, 0, 1e-12));
  EXPECT_TRUE(at::allclose(reference.output.lse.narrow(0, 1, 1), direct.lse, 0, 1e-12));
  // Without cache_seqlens every cache is full: all six keys.
  inputs.cache_seqlens = at::Tensor();
  const KvCacheReference full = reference_attention_kvcache(inputs, options);
  const ReferenceOutput all = reference_attention(inputs.q, inputs.k_cache, inputs.v_cache, options);
  EXPECT_TRUE(at::allclose(full.output.out, all.out, 0, 1e-12));
  EXPECT_EQ(full.appended.sum().item<int64_t>(), 0);
}

TEST(KvCacheSpec, CapacityAndInvalidSpecs) {
  KvCacheSpec spec;
  spec.batch = 3;
  spec.cache_seqlens = {100, 0, 4095};
  spec.seqlen_new = 1;
  EXPECT_EQ(spec.resolved_capacity(), 4096);
  spec.page_size = 256;
  EXPECT_EQ(spec.resolved_capacity(), 4096);
  EXPECT_EQ(spec.pages_per_sequence(), 16);
  spec.capacity = 4000;  // paged: whole pages
  EXPECT_EQ(spec.resolved_capacity(), 4096);
  EXPECT_EQ(spec.invalid_reason(), "");
  spec.seqlen_new = 2;
  EXPECT_NE(spec.invalid_reason().find("cache_seqlens[2] 4095 plus 2 appended rows is 4097 keys, more than "
                                       "the cache capacity of 4096 rows"),
            std::string::npos)
      << spec.invalid_reason();
  spec.cache_seqlens = {1, 2};
  EXPECT_NE(spec.invalid_reason().find("cache_seqlens gives 2 lengths for batch 3"), std::string::npos);
  spec.cache_seqlens.clear();
  EXPECT_NE(spec.invalid_reason().find("needs cache_seqlens"), std::string::npos);
  const std::vector<int> lengths = random_cache_seqlens(64, 300, 4, 7);
  EXPECT_EQ(lengths, random_cache_seqlens(64, 300, 4, 7));
  for (const int length : lengths) {
    EXPECT_GE(length, 0);
    EXPECT_LE(length, 296);
  }
}

// The check's comparisons on the CPU, with the reference's own result (and
// caches) standing in for a kernel's.
class KvCacheSteps : public ::testing::TestWithParam<int> {};

TEST_P(KvCacheSteps, ComparisonsLocateWhatIsWrong) {
  const KvCacheSpec spec = small_spec(GetParam());
  const KvCacheTensors& before = inputs_of(GetParam());
  const KvCacheParams params = kvcache_params(spec, before);
  const KvCacheExpected expected = reference_kvcache(spec, before, params);
  const ForwardTolerance tolerance = kvcache_tolerance(spec, expected);
  const auto kernel_stand_in = [&] {
    KvCacheTensors after = copy_caches(before);
    after.k_cache.copy_(expected.reference.k_cache);
    after.v_cache.copy_(expected.reference.v_cache);
    return after;
  };
  const ForwardOutputs same_precision{expected.same_precision.out.contiguous(),
                                      expected.same_precision.lse.to(at::kFloat).contiguous()};
  {
    SCOPED_TRACE("the reference's own caches and torch's same-precision result pass");
    const KvCacheComparison comparison = compare_kvcache(spec, kernel_stand_in(), same_precision, expected, tolerance);
    EXPECT_TRUE(comparison.out.passed()) << comparison.out.format();
    EXPECT_TRUE(comparison.lse.passed()) << comparison.lse.format();
    EXPECT_TRUE(comparison.k_cache.passed()) << comparison.k_cache.format();
    EXPECT_TRUE(comparison.v_cache.passed()) << comparison.v_cache.format();
    EXPECT_EQ(comparison.k_cache.appended_elements, 3 * 3 * 2 * 8);
  }
  {
    SCOPED_TRACE("poisoned outputs and a missing append fail");
    const KvCacheComparison comparison =
        compare_kvcache(spec, copy_caches(before), poisoned_kvcache_outputs(spec, before), expected, tolerance);
    EXPECT_EQ(comparison.out.nan_count, comparison.out.total);
    EXPECT_EQ(comparison.lse.nan_count, comparison.lse.total);
    EXPECT_EQ(comparison.k_cache.appended_differing, comparison.k_cache.appended_elements);
    EXPECT_EQ(comparison.k_cache.other_differing, 0);
    ASSERT_TRUE(comparison.k_cache.first_difference.has_value());
    const CacheDifference& first = *comparison.k_cache.first_difference;
    EXPECT_TRUE(first.appended);
    // The first appended row in (batch or page, row) order: sequence 0's row 0
    // (contiguous), or whichever page holds an appended row first (paged).
    EXPECT_GE(first.sequence, 0);
    EXPECT_LT(first.logical_row, first.sequence_keys);
    EXPECT_GE(first.logical_row, spec.cache_seqlens[first.sequence]);
    if (GetParam() == 0) {
      EXPECT_EQ(first.index0, 0);
      EXPECT_EQ(first.row, 0);
    }
  }
  {
    SCOPED_TRACE("a stray write past a sequence's keys is located");
    KvCacheTensors after = kernel_stand_in();
    // Sequence 1's logical row 20 (past its 8 keys), kv head 1, col 5.
    const int64_t rows = after.v_cache.size(1);
    int64_t index0 = 1, row = 20;
    if (after.paged()) index0 = after.block_table[1][20 / rows].item<int64_t>(), row = 20 % rows;
    after.v_cache[index0][row][1][5].fill_(0.5);
    const KvCacheComparison comparison = compare_kvcache(spec, after, same_precision, expected, tolerance);
    EXPECT_TRUE(comparison.k_cache.passed());
    EXPECT_EQ(comparison.v_cache.other_differing, 1);
    EXPECT_EQ(comparison.v_cache.appended_differing, 0);
    ASSERT_TRUE(comparison.v_cache.first_difference.has_value());
    const CacheDifference& first = *comparison.v_cache.first_difference;
    EXPECT_EQ(first.index0, index0);
    EXPECT_EQ(first.row, row);
    EXPECT_EQ(first.head, 1);
    EXPECT_EQ(first.col, 5);
    EXPECT_FALSE(first.appended);
    EXPECT_EQ(first.actual, 0.5);
    EXPECT_TRUE(std::isnan(first.expected));
    if (after.paged()) {
      // Row 20 is in sequence 1's third page, an entry past its 8 keys: the shared NaN page.
      EXPECT_EQ(first.sequence, -1);
      EXPECT_NE(comparison.v_cache.format().find("a page that no sequence's keys reach"), std::string::npos);
    } else {
      EXPECT_EQ(first.sequence, 1);
      EXPECT_EQ(first.logical_row, 20);
      EXPECT_NE(comparison.v_cache.format().find("sequence 1, row 20 of its 8 keys (past them)"), std::string::npos)
          << comparison.v_cache.format();
    }
  }
  {
    SCOPED_TRACE("one planted output error is found, with its sequence's keys");
    ForwardOutputs outputs{same_precision.out.clone(), same_precision.lse};
    outputs.out[2][1][3][6].add_(4 * tolerance.out.bound() + 0.01);
    const KvCacheComparison comparison = compare_kvcache(spec, kernel_stand_in(), outputs, expected, tolerance);
    ASSERT_FALSE(comparison.out.passed());
    EXPECT_EQ(comparison.out.over_tolerance, 1);
    const ElementPosition& bad = *comparison.out.first_bad;
    EXPECT_EQ(bad.batch, 2);
    EXPECT_EQ(bad.row, 1);
    EXPECT_EQ(bad.head, 3);
    EXPECT_EQ(bad.col, 6);
    const std::string context = kvcache_row_context(spec, before.cached_lengths(), {16, 64}, bad);
    // 37 cached + 3 appended; row 1 of 2 sees every key; packed row 1 x 2 + 1.
    EXPECT_NE(context.find("sequence 2 attends to 40 keys (37 cached + 3 appended); row 1 of head 3 (kv head 1) "
                           "sees keys 0..39"),
              std::string::npos)
        << context;
    EXPECT_NE(context.find("its packed row 3 (row x 2 + head % 2) lies in packed-row tile 0 (block_q 16); its "
                           "keys lie in key blocks 0..0 (block_k 64)"),
              std::string::npos)
        << context;
  }
}

INSTANTIATE_TEST_SUITE_P(ContiguousAndPaged, KvCacheSteps, ::testing::Values(0, 8),
                         [](const auto& info) { return info.param == 0 ? "contiguous" : "paged"; });

}  // namespace
}  // namespace flashlab::testing
