// Values that live on the device (attention.h, "Values on the device"), one
// fixture per property:
//   BadDeviceValues.*        fuzzed bad cu_seqlens / max_seqlen / cache_seqlens /
//                            block_table (fresh seeds), default mode: the call
//                            returns, writes no cache row outside a sequence's
//                            own, and check_device_errors names the tensor, the
//                            index and the value; the next good call runs clean.
//                            (ctest sanitizer_bad_values_memcheck runs these
//                            under compute-sanitizer memcheck.)
//   CudaGraphCapture.*       every entry point (forward, varlen forward and
//                            backward, backward, KV cache contiguous / paged /
//                            append) captured with at::cuda::CUDAGraph, then
//                            replayed on new values written into the same
//                            tensors: equal to an eager call on those values.
// Strict mode (host checks, at once) is tested in test_kvcache.cpp
// (KvCacheValidationOnDevice) and tests/cpu/test_varlen_validation.cpp.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "flashlab/attention.h"
#include "flashlab/cuda_check.h"
#include "test_support.h"

namespace flashlab::testing {
namespace {

const at::TensorOptions kBf16 = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
const at::TensorOptions kInt = at::TensorOptions().dtype(at::kInt).device(at::kCUDA, 0);

// The c10::Error that check_device_errors raises ("" when none).
std::string device_error() {
  try {
    check_device_errors(0);
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  }
  return {};
}

// Default mode for the test, whatever the environment says; no report left
// over from another test.
class DeviceValuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FLASHLAB_REQUIRE_GPU();
    strict_before_ = strict_checks();
    set_strict_checks(false);
    (void)device_error();
    rng_.seed(test_seed());
  }
  void TearDown() override { set_strict_checks(strict_before_); }
  int uniform(int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng_); }
  bool strict_before_ = false;
  std::mt19937 rng_;
};

// `call` returns (no crash, no exception), and check_device_errors then raises
// a message holding every fragment; afterwards nothing is pending.
void expect_reported(const std::function<void()>& call, const std::vector<std::string>& fragments,
                     const std::string& trial) {
  ASSERT_NO_THROW(call()) << trial;
  const std::string message = device_error();
  ASSERT_FALSE(message.empty()) << trial << ": nothing reported";
  for (const std::string& fragment : fragments)
    EXPECT_NE(message.find(fragment), std::string::npos) << trial << ": no '" << fragment << "' in\n" << message;
  EXPECT_EQ(device_error(), "") << trial << ": a second report";
}

// ---------------------------------------------------------------------------
// Variable-length batches.

struct Varlen {
  at::Tensor q, k, v, cu_q, cu_k;
  std::vector<int> lengths_q, lengths_k;
  int max_q = 0, max_k = 0;
};

at::Tensor offsets_of(const std::vector<int>& lengths) {
  std::vector<int> offsets{0};
  for (int length : lengths) offsets.push_back(offsets.back() + length);
  return at::tensor(offsets, at::kInt).to(at::kCUDA);
}

Varlen make_varlen(std::mt19937& rng, int batch) {
  Varlen in;
  std::uniform_int_distribution<int> length(1, 200);
  for (int b = 0; b < batch; ++b) {
    in.lengths_q.push_back(length(rng));
    in.lengths_k.push_back(length(rng));
  }
  in.max_q = *std::max_element(in.lengths_q.begin(), in.lengths_q.end());
  in.max_k = *std::max_element(in.lengths_k.begin(), in.lengths_k.end());
  const int64_t total_q = in.lengths_q.empty() ? 0 : offsets_of(in.lengths_q)[-1].item<int>();
  const int64_t total_k = offsets_of(in.lengths_k)[-1].item<int>();
  in.q = at::randn({total_q, 4, 64}, kBf16);
  in.k = at::randn({total_k, 2, 64}, kBf16);
  in.v = at::randn({total_k, 2, 64}, kBf16);
  in.cu_q = offsets_of(in.lengths_q);
  in.cu_k = offsets_of(in.lengths_k);
  return in;
}

// One bad value of a varlen batch's offsets or maxima, and what its report says.
struct VarlenCorruption {
  std::string what;
  std::vector<std::string> fragments;
};

VarlenCorruption corrupt(Varlen& in, int kind, bool keys, std::mt19937& rng) {
  at::Tensor& cu = keys ? in.cu_k : in.cu_q;
  const std::string name = keys ? "cu_seqlens_k" : "cu_seqlens_q";
  const int batch = static_cast<int>(cu.size(0)) - 1;
  const int total = cu[-1].item<int>();
  const int i = std::uniform_int_distribution<int>(1, batch - 1)(rng);
  switch (kind) {
    case 0: {  // not increasing
      const int value = cu[i - 1].item<int>() - std::uniform_int_distribution<int>(1, 50)(rng);
      cu[i].fill_(value);
      return {name + "[" + std::to_string(i) + "] = " + std::to_string(value),
              {name + "[" + std::to_string(i) + "] = " + std::to_string(value), "is outside"}};
    }
    case 1: {  // past the total
      const int value = total + std::uniform_int_distribution<int>(1, 1 << 20)(rng);
      cu[i].fill_(value);
      return {name + "[" + std::to_string(i) + "] past the total", {name + "[" + std::to_string(i) + "] = " + std::to_string(value)}};
    }
    case 2: {  // negative start
      const int value = -std::uniform_int_distribution<int>(1, 1 << 30)(rng);
      cu[0].fill_(value);
      return {name + "[0] negative", {name + "[0] = " + std::to_string(value)}};
    }
    default: {  // max_seqlen below a real length
      int& max = keys ? in.max_k : in.max_q;
      max = std::max(1, max / 2);
      const std::string max_name = keys ? "max_seqlen_k" : "max_seqlen_q";
      return {max_name + " halved", {"more than " + max_name + " = " + std::to_string(max)}};
    }
  }
}

TEST_F(DeviceValuesTest, BadVarlenOffsetsAreClampedAndReported) {
  for (int trial = 0; trial < 24; ++trial) {
    Varlen in = make_varlen(rng_, uniform(2, 5));
    const int kind = trial % 4;
    const bool keys = (trial / 4) % 2 == 1;
    const bool backward = trial >= 8 && trial % 3 == 0;
    const VarlenCorruption bad = corrupt(in, kind, keys, rng_);
    const std::string label = "trial " + std::to_string(trial) + " (" + bad.what + (backward ? ", backward" : "") +
                              "), seed " + std::to_string(test_seed());
    AttentionOptions options;
    options.causal = trial % 2 == 0;
    expect_reported(
        [&] {
          const AttentionOutput result =
              attention_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, options);
          if (backward) {
            (void)device_error();  // the forward's report; the backward must find the value again
            BackwardOptions backward_options;
            static_cast<AttentionOptions&>(backward_options) = options;
            (void)attention_varlen_backward(at::randn_like(result.out), in.q, in.k, in.v, result.out,
                                            result.lse, in.cu_q, in.cu_k, in.max_q, in.max_k,
                                            backward_options);
          }
        },
        bad.fragments, label);
  }
}

// Every registered kernel with a forward clamps alike (the fixed order of the
// registry: fa3_wgmma_sm90, fa2_mma_sm80, fa1_scalar).
TEST_F(DeviceValuesTest, EveryKernelClampsVarlenOffsets) {
  for (const KernelVariant& kernel : registered_kernels()) {
    Varlen in = make_varlen(rng_, 3);
    const VarlenCorruption bad = corrupt(in, 1, false, rng_);
    AttentionOptions options;
    options.kernel = kernel.name;
    try {
      (void)select_varlen_kernel(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, options);
    } catch (const c10::Error&) {
      continue;  // not on this device
    }
    expect_reported([&] { (void)attention_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, options); },
                    bad.fragments, kernel.name + ": " + bad.what);
  }
}

// ---------------------------------------------------------------------------
// KV caches.

struct Cache {
  at::Tensor q, k_cache, v_cache, cache_seqlens, block_table, k_new, v_new;
  int page_size = 0;
  int num_splits = 0;  // 0: the kernel's heuristic (1 for these small caches)
  bool paged() const { return block_table.defined(); }
  int64_t capacity() const { return paged() ? block_table.size(1) * page_size : k_cache.size(1); }
  KvCacheOptions options() const {
    KvCacheOptions o;
    o.cache_seqlens = cache_seqlens;
    if (paged()) o.block_table = block_table;
    if (k_new.defined()) o.k_new = k_new, o.v_new = v_new;
    o.num_splits = num_splits;
    return o;
  }
};

Cache make_cache(std::mt19937& rng, int batch, bool paged, int seqlen_new) {
  Cache c;
  c.page_size = paged ? 16 : 0;
  const int capacity = 64;
  c.q = at::randn({batch, 1, 8, 64}, kBf16);
  if (paged) {
    const int pages_per_sequence = capacity / c.page_size, pages = batch * pages_per_sequence + 3;
    c.k_cache = at::randn({pages, c.page_size, 2, 64}, kBf16);
    c.block_table = at::randperm(pages, kInt).narrow(0, 0, batch * pages_per_sequence).view({batch, pages_per_sequence});
  } else {
    c.k_cache = at::randn({batch, capacity, 2, 64}, kBf16);
  }
  c.v_cache = at::randn_like(c.k_cache);
  std::vector<int> lengths;
  for (int b = 0; b < batch; ++b)
    lengths.push_back(std::uniform_int_distribution<int>(0, capacity - seqlen_new)(rng));
  c.cache_seqlens = at::tensor(lengths, at::kInt).to(at::kCUDA);
  if (seqlen_new > 0) {
    c.k_new = at::randn({batch, seqlen_new, 2, 64}, kBf16);
    c.v_new = at::randn({batch, seqlen_new, 2, 64}, kBf16);
  }
  return c;
}

// (page or sequence, row) of every cache row an append may write: the new
// rows of each sequence whose length is in range, through its page entries
// that are pages of the cache. On the host, from the (corrupted) values.
std::set<std::pair<int64_t, int64_t>> writable_rows(const Cache& c) {
  std::set<std::pair<int64_t, int64_t>> rows;
  if (!c.k_new.defined()) return rows;
  const at::Tensor lengths = c.cache_seqlens.cpu();
  const at::Tensor table = c.paged() ? c.block_table.cpu() : at::Tensor();
  const int64_t seqlen_new = c.k_new.size(1);
  for (int64_t b = 0; b < c.q.size(0); ++b) {
    const int64_t cached = lengths[b].item<int>();
    if (cached < 0 || cached > c.capacity() - seqlen_new) continue;
    for (int64_t key = cached; key < cached + seqlen_new; ++key) {
      if (!c.paged()) {
        rows.insert({b, key});
        continue;
      }
      const int64_t page = table[b][key / c.page_size].item<int>();
      if (page >= 0 && page < c.k_cache.size(0)) rows.insert({page, key % c.page_size});
    }
  }
  return rows;
}

// Rows (first two dimensions) where `after` differs from `before` bitwise.
std::set<std::pair<int64_t, int64_t>> changed_rows(const at::Tensor& before, const at::Tensor& after) {
  const at::Tensor differs = (before.view(at::kShort) != after.view(at::kShort)).flatten(2).any(2).cpu();
  std::set<std::pair<int64_t, int64_t>> rows;
  const at::Tensor where = differs.nonzero();
  for (int64_t i = 0; i < where.size(0); ++i) rows.insert({where[i][0].item<int64_t>(), where[i][1].item<int64_t>()});
  return rows;
}

TEST_F(DeviceValuesTest, BadCacheValuesAreClampedAndReportedAndWriteNothingOutOfPlace) {
  for (int trial = 0; trial < 24; ++trial) {
    const bool paged = trial % 2 == 1;
    const int kind = (trial / 2) % (paged ? 4 : 2);  // 0, 1: lengths; 2, 3: page entries
    const int seqlen_new = trial % 3 == 0 ? 0 : uniform(1, 3);
    Cache c = make_cache(rng_, uniform(2, 6), paged, seqlen_new);
    // One split: the split kernel checks the values; three: the combine does.
    c.num_splits = trial % 4 < 2 ? 1 : 3;
    const int b = uniform(0, static_cast<int>(c.q.size(0)) - 1);
    std::vector<std::string> fragments;
    if (kind == 0 || kind == 1) {
      const int value = kind == 0 ? -uniform(1, 1 << 30)
                                  : static_cast<int>(c.capacity()) - seqlen_new + uniform(1, 1 << 20);
      c.cache_seqlens[b].fill_(value);
      fragments = {"cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(value), "is outside"};
      if (paged) fragments.push_back("block_table");
    } else {
      // An entry the sequence uses: the page of its first or its last key.
      const int length = c.cache_seqlens[b].item<int>() + seqlen_new;
      if (length == 0) c.cache_seqlens[b].fill_(1);
      const int keys = std::max(length, 1);
      const int j = kind == 2 ? 0 : (keys - 1) / c.page_size;
      const int value = kind == 2 ? -uniform(1, 1 << 30) : static_cast<int>(c.k_cache.size(0)) + uniform(0, 1000);
      c.block_table[b][j].fill_(value);
      fragments = {"block_table[" + std::to_string(b) + "][" + std::to_string(j) + "] = " + std::to_string(value),
                   "is not a page of the cache"};
    }
    const std::string label = "trial " + std::to_string(trial) + (paged ? " paged" : " contiguous") + ", append " +
                              std::to_string(seqlen_new) + ", splits " + std::to_string(c.num_splits) + ", " +
                              fragments[0] + ", seed " + std::to_string(test_seed());
    const at::Tensor k_before = c.k_cache.clone(), v_before = c.v_cache.clone();
    const KvCacheOptions options = c.options();
    expect_reported([&] { (void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, options); }, fragments, label);
    const auto allowed = writable_rows(c);
    for (const auto& [cache, before] : {std::pair{&c.k_cache, &k_before}, {&c.v_cache, &v_before}})
      for (const auto& row : changed_rows(*before, *cache))
        EXPECT_TRUE(allowed.count(row)) << label << ": row (" << row.first << ", " << row.second
                                        << ") written, not a new row of a sequence in range";
  }
}

// The crash: one page of 256 rows in the table, a pool of 4 pages, 257
// cached keys (or 256 and one appended row).
TEST_F(DeviceValuesTest, LengthPastTheBlockTableNamesBlockTable) {
  for (const int seqlen_new : {0, 1}) {
    Cache c;
    c.page_size = 256;
    c.q = at::randn({1, 1, 8, 128}, kBf16);
    c.k_cache = at::randn({4, 256, 2, 128}, kBf16);
    c.v_cache = at::randn_like(c.k_cache);
    c.block_table = at::zeros({1, 1}, kInt);
    c.cache_seqlens = at::full({1}, seqlen_new == 0 ? 257 : 256, kInt);
    if (seqlen_new > 0) c.k_new = at::randn({1, 1, 2, 128}, kBf16), c.v_new = at::randn({1, 1, 2, 128}, kBf16);
    expect_reported([&] { (void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, c.options()); },
                    {"cache_seqlens[0] = " + std::string(seqlen_new == 0 ? "257" : "256"), "block_table"},
                    "append " + std::to_string(seqlen_new));
    // Strict mode says so before the launch.
    KvCacheOptions strict = c.options();
    strict.strict_checks = true;
    expect_rejected([&] { (void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, strict); },
                    {"its cache holds 256 (block_table's width 1 x page_size 256)"});
  }
}

TEST_F(DeviceValuesTest, TheNextCallReportsAnEarlierBadValue) {
  Cache c = make_cache(rng_, 2, false, 0);
  c.cache_seqlens[1].fill_(-1);
  (void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, c.options());
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  c.cache_seqlens[1].fill_(3);
  expect_rejected([&] { (void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, c.options()); },
                  {"an earlier call on cuda:0 met a bad value", "cache_seqlens[1] = -1"});
  EXPECT_NO_THROW((void)attention_with_kvcache(c.q, c.k_cache, c.v_cache, c.options()));
  EXPECT_EQ(device_error(), "");
}

// ---------------------------------------------------------------------------
// CUDA graphs: capture a call on a side stream, write new values into the
// same input tensors, replay, and compare with an eager call on those values.

// Fills every tensor of `inputs` anew (integer tensors from `refill_ints`).
using Refill = std::function<void()>;

void expect_replay_equals_eager(const std::string& name, const std::function<std::vector<at::Tensor>()>& call,
                                const Refill& refill, bool bitwise = true) {
  SCOPED_TRACE(name);
  (void)call();  // warm-up: allocations, attributes, the error log
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  at::cuda::CUDAGraph graph;
  std::vector<at::Tensor> captured;
  {
    const c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    graph.capture_begin();
    captured = call();
    graph.capture_end();
  }
  refill();
  graph.replay();
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<at::Tensor> replayed;
  for (const at::Tensor& t : captured) replayed.push_back(t.clone());
  const std::vector<at::Tensor> eager = call();
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  ASSERT_EQ(replayed.size(), eager.size());
  for (size_t i = 0; i < eager.size(); ++i) {
    if (bitwise)
      EXPECT_TRUE(at::equal(replayed[i], eager[i])) << "output " << i << " differs";
    else
      EXPECT_TRUE(at::allclose(replayed[i].to(at::kFloat), eager[i].to(at::kFloat), 1e-2, 1e-2))
          << "output " << i << " differs";
  }
  EXPECT_EQ(device_error(), "");
}

TEST_F(DeviceValuesTest, CudaGraphCaptureOfEveryEntryPoint) {
  // Fixed length: forward and backward (deterministic, so bitwise).
  const at::Tensor q = at::randn({2, 113, 4, 64}, kBf16), k = at::randn({2, 203, 2, 64}, kBf16),
                   v = at::randn({2, 203, 2, 64}, kBf16), dout = at::randn({2, 113, 4, 64}, kBf16);
  const auto refill_qkv = [&] {
    for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&q, &k, &v, &dout}) t->copy_(at::randn_like(*t));
  };
  AttentionOptions causal;
  causal.causal = true;
  expect_replay_equals_eager("forward", [&] {
    const AttentionOutput r = attention_forward(q, k, v, causal);
    return std::vector<at::Tensor>{r.out, r.lse};
  }, refill_qkv);
  BackwardOptions deterministic;
  deterministic.causal = true;
  deterministic.deterministic = true;
  expect_replay_equals_eager("backward", [&] {
    const AttentionOutput r = attention_forward(q, k, v, causal);
    const AttentionGradients g = attention_backward(dout, q, k, v, r.out, r.lse, deterministic);
    return std::vector<at::Tensor>{g.dq, g.dk, g.dv};
  }, refill_qkv);

  // Variable length: new offsets (same totals) in the same tensors.
  Varlen in = make_varlen(rng_, 4);
  const at::Tensor dout_packed = at::randn_like(in.q);
  const auto refill_varlen = [&] {
    for (at::Tensor* cu : {&in.cu_q, &in.cu_k}) {
      // Every inner offset one later (clamped): new lengths, the same totals.
      at::Tensor host = cu->cpu();
      const int total = host[-1].item<int>();
      for (int64_t i = 1; i + 1 < host.size(0); ++i)
        host[i].fill_(std::min(total, std::max(host[i - 1].item<int>(), host[i].item<int>() + 1)));
      cu->copy_(host);
    }
    for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&in.q, &in.k, &in.v, &dout_packed})
      t->copy_(at::randn_like(*t));
  };
  // Maxima with room for the refills' longer sequences (each refill adds one row to the first).
  in.max_q += 8, in.max_k += 8;
  expect_replay_equals_eager("varlen forward", [&] {
    const AttentionOutput r = attention_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, causal);
    return std::vector<at::Tensor>{r.out, r.lse};
  }, refill_varlen);
  expect_replay_equals_eager("varlen backward", [&] {
    const AttentionOutput r = attention_varlen_forward(in.q, in.k, in.v, in.cu_q, in.cu_k, in.max_q, in.max_k, causal);
    const AttentionGradients g = attention_varlen_backward(dout_packed, in.q, in.k, in.v, r.out, r.lse, in.cu_q,
                                                           in.cu_k, in.max_q, in.max_k, deterministic);
    return std::vector<at::Tensor>{g.dq, g.dk, g.dv};
  }, refill_varlen);

  // KV caches: new lengths (and pages) in the same tensors.
  for (const bool paged : {false, true})
    for (const int seqlen_new : {0, 2}) {
      Cache c = make_cache(rng_, 3, paged, seqlen_new);
      const at::Tensor k_start = c.k_cache.clone(), v_start = c.v_cache.clone();
      const auto refill = [&] {
        c.cache_seqlens.copy_(at::randint(0, c.capacity() - seqlen_new + 1, c.cache_seqlens.sizes(), kInt));
        if (paged) c.block_table.copy_(c.block_table.flip(0));
        c.k_cache.copy_(k_start), c.v_cache.copy_(v_start);  // the eager call appends to the same cache
        c.q.copy_(at::randn_like(c.q));
      };
      expect_replay_equals_eager(std::string("kvcache ") + (paged ? "paged" : "contiguous") + " append " +
                                     std::to_string(seqlen_new),
                                 [&] {
                                   if (seqlen_new > 0) c.k_cache.copy_(k_start), c.v_cache.copy_(v_start);
                                   const AttentionOutput r = attention_with_kvcache(c.q, c.k_cache, c.v_cache, c.options());
                                   return std::vector<at::Tensor>{r.out, r.lse, c.k_cache, c.v_cache};
                                 },
                                 refill);
    }
}

}  // namespace
}  // namespace flashlab::testing
