// The KV-cache check's steps (kvcache_check.h): seeded inputs with poisoned
// cache rows, the run through attention_with_kvcache_into, the reference, the
// forward's pass rule on out and lse, and the caches compared bitwise.
#include "flashlab/harness/kvcache_check.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <iomanip>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "common/visible_keys.h"
#include "flashlab/cuda_check.h"
#include "flashlab/harness/event_timer.h"
#include "flashlab/harness/random_inputs.h"
#include "check_pipeline.h"
#include "json_text.h"

namespace flashlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Streams apart from Q, K, V's (the lengths and the page shuffle).
constexpr uint64_t kLengthStream = 0x6b765f6c656e6774ULL;
constexpr uint64_t kPageStream = 0x6b765f7061676573ULL;

std::string join(const std::vector<int>& values, size_t limit = 16) {
  std::string text;
  for (size_t index = 0; index < values.size() && index < limit; ++index)
    text += (index == 0 ? "" : ",") + std::to_string(values[index]);
  if (values.size() > limit) text += ",... (" + std::to_string(values.size()) + " sequences)";
  return text;
}

// The elements' bit patterns as integers (NaN poison compares equal to itself).
at::Tensor bit_patterns(const at::Tensor& values) {
  return values.element_size() == 2 ? values.view(at::kShort) : values.view(at::kInt);
}

uint32_t bits_at(const at::Tensor& values, int64_t i0, int64_t row, int64_t head, int64_t col) {
  const int64_t bits = bit_patterns(values)[i0][row][head][col].item<int64_t>();
  return static_cast<uint32_t>(bits) & (values.element_size() == 2 ? 0xffffu : 0xffffffffu);
}

std::string hex(uint32_t bits) {
  std::ostringstream text;
  text << "0x" << std::hex << bits;
  return text.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// The spec.

int KvCacheSpec::pages_per_sequence() const {
  return paged() ? resolved_capacity() / page_size : 0;
}

int KvCacheSpec::resolved_capacity() const {
  int rows = capacity;
  if (rows <= 0) {
    rows = 1;
    for (const int length : cache_seqlens) rows = std::max(rows, length + seqlen_new);
  }
  if (paged()) rows = (rows + page_size - 1) / page_size * page_size;
  return rows;
}

std::string KvCacheSpec::invalid_reason() const {
  if (batch < 1 || heads < 1 || kv_heads < 1 || seqlen_q < 1 || head_dim < 1)
    return "batch, heads, kv_heads, seqlen_q and head_dim must all be >= 1";
  if (page_size < 0) return "page_size must be >= 0 (0: a contiguous cache); got " + std::to_string(page_size);
  if (num_splits < 0) return "num_splits must be >= 0 (0: the kernel's heuristic); got " + std::to_string(num_splits);
  if (seqlen_new < 0) return "seqlen_new must be >= 0; got " + std::to_string(seqlen_new);
  if (cache_seqlens.empty()) {
    if (seqlen_new > 0)
      return "appending " + std::to_string(seqlen_new) +
             " rows needs cache_seqlens (where each sequence's new rows go); got none";
    if (capacity < 1) return "a full cache (no cache_seqlens) needs a capacity >= 1; got " + std::to_string(capacity);
    return {};
  }
  if (static_cast<int>(cache_seqlens.size()) != batch)
    return "cache_seqlens gives " + std::to_string(cache_seqlens.size()) + " lengths for batch " +
           std::to_string(batch) + "; expected one per sequence";
  const int rows = resolved_capacity();
  for (size_t b = 0; b < cache_seqlens.size(); ++b) {
    if (cache_seqlens[b] < 0)
      return "cache_seqlens[" + std::to_string(b) + "] must be >= 0; got " + std::to_string(cache_seqlens[b]);
    if (static_cast<int64_t>(cache_seqlens[b]) + seqlen_new > rows)
      return "cache_seqlens[" + std::to_string(b) + "] " + std::to_string(cache_seqlens[b]) + " plus " +
             std::to_string(seqlen_new) + " appended rows is " +
             std::to_string(static_cast<int64_t>(cache_seqlens[b]) + seqlen_new) +
             " keys, more than the cache capacity of " + std::to_string(rows) + " rows";
  }
  return {};
}

std::string KvCacheSpec::describe() const {
  std::ostringstream text;
  text << "batch " << batch << ", heads " << heads << "/" << kv_heads << ", seqlen_q " << seqlen_q
       << ", head_dim " << head_dim << ", " << c10::toString(dtype) << (causal ? ", causal" : "");
  if (window_left >= 0 || window_right >= 0)
    text << ", window (" << window_left << ", " << window_right << ")";
  if (softmax_scale) text << ", softmax_scale " << *softmax_scale;
  if (paged())
    text << ", paged cache " << pages_per_sequence() << " pages x " << page_size << " rows a sequence";
  else
    text << ", contiguous cache";
  text << " (capacity " << resolved_capacity() << ")";
  if (cache_seqlens.empty())
    text << ", every cache full";
  else
    text << ", cache_seqlens [" << join(cache_seqlens) << "]";
  if (seqlen_new > 0) text << ", append " << seqlen_new;
  if (num_splits > 0) text << ", num_splits " << num_splits;
  if (softcap != 0.0) text << ", softcap " << softcap;
  if (alibi != ProblemSpec::Alibi::none)
    text << (alibi == ProblemSpec::Alibi::per_head ? ", alibi per head" : ", alibi per sequence and head");
  if (sinks) text << ", sinks";
  text << ", seed " << seed;
  return text.str();
}

// The same options as the problem's own (ProblemSpec::attention_options),
// with softcap; the slopes and sinks are tensors (KvCacheTensors::options).
AttentionOptions KvCacheSpec::attention_options() const {
  ProblemSpec plain = problem_spec();
  plain.softcap = 0.0;
  plain.alibi = ProblemSpec::Alibi::none;
  plain.sinks = false;
  AttentionOptions options = plain.attention_options();
  options.softcap = softcap;
  return options;
}

ProblemSpec KvCacheSpec::problem_spec() const {
  ProblemSpec spec;
  spec.kernel = kernel;
  spec.batch = batch, spec.heads = heads, spec.kv_heads = kv_heads;
  spec.seqlen_q = seqlen_q, spec.seqlen_k = resolved_capacity(), spec.head_dim = head_dim;
  spec.dtype = dtype;
  spec.causal = causal;
  spec.softmax_scale = softmax_scale;
  spec.window_left = window_left, spec.window_right = window_right;
  spec.seed = seed;
  spec.float64_reference = float64_reference;
  spec.softcap = softcap, spec.alibi = alibi, spec.sinks = sinks;
  return spec;
}

std::vector<int> random_cache_seqlens(int batch, int capacity, int seqlen_new, uint64_t seed) {
  std::mt19937_64 generator(seed ^ kLengthStream);
  std::uniform_int_distribution<int> length(0, std::max(0, capacity - seqlen_new));
  std::vector<int> lengths(batch);
  for (int& value : lengths) value = length(generator);
  return lengths;
}

// ---------------------------------------------------------------------------
// Inputs.

KvCacheTensors make_kvcache_inputs(const KvCacheSpec& spec, at::Device device, bool random) {
  const std::string invalid = spec.invalid_reason();
  TORCH_CHECK(invalid.empty(), "invalid KV-cache problem: ", invalid);
  const int64_t batch = spec.batch, capacity = spec.resolved_capacity(), seqlen_new = spec.seqlen_new;
  const int64_t kv_heads = spec.kv_heads, head_dim = spec.head_dim;
  const int64_t q_count = batch * spec.seqlen_q * spec.heads * head_dim;
  const int64_t cache_count = batch * capacity * kv_heads * head_dim;
  const int64_t new_count = batch * seqlen_new * kv_heads * head_dim;
  const auto options = at::TensorOptions().dtype(spec.dtype).device(device);
  const auto int_options = at::TensorOptions().dtype(at::kInt);

  // One generator draws everything back to back (seeding is the expensive part).
  const int64_t total = q_count + 2 * cache_count + 2 * new_count;
  const at::Tensor pool = random ? mt19937_normal({total}, spec.seed, device).to(spec.dtype)
                                 : at::empty({total}, options);
  KvCacheTensors inputs;
  {  // the slopes and sinks, as the forward's problem draws them
    ProblemInputs modifications;
    draw_score_modifications(spec.problem_spec(), device, modifications, random);
    inputs.alibi_slopes = modifications.alibi_slopes;
    inputs.sinks = modifications.sinks;
  }
  int64_t offset = 0;
  const auto take = [&](std::vector<int64_t> shape, int64_t count) {
    const at::Tensor part = pool.narrow(0, offset, count).view(shape);
    offset += count;
    return part;
  };
  inputs.q = take({batch, spec.seqlen_q, spec.heads, head_dim}, q_count);
  // The caches get storage of their own: a stray write lands in them, where the
  // cache comparison sees it, or outside any tensor, where compute-sanitizer does.
  // (Shapes only: no copy, no values.)
  const auto own = [&](const at::Tensor& part) { return random ? part.clone() : part; };
  at::Tensor k_logical = own(take({batch, capacity, kv_heads, head_dim}, cache_count));
  at::Tensor v_logical = own(take({batch, capacity, kv_heads, head_dim}, cache_count));
  if (seqlen_new > 0) {
    inputs.k_new = take({batch, seqlen_new, kv_heads, head_dim}, new_count);
    inputs.v_new = take({batch, seqlen_new, kv_heads, head_dim}, new_count);
  }

  std::vector<int> cached(spec.cache_seqlens.begin(), spec.cache_seqlens.end());
  if (!cached.empty()) inputs.cache_seqlens = at::tensor(cached, int_options).to(device);
  if (cached.empty()) cached.assign(batch, static_cast<int>(capacity));
  // Rows past the cached keys hold no key yet: NaN, until the append writes some.
  if (random)
    for (int64_t b = 0; b < batch; ++b) {
      k_logical[b].narrow(0, cached[b], capacity - cached[b]).fill_(kNaN);
      v_logical[b].narrow(0, cached[b], capacity - cached[b]).fill_(kNaN);
    }
  if (!spec.paged()) {
    inputs.k_cache = k_logical;
    inputs.v_cache = v_logical;
    return inputs;
  }

  // Paged: the sequences' pages are a seeded shuffle of the cache's pages; one
  // more NaN page, used by no sequence, is where the block-table entries past
  // a sequence's keys point (a kernel that follows them reads NaN, not
  // another sequence's keys, and stays inside the cache).
  const int64_t page_size = spec.page_size, width = spec.pages_per_sequence();
  const int64_t num_pages = batch * width + 1;
  std::vector<int> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937_64(spec.seed ^ kPageStream));
  const int unused_page = pages.back();
  std::vector<int> table(batch * width);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t j = 0; j < width; ++j)
      table[b * width + j] = j * page_size < cached[b] + seqlen_new ? pages[b * width + j] : unused_page;
  inputs.block_table = at::tensor(table, int_options).view({batch, width}).to(device);
  inputs.k_cache = random ? at::full({num_pages, page_size, kv_heads, head_dim}, kNaN, options)
                          : at::empty({num_pages, page_size, kv_heads, head_dim}, options);
  inputs.v_cache = random ? at::full({num_pages, page_size, kv_heads, head_dim}, kNaN, options)
                          : at::empty({num_pages, page_size, kv_heads, head_dim}, options);
  if (random) {
    // Page pages[b * width + j] holds logical rows j * page_size ... of sequence b.
    const at::Tensor destination =
        at::tensor(std::vector<int64_t>(pages.begin(), pages.begin() + batch * width),
                   at::TensorOptions().dtype(at::kLong)).to(device);
    inputs.k_cache.index_copy_(0, destination, k_logical.view({batch * width, page_size, kv_heads, head_dim}));
    inputs.v_cache.index_copy_(0, destination, v_logical.view({batch * width, page_size, kv_heads, head_dim}));
  }
  return inputs;
}

std::string kvcache_unsupported_reason(const KernelVariant& kernel, const KvCacheSpec& spec,
                                       int compute_capability) {
  const std::string invalid = spec.invalid_reason();
  if (!invalid.empty()) return invalid;
  if (kernel.kvcache_launch == nullptr)
    return cannot_run_reason(kernel, KvCacheParams{});  // the op library's "<kernel> has no KV-cache path; ..."
  // Shapes only, one sequence (support does not depend on the batch count).
  KvCacheSpec one = spec;
  one.batch = 1;
  if (!one.cache_seqlens.empty())
    one.cache_seqlens = {*std::max_element(spec.cache_seqlens.begin(), spec.cache_seqlens.end())};
  one.capacity = spec.resolved_capacity();
  const KvCacheTensors inputs = make_kvcache_inputs(one, at::kCPU, /*random=*/false);
  KvCacheParams params = kvcache_params(one, inputs);
  params.batch = spec.batch;
  params.device_compute_capability = compute_capability;
  if (kernel.kvcache_max_splits != nullptr && spec.num_splits > kernel.kvcache_max_splits(params))
    return kernel.name + " takes num_splits 0 (its heuristic) or 1 to " +
           std::to_string(kernel.kvcache_max_splits(params)) + "; got " + std::to_string(spec.num_splits);
  return cannot_run_reason(kernel, params);  // the op library's own words (its KV-cache mode)
}

const KernelVariant& resolve_kvcache_kernel(const KvCacheSpec& spec, const KvCacheTensors& inputs) {
  return select_kvcache_kernel(kvcache_params(spec, inputs), spec.kernel);
}

KvCacheParams kvcache_params(const KvCacheSpec& spec, const KvCacheTensors& inputs,
                             const at::Tensor& out, const at::Tensor& lse) {
  return make_kvcache_params(inputs.q, inputs.k_cache, inputs.v_cache, out, lse,
                             inputs.options(spec.attention_options(), spec.num_splits));
}

KvCacheTensors copy_caches(const KvCacheTensors& inputs) {
  KvCacheTensors copy = inputs;
  copy.k_cache = inputs.k_cache.clone();
  copy.v_cache = inputs.v_cache.clone();
  return copy;
}

ForwardOutputs poisoned_kvcache_outputs(const KvCacheSpec& spec, const KvCacheTensors& inputs) {
  return {poisoned(inputs.q.sizes(), inputs.q.options()),
          poisoned({spec.batch, spec.heads, spec.seqlen_q}, inputs.q.options().dtype(at::kFloat))};
}

void run_kvcache(const KvCacheSpec& spec, const KvCacheTensors& inputs, const ForwardOutputs& outputs) {
  attention_with_kvcache_into(inputs.q, inputs.k_cache, inputs.v_cache, outputs.out, outputs.lse,
                              inputs.options(spec.attention_options(), spec.num_splits));
}

namespace {

// Every defined tensor of `tensors` on `device` (undefined ones stay undefined).
KvCacheTensors tensors_on(const KvCacheTensors& tensors, at::Device device) {
  const auto to = [&](const at::Tensor& tensor) { return tensor.defined() ? tensor.to(device) : tensor; };
  return {to(tensors.q),         to(tensors.k_cache), to(tensors.v_cache), to(tensors.cache_seqlens),
          to(tensors.block_table), to(tensors.k_new),   to(tensors.v_new),   to(tensors.alibi_slopes),
          to(tensors.sinks)};
}
ReferenceOutput output_on(const ReferenceOutput& output, at::Device device) {
  return {output.out.to(device), output.lse.to(device)};
}

}  // namespace

KvCacheExpected reference_kvcache(const KvCacheSpec& spec, const KvCacheTensors& before,
                                  const KvCacheParams& params) {
  ReferenceOptions options;
  options.softmax_scale = params.softmax_scale;
  options.window_left = params.window_left;
  options.window_right = params.window_right;
  const at::Device device = before.q.device();
  const KvCacheTensors source = spec.cpu_reference ? tensors_on(before, at::kCPU) : before;
  options.modification.softcap = spec.softcap;
  options.modification.alibi_slopes = source.alibi_slopes;
  options.modification.sinks = source.sinks;
  KvCacheExpected expected;
  options.compute_dtype = (spec.float64_reference || spec.dtype == at::kFloat) ? at::kDouble : at::kFloat;
  expected.reference = reference_attention_kvcache(source, options);
  options.compute_dtype = spec.dtype;
  expected.same_precision = reference_attention_kvcache(source, options).output;
  if (spec.cpu_reference) {  // compared where the kernel's outputs are
    KvCacheReference& reference = expected.reference;
    reference.k_cache = reference.k_cache.to(device);
    reference.v_cache = reference.v_cache.to(device);
    reference.appended = reference.appended.to(device);
    reference.output = output_on(reference.output, device);
    expected.same_precision = output_on(expected.same_precision, device);
  }
  return expected;
}

ForwardTolerance kvcache_tolerance(const KvCacheSpec& spec, const KvCacheExpected& expected) {
  return forward_tolerance(spec.problem_spec(), ForwardReference{expected.reference.output, expected.same_precision});
}

// ---------------------------------------------------------------------------
// Comparisons.

CacheComparison compare_cache(const std::string& name, const at::Tensor& actual,
                              const at::Tensor& expected, const at::Tensor& appended,
                              const at::Tensor& block_table, const std::vector<int64_t>& key_lengths) {
  TORCH_CHECK(actual.sizes() == expected.sizes() && actual.scalar_type() == expected.scalar_type(),
              "compare_cache: '", name, "' differs in shape or dtype: actual ", actual.sizes(), " ",
              actual.scalar_type(), ", expected ", expected.sizes(), " ", expected.scalar_type());
  CacheComparison comparison;
  comparison.name = name;
  comparison.paged = block_table.defined();
  comparison.total = actual.numel();
  const at::Tensor differ = bit_patterns(actual.contiguous()) != bit_patterns(expected.contiguous());
  const at::Tensor rows_appended = appended.to(differ.device()).view({actual.size(0), actual.size(1), 1, 1});
  const int64_t per_row = actual.size(2) * actual.size(3);
  comparison.appended_elements = appended.sum().item<int64_t>() * per_row;
  comparison.appended_differing = (differ & rows_appended).sum().item<int64_t>();
  comparison.other_differing = (differ & rows_appended.logical_not()).sum().item<int64_t>();
  if (comparison.appended_differing + comparison.other_differing == 0) return comparison;

  // The first differing element in (batch or page, row, head, col) order.
  const int64_t flat = differ.reshape({-1}).to(at::kByte).argmax().item<int64_t>();
  CacheDifference at;
  at.col = flat % actual.size(3);
  at.head = flat / actual.size(3) % actual.size(2);
  at.row = flat / per_row % actual.size(1);
  at.index0 = flat / (per_row * actual.size(1));
  at.actual = actual[at.index0][at.row][at.head][at.col].item<double>();
  at.expected = expected[at.index0][at.row][at.head][at.col].item<double>();
  at.actual_bits = bits_at(actual, at.index0, at.row, at.head, at.col);
  at.expected_bits = bits_at(expected, at.index0, at.row, at.head, at.col);
  at.appended = appended[at.index0][at.row].item<bool>();
  if (!comparison.paged) {
    at.sequence = at.index0, at.logical_row = at.row;
  } else {
    // The block-table entry whose page this is, preferring one within its
    // sequence's keys (the unused page is named by many entries past them).
    const at::Tensor table = block_table.to(at::kCPU, at::kLong).contiguous();
    const int64_t* pages = table.data_ptr<int64_t>();
    for (int64_t b = 0; b < table.size(0) && at.sequence < 0; ++b)
      for (int64_t j = 0; j < table.size(1); ++j) {
        const int64_t row = j * actual.size(1) + at.row;
        if (pages[b * table.size(1) + j] == at.index0 && row < key_lengths[b]) {
          at.sequence = b, at.logical_row = row;
          break;
        }
      }
  }
  if (at.sequence >= 0) at.sequence_keys = key_lengths[at.sequence];
  comparison.first_difference = at;
  return comparison;
}

std::string CacheComparison::format() const {
  std::ostringstream text;
  text << std::setprecision(6) << name << ": " << (passed() ? "PASS" : "FAIL") << "  ";
  if (appended_elements > 0)
    text << appended_differing << "/" << appended_elements << " appended elements differ from "
         << (name == "v_cache" ? "v_new" : "k_new") << ", ";
  else
    text << "nothing appended, ";
  text << other_differing << "/" << total - appended_elements
       << " other elements changed (bitwise, against a copy taken before the call)\n";
  if (!first_difference) return text.str();
  const CacheDifference& at = *first_difference;
  text << "  first difference at (" << (paged ? "page " : "batch ") << at.index0 << ", row " << at.row
       << ", head " << at.head << ", col " << at.col << "): got " << at.actual << " ("
       << hex(at.actual_bits) << "), expected " << at.expected << " (" << hex(at.expected_bits) << ")\n";
  text << "  " << (at.appended ? "an appended row: must equal the new row" : "outside the append: must stay as it was");
  if (at.sequence < 0)
    text << "; a page that no sequence's keys reach\n";
  else
    text << "; sequence " << at.sequence << ", row " << at.logical_row << " of its " << at.sequence_keys
         << " keys" << (at.logical_row >= at.sequence_keys ? " (past them)" : "") << "\n";
  return text.str();
}

std::string CacheComparison::to_json() const {
  std::ostringstream text;
  text << "{\"passed\": " << json::boolean(passed()) << ", \"appended_elements\": " << appended_elements
       << ", \"appended_differing\": " << appended_differing << ", \"other_differing\": " << other_differing
       << ", \"total\": " << total << ", \"first_difference\": ";
  if (!first_difference) {
    text << "null}";
    return text.str();
  }
  const CacheDifference& at = *first_difference;
  text << "{\"" << (paged ? "page" : "batch") << "\": " << at.index0 << ", \"row\": " << at.row
       << ", \"head\": " << at.head << ", \"col\": " << at.col << ", \"actual_bits\": " << at.actual_bits
       << ", \"expected_bits\": " << at.expected_bits << ", \"appended\": " << json::boolean(at.appended)
       << ", \"sequence\": " << at.sequence << ", \"sequence_row\": " << at.logical_row << "}}";
  return text.str();
}

KvCacheComparison compare_kvcache(const KvCacheSpec& spec, const KvCacheTensors& inputs,
                                  const ForwardOutputs& outputs, const KvCacheExpected& expected,
                                  const ForwardTolerance& tolerance) {
  // No tiles in the element report: a split-KV kernel's tiles are packed rows
  // of one sequence, which kvcache_row_context names instead.
  TileContext context;
  context.seqlen_q = spec.seqlen_q;
  const ReferenceOutput& reference = expected.reference.output;
  KvCacheComparison comparison{
      compare_rows("out", outputs.out, reference.out, tolerance.out.bound(), context),
      compare_lse_rows("lse", outputs.lse, reference.lse, tolerance.lse.bound(), context), {}, {}};
  const std::vector<int64_t> keys = inputs.key_lengths();
  comparison.k_cache = compare_cache("k_cache", inputs.k_cache, expected.reference.k_cache,
                                     expected.reference.appended, inputs.block_table, keys);
  comparison.v_cache = compare_cache("v_cache", inputs.v_cache, expected.reference.v_cache,
                                     expected.reference.appended, inputs.block_table, keys);
  if (comparison.out.nan_count + comparison.out.inf_count + comparison.lse.nan_count +
          comparison.lse.inf_count > 0) {
    // NaN/inf origin, the sequences as a variable-length batch of their valid keys.
    OriginInputs origin;
    const int64_t batch = spec.batch, rows = spec.seqlen_q * batch;
    origin.q = inputs.q.reshape({rows, spec.heads, spec.head_dim}).to(at::kCPU, at::kFloat);
    std::vector<at::Tensor> k, v;
    origin.cu_seqlens_q.push_back(0);
    origin.cu_seqlens_k.push_back(0);
    for (int64_t b = 0; b < batch; ++b) {
      k.push_back(cache_rows(inputs.k_cache, inputs.block_table, b, keys[b]));
      v.push_back(cache_rows(inputs.v_cache, inputs.block_table, b, keys[b]));
      origin.cu_seqlens_q.push_back(origin.cu_seqlens_q.back() + spec.seqlen_q);
      origin.cu_seqlens_k.push_back(origin.cu_seqlens_k.back() + static_cast<int>(keys[b]));
    }
    origin.k = at::cat(k).to(at::kCPU, at::kFloat);
    origin.v = at::cat(v).to(at::kCPU, at::kFloat);
    origin.window_left = spec.window_left;
    origin.window_right = spec.causal ? 0 : spec.window_right;
    const auto packed = [&](const at::Tensor& out) { return out.reshape({rows, spec.heads, spec.head_dim}); };
    const auto packed_lse = [&](const at::Tensor& lse) { return lse.permute({1, 0, 2}).reshape({spec.heads, rows}); };
    explain_nonfinite(comparison.out, packed(outputs.out), packed(reference.out), origin, RowKind::query);
    explain_nonfinite(comparison.lse, packed_lse(outputs.lse), packed_lse(reference.lse), origin, RowKind::lse);
  }
  return comparison;
}

std::string kvcache_row_context(const KvCacheSpec& spec, const std::vector<int64_t>& cached_lengths,
                                const TileShape& tiles, const ElementPosition& at) {
  const int64_t cached = cached_lengths.at(at.batch), keys = cached + spec.seqlen_new;
  const int group = spec.heads / spec.kv_heads;
  std::ostringstream text;
  text << "  sequence " << at.batch << " attends to " << keys << " keys (" << cached << " cached + "
       << spec.seqlen_new << " appended); row " << at.row << " of head " << at.head << " (kv head "
       << at.head / group << ") ";
  const KeyRange visible = visible_keys(static_cast<int>(at.row), spec.seqlen_q, static_cast<int>(keys),
                                        spec.window_left, spec.causal ? 0 : spec.window_right);
  if (visible.empty())
    text << "sees no key (out 0, lse -inf)\n";
  else
    text << "sees keys " << visible.first << ".." << visible.last << "\n";
  const int64_t packed = at.row * group + at.head % group;
  text << "  its packed row " << packed << " (row x " << group << " + head % " << group << ")";
  if (tiles.block_q > 0) text << " lies in packed-row tile " << packed / tiles.block_q << " (block_q " << tiles.block_q << ")";
  if (tiles.block_k > 0 && !visible.empty())
    text << "; its keys lie in key blocks " << visible.first / tiles.block_k << ".."
         << visible.last / tiles.block_k << " (block_k " << tiles.block_k << ")";
  text << "\n";
  return text.str();
}

// ---------------------------------------------------------------------------
// The check.

int64_t kvcache_grid_blocks(const KvCacheSpec& spec, int num_splits, const TileShape& tiles) {
  const int64_t packed_rows = static_cast<int64_t>(spec.seqlen_q) * (spec.heads / spec.kv_heads);
  const int64_t row_tiles = tiles.block_q > 0 ? (packed_rows + tiles.block_q - 1) / tiles.block_q : packed_rows;
  return static_cast<int64_t>(num_splits) * row_tiles * spec.batch * spec.kv_heads;
}

BlockTimeline record_block_timeline(const KernelVariant& kernel, KvCacheParams params, int64_t grid_blocks) {
  TORCH_CHECK(kernel.supports_block_timeline, "kernel ", kernel.name,
              " records no block timeline (supports_block_timeline is off)");
  TORCH_CHECK(grid_blocks > 0, "record_block_timeline needs the grid's block count; got ", grid_blocks);
  // On the kernel's device: the current one (check_kvcache makes the inputs' current).
  const int device = c10::cuda::current_device();
  const at::Tensor slots =
      at::zeros({grid_blocks * kBlockTimelineSlots}, at::TensorOptions().device(at::kCUDA, device).dtype(at::kLong));
  params.block_timeline = reinterpret_cast<uint64_t*>(slots.data_ptr<int64_t>());
  params.block_timeline_blocks = grid_blocks;
  int sm_count = 0;
  FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  L2Flush{}();  // the K/V come from DRAM, as in a decode step (and in flashlab-bench --decode)
  run_kvcache_kernel(kernel, params);
  FLASHLAB_CUDA_CHECK(cudaDeviceSynchronize());
  const at::Tensor host = slots.to(at::kCPU);
  const int64_t* raw = host.data_ptr<int64_t>();
  return block_timeline_from_slots(std::vector<uint64_t>(raw, raw + host.numel()), sm_count);
}

namespace {

// check_kvcache's steps (check_pipeline.h): the call through the public entry
// (run_kvcache), the caches snapshotted before it for the reference.
struct KvCacheCheck {
  using Spec = KvCacheSpec;
  using Options = CheckOptions;
  using Inputs = KvCacheTensors;
  struct Run {
    KvCacheParams params;
    KvCacheTensors before;  // the caches as they were before the call
    ForwardOutputs outputs;
  };
  using Reference = KvCacheExpected;
  using Result = KvCacheCheckResult;
  static constexpr const char* kCheck = "check_kvcache";

  static Inputs inputs(const Spec& spec, at::Device device) { return make_kvcache_inputs(spec, device); }
  static const KernelVariant& kernel(const Spec& spec, const Inputs& inputs) {
    return resolve_kvcache_kernel(spec, inputs);
  }
  static Run run(const KernelVariant&, const Spec& spec, const Inputs& inputs, const Options&) {
    Run run{kvcache_params(spec, inputs), copy_caches(inputs), poisoned_kvcache_outputs(spec, inputs)};
    run_kvcache(spec, inputs, run.outputs);
    return run;
  }
  static Reference reference(const Spec& spec, const Inputs&, const Run& run) {
    return reference_kvcache(spec, run.before, run.params);
  }
  static Result compare(const KernelVariant& kernel, const Spec& spec, const Inputs& inputs, const Run& run,
                        const Reference& expected, const Options&) {
    const KvCacheParams& params = run.params;
    const ForwardTolerance tolerance = kvcache_tolerance(spec, expected);
    KvCacheCheckResult result;
    result.kernel = kernel.name;
    result.problem = spec.describe();
    result.tiles = kernel.kvcache_tile_shape != nullptr ? kernel.kvcache_tile_shape(params) : TileShape{};
    result.num_splits = kvcache_splits(kernel, params);
    result.num_splits_chosen = spec.num_splits == 0;
    result.max_splits = kernel.kvcache_max_splits != nullptr ? kernel.kvcache_max_splits(params) : 0;
    KvCacheParams launched = params;
    launched.num_splits = result.num_splits;
    result.workspace_bytes = kernel.kvcache_workspace_bytes != nullptr
                                 ? static_cast<int64_t>(kernel.kvcache_workspace_bytes(launched))
                                 : 0;
    if (kernel.kvcache_launch_summary != nullptr) result.launch = kernel.kvcache_launch_summary(launched);
    result.cached_lengths = inputs.cached_lengths();
    result.tolerance = tolerance;
    KvCacheComparison comparison = compare_kvcache(spec, inputs, run.outputs, expected, tolerance);
    result.out = std::move(comparison.out);
    result.lse = std::move(comparison.lse);
    result.k_cache = std::move(comparison.k_cache);
    result.v_cache = std::move(comparison.v_cache);
    if (result.out.first_bad)
      result.out_context = kvcache_row_context(spec, result.cached_lengths, result.tiles, *result.out.first_bad);
    if (result.lse.first_bad)
      result.lse_context = kvcache_row_context(spec, result.cached_lengths, result.tiles, *result.lse.first_bad);
    return result;
  }
  // The launch alone: the public entry's checks are not the kernel's time.
  static void time(Result& result, const KernelVariant& kernel, const Spec& spec, const Inputs& inputs,
                   const Run& run, const Options& options) {
    const KvCacheParams timed = kvcache_params(spec, inputs, run.outputs.out, run.outputs.lse);
    result.kernel_ms = EventTimer().median_ms([&] { run_kvcache_kernel(kernel, timed); }, options.timed_launches);
  }
  static void extras(Result& result, const KernelVariant& kernel, const Spec& spec, const Inputs& inputs,
                     const Run& run, const Options& options) {
    if (options.block_timeline)
      result.block_timeline =
          record_block_timeline(kernel, kvcache_params(spec, inputs, run.outputs.out, run.outputs.lse),
                                kvcache_grid_blocks(spec, result.num_splits, result.tiles));
  }
};

}  // namespace

KvCacheCheckResult check_kvcache(const KvCacheSpec& spec, const CheckOptions& check_options) {
  return harness_detail::run_check<KvCacheCheck>(spec, check_options);
}

// check_kvcache's run and reference steps alone, on the inputs' device.
KvCacheCall call_against_reference(const KvCacheSpec& spec, const KvCacheTensors& inputs) {
  const c10::cuda::CUDAGuard device_guard(inputs.q.device());
  const KvCacheCheck::Run run = KvCacheCheck::run(resolve_kvcache_kernel(spec, inputs), spec, inputs, {});
  FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream().stream()));
  return {run.params, run.outputs, KvCacheCheck::reference(spec, inputs, run)};
}

std::string KvCacheCheckResult::format() const {
  std::ostringstream text;
  text << std::setprecision(4);
  text << "kernel  " << kernel << " (kvcache tiles " << tiles.block_q << "x" << tiles.block_k
       << ": " << tiles.block_q << " packed rows (query row, query head of a kv head) a block, "
       << tiles.block_k << " keys a step)\n"
       << "problem " << problem << "\n"
       << "num_splits " << num_splits
       << (num_splits_chosen ? " (the kernel's heuristic)" : " (as given)") << " of at most " << max_splits
       << ", workspace " << workspace_bytes << " bytes\n";
  if (!launch.empty()) text << "launch  " << launch << "\n";
  text << "torch same-precision math error " << tolerance.out.same_precision_err << ", rounding atol "
       << tolerance.out.rounding_atol << " -> output tolerance " << out.tolerance
       << " (2 x math error + flash-attn's fwd_atol + 4 float32 ulps)\n"
       << out.format() << out_context << lse.format() << lse_context << k_cache.format()
       << v_cache.format();
  if (kernel_ms >= 0) text << "kernel time " << kernel_ms << " ms (median)\n";
  if (block_timeline) text << format_block_timeline(summarize_block_timeline(*block_timeline));
  text << (passed() ? "PASSED" : "FAILED") << "\n";
  return text.str();
}

std::string KvCacheCheckResult::to_json() const {
  std::ostringstream text;
  text << "{\"passed\": " << json::boolean(passed()) << ", \"kernel\": " << json::string(kernel)
       << ", \"problem\": " << json::string(problem) << ", \"num_splits\": " << num_splits
       << ", \"num_splits_chosen\": " << json::boolean(num_splits_chosen) << ", \"max_splits\": " << max_splits
       << ", \"workspace_bytes\": " << workspace_bytes
       << ", \"launch\": " << (launch.empty() ? "null" : json::string(launch)) << ", \"block_q\": " << tiles.block_q
       << ", \"block_k\": " << tiles.block_k << ", \"max_abs_err\": " << json::number(out.max_abs_error)
       << ", \"ref_err\": " << json::number(tolerance.out.same_precision_err)
       << ", \"tolerance\": " << json::number(out.tolerance) << ", \"out\": " << out.to_json()
       << ", \"lse\": " << lse.to_json() << ", \"k_cache\": " << k_cache.to_json()
       << ", \"v_cache\": " << v_cache.to_json()
       << ", \"kernel_ms\": " << (kernel_ms >= 0 ? json::number(kernel_ms) : "null")
       << ", \"block_timeline\": "
       << (block_timeline ? block_timeline_json(summarize_block_timeline(*block_timeline)) : "null") << "}";
  return text.str();
}

}  // namespace flashlab
