// The input checks of attention_with_kvcache that come before the device
// check, provoked on CPU tensors (structure, the kernel's support, the output
// buffers), and the parameter block make_kvcache_params builds. The checks of
// values read on the host (lengths against the capacity, page entries) come
// after the device check: tests/gpu/test_kvcache.cpp, KvCacheValidationOnDevice.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "flashlab/attention.h"
#include "test_support.h"

namespace flashlab {
namespace {

using testing::cpu_tensor;
using testing::expect_rejected;

// A valid problem on the CPU: 2 sequences, 8 heads over 2 kv heads, one query
// row, head_dim 64, fp16; a contiguous cache of 32 rows (or 4 pages of 16,
// paged()), lengths 5 and 20, one appended row. Only the device check rejects it.
struct KvInputs {
  at::Tensor q = cpu_tensor({2, 1, 8, 64});
  at::Tensor k_cache = cpu_tensor({2, 32, 2, 64});
  at::Tensor v_cache = cpu_tensor({2, 32, 2, 64});
  KvCacheOptions options;
  KvInputs() {
    options.cache_seqlens = at::tensor(std::vector<int>{5, 20}, at::kInt);
    options.k_new = cpu_tensor({2, 1, 2, 64});
    options.v_new = cpu_tensor({2, 1, 2, 64});
  }
  KvInputs& paged() {
    k_cache = cpu_tensor({5, 16, 2, 64});
    v_cache = cpu_tensor({5, 16, 2, 64});
    options.block_table = at::tensor(std::vector<int>{0, 3, 4, 1}, at::kInt).view({2, 2});
    return *this;
  }
  void run() const { attention_with_kvcache(q, k_cache, v_cache, options); }
  KvCacheParams params() const { return make_kvcache_params(q, k_cache, v_cache, {}, {}, options); }
};

TEST(KvCacheValidation, ValidProblemReachesTheDeviceCheck) {
  for (const bool paged : {false, true}) {
    KvInputs inputs;
    if (paged) inputs.paged();
    expect_rejected([&] { inputs.run(); }, {"q, k_cache and v_cache must be on a CUDA device", "got cpu"});
  }
}

TEST(KvCacheValidation, RanksMustBeFour) {
  KvInputs q;
  q.q = cpu_tensor({2, 8, 64});
  expect_rejected([&] { q.run(); }, {"q must be 4-D (batch, seqlen_q, heads, head_dim)", "got a 3-D tensor", "[2, 8, 64]"});
  KvInputs contiguous;
  contiguous.k_cache = cpu_tensor({2, 32, 128});
  expect_rejected([&] { contiguous.run(); },
                  {"k_cache must be 4-D (batch, capacity, kv_heads, head_dim)", "got a 3-D tensor"});
  KvInputs paged;
  paged.paged().v_cache = cpu_tensor({5, 16, 128});
  expect_rejected([&] { paged.run(); },
                  {"v_cache must be 4-D (num_pages, page_size, kv_heads, head_dim)", "got a 3-D tensor"});
}

TEST(KvCacheValidation, DtypesMustMatch) {
  KvInputs inputs;
  inputs.v_cache = cpu_tensor({2, 32, 2, 64}, at::kBFloat16);
  expect_rejected([&] { inputs.run(); },
                  {"q, k_cache and v_cache must share one dtype", "q Half", "k_cache Half", "v_cache BFloat16"});
  KvInputs unsupported;
  unsupported.q = cpu_tensor({2, 1, 8, 64}, at::kDouble);
  expect_rejected([&] { unsupported.run(); }, {"q has dtype Double", "Float, Half and BFloat16"});
  KvInputs new_rows;
  new_rows.options.v_new = cpu_tensor({2, 1, 2, 64}, at::kFloat);
  expect_rejected([&] { new_rows.run(); }, {"must have q's dtype Half", "got Half and Float"});
}

TEST(KvCacheValidation, DevicesMustMatch) {
  KvInputs inputs;
  inputs.options.cache_seqlens = at::empty({2}, at::TensorOptions().dtype(at::kInt).device(at::kMeta));
  expect_rejected([&] { inputs.run(); }, {"cache_seqlens must be on q's device cpu", "got meta"});
}

TEST(KvCacheValidation, CacheShapesMustAgree) {
  KvInputs shapes;
  shapes.v_cache = cpu_tensor({2, 31, 2, 64});
  expect_rejected([&] { shapes.run(); }, {"k_cache and v_cache must have the same shape", "[2, 32, 2, 64]", "[2, 31, 2, 64]"});
  KvInputs head_dim;
  head_dim.k_cache = head_dim.v_cache = cpu_tensor({2, 32, 2, 128});
  expect_rejected([&] { head_dim.run(); }, {"k_cache must have q's head_dim 64", "got [2, 32, 2, 128]"});
  KvInputs batch;
  batch.k_cache = batch.v_cache = cpu_tensor({3, 32, 2, 64});
  expect_rejected([&] { batch.run(); },
                  {"a contiguous k_cache must be (batch, capacity, kv_heads, head_dim) with q's batch 2",
                   "got [3, 32, 2, 64]", "(a paged cache needs block_table)"});
}

TEST(KvCacheValidation, HeadsMustBeAMultipleOfKvHeads) {
  KvInputs inputs;
  inputs.k_cache = inputs.v_cache = cpu_tensor({2, 32, 3, 64});
  inputs.options.k_new = inputs.options.v_new = cpu_tensor({2, 1, 3, 64});
  expect_rejected([&] { inputs.run(); },
                  {"q has 8 heads, which is not a multiple of the 3 heads of k_cache and v_cache", "GQA/MQA"});
}

TEST(KvCacheValidation, CacheSeqlensMustBeInt32OfBatchLength) {
  KvInputs dtype;
  dtype.options.cache_seqlens = at::tensor(std::vector<int64_t>{5, 20}, at::kLong);
  expect_rejected([&] { dtype.run(); }, {"cache_seqlens must have dtype Int (int32); got Long"});
  KvInputs shape;
  shape.options.cache_seqlens = at::tensor(std::vector<int>{5, 20, 7}, at::kInt);
  expect_rejected([&] { shape.run(); }, {"cache_seqlens must be 1-D (batch) = (2); got [3]"});
}

TEST(KvCacheValidation, BlockTableMustBeInt32BatchByPages) {
  KvInputs dtype;
  dtype.paged().options.block_table = at::zeros({2, 2}, at::kLong);
  expect_rejected([&] { dtype.run(); }, {"block_table must have dtype Int (int32); got Long"});
  KvInputs shape;
  shape.paged().options.block_table = at::zeros({3, 2}, at::kInt);
  expect_rejected([&] { shape.run(); },
                  {"block_table must be (batch, pages per sequence) = (2, >= 1); got [3, 2]"});
}

TEST(KvCacheValidation, NewKeysAndValuesComeTogetherWithTheirShape) {
  KvInputs only_k;
  only_k.options.v_new.reset();
  expect_rejected([&] { only_k.run(); },
                  {"new keys and values come together: k and v must both be given or both be absent"});
  KvInputs shape;
  shape.options.k_new = shape.options.v_new = cpu_tensor({2, 1, 8, 64});
  expect_rejected([&] { shape.run(); },
                  {"k must be (batch, seqlen_new, kv_heads, head_dim) = (2, seqlen_new, 2, 64)", "got [2, 1, 8, 64]"});
  KvInputs differ;
  differ.options.v_new = cpu_tensor({2, 2, 2, 64});
  expect_rejected([&] { differ.run(); }, {"v must have k's shape [2, 1, 2, 64]", "got [2, 2, 2, 64]"});
  KvInputs without_lengths;
  without_lengths.options.cache_seqlens.reset();
  expect_rejected([&] { without_lengths.run(); }, {"appending k and v needs cache_seqlens"});
  KvInputs too_many;
  too_many.options.k_new = too_many.options.v_new = cpu_tensor({2, 33, 2, 64});
  expect_rejected([&] { too_many.run(); }, {"k has 33 new rows, more than the cache holds (32)"});
}

TEST(KvCacheValidation, NumSplitsWithinTheKernelsRange) {
  KvInputs negative;
  negative.options.num_splits = -1;
  expect_rejected([&] { negative.run(); }, {"num_splits must be 0 (choose) or >= 1; got -1"});
  for (const auto& kernel : registered_kernels()) {
    if (kernel.kvcache_launch == nullptr || kernel.kvcache_max_splits == nullptr) continue;
    SCOPED_TRACE(kernel.name);
    KvInputs above;
    above.options.kernel = kernel.name;
    const int maximum = kernel.kvcache_max_splits(above.params());
    above.options.num_splits = maximum + 1;
    expect_rejected([&] { above.run(); },
                    {"kernel " + kernel.name + " cannot run", "num_splits",
                     "1 to " + std::to_string(maximum) + "; got " + std::to_string(maximum + 1)});
    above.options.num_splits = maximum;  // the maximum itself is taken
    expect_rejected([&] { above.run(); }, {"must be on a CUDA device"});
  }
}

TEST(KvCacheValidation, KernelChoice) {
  KvInputs unknown;
  unknown.options.kernel = "fa9_imaginary";
  expect_rejected([&] { unknown.run(); }, {"unknown kernel 'fa9_imaginary'", registered_kernel_names()});
  for (const auto& kernel : registered_kernels()) {
    if (kernel.kvcache_launch != nullptr) continue;
    KvInputs without;
    without.options.kernel = kernel.name;
    expect_rejected([&] { without.run(); }, {"kernel " + kernel.name + " has no KV-cache path; kernels with one:"});
  }
}

TEST(KvCacheValidation, OutputBuffersMustMatch) {
  KvInputs inputs;
  const at::Tensor lse = at::zeros({2, 8, 1}, at::kFloat);
  expect_rejected([&] {
    attention_with_kvcache_into(inputs.q, inputs.k_cache, inputs.v_cache, cpu_tensor({2, 1, 8, 32}), lse, inputs.options);
  }, {"out must match q in shape and dtype", "[2, 1, 8, 32]"});
  expect_rejected([&] {
    attention_with_kvcache_into(inputs.q, inputs.k_cache, inputs.v_cache, cpu_tensor({2, 1, 8, 64}),
                                at::zeros({2, 1, 8}, at::kFloat), inputs.options);
  }, {"lse must be a contiguous float32 tensor of shape (batch, heads, seqlen_q) = [2, 8, 1]"});
}

TEST(KvCacheValidation, ParamsDescribeTheCache) {
  KvInputs contiguous;
  contiguous.options.num_splits = 3;
  const KvCacheParams flat = contiguous.params();
  EXPECT_FALSE(flat.is_paged());
  EXPECT_EQ(flat.seqlen_k, 32);
  EXPECT_EQ(flat.k_batch_stride, 32 * 2 * 64);
  EXPECT_EQ(flat.seqlen_new, 1);
  EXPECT_EQ(flat.k_new_batch_stride, 2 * 64);
  EXPECT_EQ(flat.k_new_row_stride, 2 * 64);
  EXPECT_EQ(flat.k_new_head_stride, 64);
  EXPECT_EQ(flat.num_splits, 3);
  EXPECT_EQ(flat.cache_seqlens, contiguous.options.cache_seqlens->data_ptr<int>());
  KvInputs paged;
  const KvCacheParams pages = paged.paged().params();
  EXPECT_TRUE(pages.is_paged());
  EXPECT_EQ(pages.page_size, 16);
  EXPECT_EQ(pages.num_pages, 5);
  EXPECT_EQ(pages.block_table_width, 2);
  EXPECT_EQ(pages.block_table_batch_stride, 2);
  EXPECT_EQ(pages.seqlen_k, 32);  // capacity: 2 pages of 16
  EXPECT_EQ(pages.k_batch_stride, 16 * 2 * 64);  // page to page
  EXPECT_EQ(pages.batch, 2);
  EXPECT_EQ(pages.kv_heads, 2);
}

}  // namespace
}  // namespace flashlab
