#include "kernel_cases.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <utility>

#include "flashlab/harness/arguments.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/problem_options.h"

namespace flashlab::testing {
namespace {

using SeqlenPair = std::pair<int, int>;

std::string window_label(int left, int right) {
  const auto side = [](int value) { return value < 0 ? std::string("inf") : std::to_string(value); };
  return "_w" + side(left) + "_" + side(right);
}

std::string seqlen_label(int seqlen_q, int seqlen_k) {
  return "_q" + std::to_string(seqlen_q) + "_k" + std::to_string(seqlen_k);
}

// Adds the case as `<kernel>_<label>` when the kernel takes it on a device of
// this compute capability (0: some device); a backward case when its forward
// and backward both take it.
void add_if_supported(std::vector<KernelCase>& cases, const KernelVariant& kernel,
                      const std::string& label, ProblemSpec spec, int compute_capability,
                      bool backward = false, int runs = 0) {
  spec.kernel = kernel.name;
  const std::string reason = backward ? backward_unsupported_reason(kernel, spec, compute_capability)
                                      : unsupported_reason(kernel, spec, compute_capability);
  if (!reason.empty()) return;
  KernelCase kernel_case;
  kernel_case.name = kernel.name + "_" + label;
  kernel_case.kernel = kernel.name;
  kernel_case.spec = std::move(spec);
  kernel_case.backward = backward;
  kernel_case.runs = runs;
  cases.push_back(std::move(kernel_case));
}

void add_if_backward_supported(std::vector<KernelCase>& cases, const KernelVariant& kernel,
                               const std::string& label, ProblemSpec spec, int compute_capability,
                               int runs = 0) {
  add_if_supported(cases, kernel, label, std::move(spec), compute_capability, /*backward=*/true, runs);
}

std::string masks_label(const ProblemSpec& spec) {
  return std::string(spec.causal ? "_causal" : "") +
         (spec.window_left >= 0 || spec.window_right >= 0
              ? window_label(spec.window_left, spec.window_right)
              : "") +
         (spec.layout == Layout::packed_qkv ? "_packed" : "");
}

struct Lengths {
  std::string label;
  std::vector<int> seqlens_q, seqlens_k;
};

// Empty sequences (first, middle, last), length 1, very unequal lengths, query
// sequences without keys and keys without queries.
const std::vector<Lengths>& varlen_lengths() {
  static const std::vector<Lengths> lengths = {
      {"mixed", {1, 0, 513, 7, 1000}, {1, 0, 513, 7, 1000}},
      {"unequal", {1, 0, 513, 7, 1000}, {300, 5, 0, 1000, 17}},
      {"single1", {1}, {1}},
      {"empty_ends", {0, 64, 129, 0}, {0, 200, 31, 0}},
      {"no_keys", {5, 64, 3}, {0, 0, 0}},
      {"many_short", {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9}, {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4}},
  };
  return lengths;
}

ProblemSpec varlen_spec(const Lengths& lengths, at::ScalarType dtype, int kv_heads, bool causal) {
  ProblemSpec spec;
  spec.heads = 8, spec.kv_heads = kv_heads;
  spec.head_dim = 64;
  spec.seqlens_q = lengths.seqlens_q;
  spec.seqlens_k = lengths.seqlens_k;
  spec.dtype = dtype;
  spec.causal = causal;
  return spec;
}

// The small problem support questions are asked on (heads 2/1, odd seqlens).
ProblemSpec probe_spec(at::ScalarType dtype, int head_dim) {
  ProblemSpec spec;
  spec.batch = 1, spec.heads = 2, spec.kv_heads = 1;
  spec.seqlen_q = 113, spec.seqlen_k = 203;
  spec.head_dim = head_dim;
  spec.dtype = dtype;
  return spec;
}

// The grouped-query problem most matrices vary: 8 query heads over 2 kv heads, head_dim 64.
ProblemSpec grouped_spec(int batch, int seqlen_q, int seqlen_k, at::ScalarType dtype, bool causal = false) {
  ProblemSpec spec;
  spec.batch = batch, spec.heads = 8, spec.kv_heads = 2;
  spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
  spec.head_dim = 64;
  spec.dtype = dtype;
  spec.causal = causal;
  return spec;
}

}  // namespace

void PrintTo(const KernelCase& kernel_case, std::ostream* stream) {
  *stream << kernel_case.kernel << ": " << kernel_case.spec.describe();
}

const char* dtype_label(at::ScalarType dtype) { return dtype_argument(dtype); }

const std::vector<int>& probe_head_dims() {
  // 160, 192 and 224 are taken by no kernel today: they are here so that a
  // kernel which adds one is tested and sanitized without another edit.
  static const std::vector<int> head_dims = {16, 32, 40, 64, 80, 96, 128, 160, 192, 224, 256};
  return head_dims;
}

std::vector<int> supported_head_dims(const KernelVariant& kernel, at::ScalarType dtype,
                                     int compute_capability) {
  std::vector<int> head_dims;
  for (const int head_dim : probe_head_dims()) {
    ProblemSpec spec = probe_spec(dtype, head_dim);
    spec.kernel = kernel.name;
    if (unsupported_reason(kernel, spec, compute_capability).empty()) head_dims.push_back(head_dim);
  }
  return head_dims;
}

std::vector<at::ScalarType> supported_dtypes(const KernelVariant& kernel, int compute_capability) {
  std::vector<at::ScalarType> dtypes;
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
    if (!supported_head_dims(kernel, dtype, compute_capability).empty()) dtypes.push_back(dtype);
  return dtypes;
}

std::vector<KernelCase> correctness_cases(int compute_capability, const Kernels& kernels) {
  const std::vector<SeqlenPair> seqlens = {
      {1, 1}, {7, 7}, {64, 64}, {113, 113}, {256, 256}, {1023, 1023},
      {1, 113}, {7, 256}, {113, 1023}, {1023, 113}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
      for (const auto& [seqlen_q, seqlen_k] : seqlens)
        for (const bool causal : {false, true})
          for (const int kv_heads : {8, 2, 1})
            for (const Layout layout : {Layout::bshd, Layout::packed_qkv}) {
              if (layout == Layout::packed_qkv && seqlen_q != seqlen_k) continue;
              ProblemSpec spec;
              spec.batch = 2, spec.heads = 8, spec.kv_heads = kv_heads;
              spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
              spec.head_dim = 64;
              spec.dtype = dtype;
              spec.causal = causal;
              spec.layout = layout;
              add_if_supported(cases, kernel,
                               std::string(dtype_label(dtype)) + seqlen_label(seqlen_q, seqlen_k) +
                                   "_kv" + std::to_string(kv_heads) + (causal ? "_causal" : "") +
                                   (layout == Layout::packed_qkv ? "_packed" : ""),
                               spec, compute_capability);
            }
  return cases;
}

std::vector<KernelCase> head_dim_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const int head_dim : probe_head_dims())
      for (const bool causal : {false, true}) {
        ProblemSpec spec;
        spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
        spec.seqlen_q = 113, spec.seqlen_k = 300;
        spec.head_dim = head_dim;
        spec.dtype = at::kBFloat16;
        spec.causal = causal;
        add_if_supported(cases, kernel, "d" + std::to_string(head_dim) + (causal ? "_causal" : ""),
                         spec, compute_capability);
      }
  return cases;
}

std::vector<KernelCase> window_cases(int compute_capability, const Kernels& kernels) {
  const std::vector<SeqlenPair> windows = {{64, 0}, {0, 0}, {17, 33}, {-1, 5}, {128, -1}};
  const std::vector<SeqlenPair> seqlens = {{113, 1023}, {1023, 113}, {256, 256}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const auto& [seqlen_q, seqlen_k] : seqlens)
        for (const auto& [left, right] : windows) {
          ProblemSpec spec = grouped_spec(2, seqlen_q, seqlen_k, dtype);
          spec.window_left = left, spec.window_right = right;
          add_if_supported(cases, kernel,
                           std::string(dtype_label(dtype)) + seqlen_label(seqlen_q, seqlen_k) +
                               window_label(left, right),
                           spec, compute_capability);
        }
  return cases;
}

std::vector<KernelCase> varlen_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16})
      for (const auto& lengths : varlen_lengths())
        for (const bool causal : {false, true})
          for (const int kv_heads : {8, 2})
            add_if_supported(cases, kernel,
                             std::string(dtype_label(dtype)) + "_" + lengths.label + "_kv" +
                                 std::to_string(kv_heads) + (causal ? "_causal" : ""),
                             varlen_spec(lengths, dtype, kv_heads, causal), compute_capability);
    // Windows and MQA on the unequal lengths; the packed-qkv layout; other head dims.
    const Lengths& unequal = varlen_lengths()[1];
    for (const auto& [left, right] : std::vector<SeqlenPair>{{17, 33}, {64, 0}, {-1, 5}}) {
      ProblemSpec spec = varlen_spec(unequal, at::kHalf, 1, false);
      spec.window_left = left, spec.window_right = right;
      add_if_supported(cases, kernel, "fp16_unequal_kv1" + window_label(left, right), spec,
                       compute_capability);
    }
    ProblemSpec packed = varlen_spec(varlen_lengths()[0], at::kBFloat16, 2, true);
    packed.layout = Layout::packed_qkv;
    add_if_supported(cases, kernel, "bf16_mixed_kv2_causal_packed", packed, compute_capability);
    for (const int head_dim : {32, 128, 256}) {
      ProblemSpec spec = varlen_spec(unequal, at::kHalf, 2, true);
      spec.head_dim = head_dim;
      add_if_supported(cases, kernel, "fp16_unequal_kv2_causal_d" + std::to_string(head_dim), spec,
                       compute_capability);
    }
  }
  return cases;
}

// Scores of magnitude ~1e4 (standard deviation 8000-10000, extremes ~5e4): a
// kernel that held scores, or scores times log2(e), in fp16 would overflow.
// Either a large softmax_scale on unit-variance inputs, or Q and K scaled by 10
// with softmax_scale 12.5 (raw dot products ~800, still finite in fp16 for the
// same-precision torch reference).
std::vector<KernelCase> large_score_cases(int compute_capability, const Kernels& kernels) {
  struct Scaling {
    std::string label;
    double qk_input_scale, softmax_scale;
  };
  const std::vector<Scaling> scalings = {{"scale1000", 1.0, 1000.0}, {"inputs10_scale12p5", 10.0, 12.5}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const auto& scaling : scalings)
        for (const bool causal : {false, true}) {
          const std::string label = std::string(dtype_label(dtype)) + "_" + scaling.label +
                                    (causal ? "_causal" : "");
          for (const auto& [seqlen_q, seqlen_k] : std::vector<SeqlenPair>{{113, 1023}, {1023, 113}}) {
            ProblemSpec spec;
            spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
            spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
            spec.head_dim = 64;
            spec.dtype = dtype;
            spec.causal = causal;
            spec.qk_input_scale = scaling.qk_input_scale;
            spec.softmax_scale = scaling.softmax_scale;
            add_if_supported(cases, kernel, label + seqlen_label(seqlen_q, seqlen_k), spec,
                             compute_capability);
          }
          ProblemSpec varlen = varlen_spec(varlen_lengths()[1], dtype, 2, causal);
          varlen.qk_input_scale = scaling.qk_input_scale;
          varlen.softmax_scale = scaling.softmax_scale;
          add_if_supported(cases, kernel, label + "_varlen_unequal", varlen, compute_capability);
        }
  // At these magnitudes torch's own fp16/bf16 math rounds the scores by tens of
  // units, so the rule's tolerance is loose. Float32 scores keep the kernel far
  // closer: hold it to a bound that would catch a half-precision score path
  // (measured in emulation: ~0.003 fp16, ~0.008 bf16).
  for (auto& kernel_case : cases) {
    kernel_case.max_abs_error = 0.05;
    kernel_case.max_abs_error_reason =
        "scores ~1e4: float32 score math stays within 0.05, a half-precision score path does not";
  }
  return cases;
}

std::vector<KernelCase> property_cases(int compute_capability, const Kernels& kernels) {
  // 257 rows: several query tiles and a ragged last one; the causality test
  // rewrites keys 130 and later.
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const auto dtype : supported_dtypes(kernel, compute_capability)) {
      const std::vector<int> head_dims = supported_head_dims(kernel, dtype, compute_capability);
      const bool takes_64 = std::find(head_dims.begin(), head_dims.end(), 64) != head_dims.end();
      ProblemSpec spec = grouped_spec(2, 257, 257, dtype);
      spec.head_dim = takes_64 ? 64 : head_dims.front();
      add_if_supported(cases, kernel,
                       std::string(dtype_label(dtype)) + "_d" + std::to_string(spec.head_dim), spec,
                       compute_capability);
    }
  return cases;
}

std::vector<KernelCase> sanitizer_cases(int compute_capability, const Kernels& kernels) {
  // Small odd shapes, cycled over a kernel's (dtype, head dim) pairs so that
  // each kernel meets every shape and every pair meets one shape.
  struct Shape {
    std::string label;
    int batch, heads, kv_heads, seqlen_q, seqlen_k;
    bool causal;
    Layout layout;
    int window_left, window_right;
  };
  const std::vector<Shape> shapes = {
      {"q113_k203", 1, 2, 1, 113, 203, false, Layout::bshd, -1, -1},
      {"q113_k203_causal", 1, 2, 1, 113, 203, true, Layout::bshd, -1, -1},
      {"b2_q7_k113_kv2_causal", 2, 4, 2, 7, 113, true, Layout::bshd, -1, -1},
      {"q113_k113_h4_causal_packed", 1, 4, 1, 113, 113, true, Layout::packed_qkv, -1, -1},
      {"q113_k7", 1, 2, 1, 113, 7, false, Layout::bshd, -1, -1},
      {"q1_k1_kv2", 1, 2, 2, 1, 1, false, Layout::bshd, -1, -1},
      {"q203_k113_w17_33", 1, 2, 1, 203, 113, false, Layout::bshd, 17, 33},
  };
  const auto shaped = [](const Shape& shape, at::ScalarType dtype, int head_dim) {
    ProblemSpec spec;
    spec.batch = shape.batch, spec.heads = shape.heads, spec.kv_heads = shape.kv_heads;
    spec.seqlen_q = shape.seqlen_q, spec.seqlen_k = shape.seqlen_k;
    spec.causal = shape.causal;
    spec.layout = shape.layout;
    spec.window_left = shape.window_left, spec.window_right = shape.window_right;
    spec.head_dim = head_dim;
    spec.dtype = dtype;
    return spec;
  };
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    std::vector<std::pair<at::ScalarType, int>> pairs;
    // Head dims that are multiples of 32: every instantiation of today's kernels
    // (fa1 pads other head dims up to 32/64/128); the rest would only repeat
    // instrumented runs and push a tool past its 3-minute budget.
    for (const auto dtype : {at::kHalf, at::kBFloat16})
      for (const int head_dim : supported_head_dims(kernel, dtype, compute_capability))
        if (head_dim % 32 == 0) pairs.emplace_back(dtype, head_dim);
    if (pairs.empty()) continue;
    const size_t count = std::max(pairs.size(), shapes.size());
    for (size_t index = 0; index < count; ++index) {
      const auto [dtype, head_dim] = pairs[index % pairs.size()];
      // The pair's shape, or the next one the kernel takes. Each pass over the
      // shapes starts one further on, so a dtype does not repeat another's pairing.
      for (size_t step = 0; step < shapes.size(); ++step) {
        const Shape& shape = shapes[(index + index / shapes.size() + step) % shapes.size()];
        const size_t before = cases.size();
        add_if_supported(cases, kernel,
                         std::string(dtype_label(dtype)) + "_d" + std::to_string(head_dim) + "_" +
                             shape.label,
                         shaped(shape, dtype, head_dim), compute_capability);
        if (cases.size() > before) break;
      }
    }
    // float32 (one head dim) and a variable-length batch, where taken.
    const std::vector<int> fp32_head_dims = supported_head_dims(kernel, at::kFloat, compute_capability);
    if (!fp32_head_dims.empty()) {
      const int head_dim = fp32_head_dims[fp32_head_dims.size() / 2];
      add_if_supported(cases, kernel, "fp32_d" + std::to_string(head_dim) + "_" + shapes[1].label,
                       shaped(shapes[1], at::kFloat, head_dim), compute_capability);
    }
    ProblemSpec varlen = probe_spec(pairs.front().first, pairs.front().second);
    varlen.seqlens_q = {5, 0, 113};
    varlen.seqlens_k = {203, 7, 0};
    varlen.causal = true;
    add_if_supported(cases, kernel,
                     std::string(dtype_label(varlen.dtype)) + "_d" + std::to_string(varlen.head_dim) +
                         "_varlen_causal",
                     varlen, compute_capability);
    // Score modifications, all three, causal with rows that see no key.
    ProblemSpec modified = probe_spec(pairs.back().first, pairs.back().second);
    modified.seqlen_q = 203, modified.seqlen_k = 113;
    modified.causal = true;
    modified.softcap = 1.5;
    modified.alibi = ProblemSpec::Alibi::per_batch;
    modified.sinks = true;
    add_if_supported(cases, kernel,
                     std::string(dtype_label(modified.dtype)) + "_d" + std::to_string(modified.head_dim) +
                         "_q203_k113_causal_softcap_alibi_sinks",
                     modified, compute_capability);
  }
  return cases;
}

// The backward matrices cover each property once or twice instead of the
// forward's full products: a backward check costs a forward, a backward and
// two autograd references, and the whole GPU ctest has to stay under 5 minutes.

std::vector<KernelCase> backward_correctness_cases(int compute_capability, const Kernels& kernels) {
  const std::vector<SeqlenPair> seqlens = {{1, 1},     {7, 7},      {113, 113},   {1023, 1023},
                                           {1, 113},   {113, 1023}, {1023, 113},  {7, 1023}};
  const at::ScalarType dtypes[] = {at::kHalf, at::kBFloat16};
  const int kv_heads_cycle[] = {8, 2, 1};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    for (size_t index = 0; index < seqlens.size(); ++index)
      for (const bool causal : {false, true}) {
        // Every (seqlens, causal) pair once in bshd; dtype and kv heads cycle
        // so that each meets both masks and several lengths. Equal lengths
        // once more in packed-qkv, with the other dtype and the next kv heads.
        const auto [seqlen_q, seqlen_k] = seqlens[index];
        const size_t step = 2 * index + (causal ? 1 : 0);
        for (const Layout layout : {Layout::bshd, Layout::packed_qkv}) {
          const bool packed = layout == Layout::packed_qkv;
          if (packed && seqlen_q != seqlen_k) continue;
          ProblemSpec spec;
          spec.batch = 2, spec.heads = 8;
          spec.kv_heads = kv_heads_cycle[(step + (packed ? 1 : 0)) % 3];
          spec.seqlen_q = seqlen_q, spec.seqlen_k = seqlen_k;
          spec.head_dim = 64;
          spec.dtype = dtypes[(index + (causal ? 1 : 0) + (packed ? 1 : 0)) % 2];
          spec.causal = causal;
          spec.layout = layout;
          add_if_backward_supported(cases, kernel,
                                    std::string(dtype_label(spec.dtype)) +
                                        seqlen_label(seqlen_q, seqlen_k) + "_kv" +
                                        std::to_string(spec.kv_heads) + masks_label(spec),
                                    spec, compute_capability);
        }
      }
    // float32 (fa1_scalar's rung) on unequal lengths, with GQA.
    for (const bool causal : {false, true}) {
      const ProblemSpec spec = grouped_spec(2, 113, 1023, at::kFloat, causal);
      add_if_backward_supported(cases, kernel, "fp32_q113_k1023_kv2" + masks_label(spec), spec,
                                compute_capability);
    }
  }
  return cases;
}

std::vector<KernelCase> backward_head_dim_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (size_t index = 0; index < probe_head_dims().size(); ++index)
      for (const auto dtype : {at::kHalf, at::kBFloat16}) {
        ProblemSpec spec;
        spec.batch = 2, spec.heads = 4, spec.kv_heads = 2;
        spec.seqlen_q = 113, spec.seqlen_k = 300;
        spec.head_dim = probe_head_dims()[index];
        spec.dtype = dtype;
        spec.causal = (index + (dtype == at::kHalf ? 0 : 1)) % 2 == 1;
        add_if_backward_supported(cases, kernel,
                                  std::string(dtype_label(dtype)) + "_d" +
                                      std::to_string(spec.head_dim) + masks_label(spec),
                                  spec, compute_capability);
      }
  return cases;
}

std::vector<KernelCase> backward_window_cases(int compute_capability, const Kernels& kernels) {
  const std::vector<SeqlenPair> windows = {{64, 0}, {0, 0}, {17, 33}, {-1, 5}, {128, -1}};
  const std::vector<SeqlenPair> seqlens = {{113, 1023}, {1023, 113}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (size_t index = 0; index < windows.size(); ++index)
      for (const auto& [seqlen_q, seqlen_k] : seqlens) {
        ProblemSpec spec = grouped_spec(2, seqlen_q, seqlen_k,
                                        (index + (seqlen_q < seqlen_k ? 0 : 1)) % 2 == 0 ? at::kHalf : at::kBFloat16);
        spec.window_left = windows[index].first, spec.window_right = windows[index].second;
        // Every other window again at head_dim 256 (fa3's head dim split).
        const bool also_256 = index % 2 == 1 && seqlen_q > seqlen_k;
        for (const int head_dim : also_256 ? std::vector<int>{spec.head_dim, 256} : std::vector<int>{spec.head_dim}) {
          spec.head_dim = head_dim;
          add_if_backward_supported(cases, kernel,
                                    std::string(dtype_label(spec.dtype)) + seqlen_label(seqlen_q, seqlen_k) +
                                        (head_dim == 256 ? "_d256" : "") + masks_label(spec),
                                    spec, compute_capability);
        }
      }
  return cases;
}

std::vector<KernelCase> backward_varlen_cases(int compute_capability, const Kernels& kernels) {
  std::vector<KernelCase> cases;
  const std::vector<Lengths>& lengths = varlen_lengths();
  for (const auto& kernel : kernels) {
    for (size_t index = 0; index < lengths.size(); ++index)
      for (const bool causal : {false, true}) {
        const at::ScalarType dtype = (index + (causal ? 1 : 0)) % 2 == 0 ? at::kHalf : at::kBFloat16;
        const int kv_heads = index % 2 == 0 ? 8 : 2;
        add_if_backward_supported(cases, kernel,
                                  std::string(dtype_label(dtype)) + "_" + lengths[index].label +
                                      "_kv" + std::to_string(kv_heads) + (causal ? "_causal" : ""),
                                  varlen_spec(lengths[index], dtype, kv_heads, causal),
                                  compute_capability);
      }
    // A window with MQA, the packed-qkv layout, the largest and smallest head dims.
    const Lengths& unequal = lengths[1];
    ProblemSpec window = varlen_spec(unequal, at::kHalf, 1, false);
    window.window_left = 17, window.window_right = 33;
    add_if_backward_supported(cases, kernel, "fp16_unequal_kv1" + masks_label(window), window,
                              compute_capability);
    ProblemSpec packed = varlen_spec(lengths[0], at::kBFloat16, 2, true);
    packed.layout = Layout::packed_qkv;
    add_if_backward_supported(cases, kernel, "bf16_mixed_kv2" + masks_label(packed), packed,
                              compute_capability);
    for (const int head_dim : {32, 128, 256}) {
      ProblemSpec spec = varlen_spec(unequal, head_dim == 128 ? at::kHalf : at::kBFloat16, 2, true);
      spec.head_dim = head_dim;
      add_if_backward_supported(cases, kernel,
                                std::string(dtype_label(spec.dtype)) + "_unequal_kv2_causal_d" +
                                    std::to_string(head_dim),
                                spec, compute_capability);
    }
  }
  return cases;
}

std::vector<KernelCase> backward_query_block_cases(int compute_capability, const Kernels& kernels) {
  // fa3's 80-row query blocks (head_dim 128, no mask, default mode): one row,
  // a block less one row, one block, one block and a row, two and a row, a
  // long ragged batch; kv heads 8, 2, 1 in turn, both 16-bit dtypes; then a
  // varlen batch (empty sequences, rows without keys) and packed-qkv.
  const std::vector<SeqlenPair> seqlens = {{1, 1}, {79, 113}, {80, 300}, {81, 1023}, {161, 257}, {1023, 300}};
  const int kv_heads_cycle[] = {8, 2, 1};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    for (size_t index = 0; index < seqlens.size(); ++index) {
      const auto [seqlen_q, seqlen_k] = seqlens[index];
      ProblemSpec spec = grouped_spec(2, seqlen_q, seqlen_k, index % 2 == 0 ? at::kBFloat16 : at::kHalf);
      spec.kv_heads = kv_heads_cycle[index % 3];
      spec.head_dim = 128;
      add_if_backward_supported(cases, kernel,
                                std::string(dtype_label(spec.dtype)) + "_d128" + seqlen_label(seqlen_q, seqlen_k) +
                                    "_kv" + std::to_string(spec.kv_heads),
                                spec, compute_capability);
    }
    ProblemSpec varlen = varlen_spec(varlen_lengths()[1], at::kBFloat16, 2, false);
    varlen.head_dim = 128;
    add_if_backward_supported(cases, kernel, "bf16_d128_unequal_kv2", varlen, compute_capability);
    ProblemSpec packed = grouped_spec(1, 161, 161, at::kHalf);
    packed.head_dim = 128, packed.kv_heads = 8;
    packed.layout = Layout::packed_qkv;
    add_if_backward_supported(cases, kernel, "fp16_d128_q161_k161_kv8_packed", packed, compute_capability);
  }
  return cases;
}

std::vector<KernelCase> backward_persistent_grid_cases(int compute_capability, const Kernels& kernels) {
  // More tiles (key blocks x kv heads x batch) than an H100 or H200 has SMs
  // (132), without a mask: fa3's persistent backward grid, where CTAs walk
  // two tiles back to back (the second's K/V loaded once the first's are
  // released). 144 tiles at each head dim's key block (128 keys; 64 at 256),
  // GQA, odd query rows.
  // With a mask or variable lengths the walks differ and the CTAs take their
  // next tiles from a counter (head dims 64 and 128; 256 runs a CTA a tile
  // there): causal (every key block seen), a window that leaves the first key
  // blocks unseen (zeros, handed out without K and V), and a variable-length
  // batch whose shorter sequences leave tiles past their keys (never handed out):
  // at head_dim 128 with empty sequences and rows without keys (144 tiles), at
  // 256 a CTA a tile.
  struct Shape {
    int batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim;
    at::ScalarType dtype;
    bool causal = false;
    int window_left = -1, window_right = -1;
    std::vector<int> seqlens_q = {}, seqlens_k = {};
    double softcap = 0.0;
  };
  const Shape shapes[] = {{8, 16, 2, 113, 1100, 128, at::kBFloat16},
                          {2, 8, 8, 301, 1100, 64, at::kHalf},
                          {1, 16, 8, 77, 1100, 256, at::kBFloat16},
                          {8, 16, 2, 113, 1100, 128, at::kHalf, true},
                          {2, 8, 8, 113, 1100, 64, at::kBFloat16, false, 100, 0},
                          {4, 16, 8, 0, 0, 256, at::kBFloat16, true, -1, -1, {7, 1100, 300, 1}, {7, 1100, 300, 1}},
                          {8, 16, 2, 0, 0, 128, at::kBFloat16, true, -1, -1, {0, 1100, 1, 0, 700, 5, 1100, 300},
                           {1100, 0, 1100, 7, 700, 0, 1100, 1}},
                          // a score modification (dQ added from the consumers' registers) on the counter
                          {2, 8, 8, 113, 2177, 64, at::kHalf, true, -1, -1, {}, {}, 30.0}};
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const Shape& shape : shapes) {
      ProblemSpec spec = grouped_spec(shape.batch, shape.seqlen_q, shape.seqlen_k, shape.dtype, shape.causal);
      spec.heads = shape.heads, spec.kv_heads = shape.kv_heads, spec.head_dim = shape.head_dim;
      spec.window_left = shape.window_left, spec.window_right = shape.window_right;
      spec.seqlens_q = shape.seqlens_q, spec.seqlens_k = shape.seqlens_k;
      spec.softcap = shape.softcap;
      const std::string lengths = spec.is_varlen() ? "_varlen" : seqlen_label(shape.seqlen_q, shape.seqlen_k);
      const std::string mask = shape.causal ? "_causal"
                               : shape.window_left >= 0 ? window_label(shape.window_left, shape.window_right)
                                                        : "";
      add_if_backward_supported(cases, kernel,
                                std::string(dtype_label(spec.dtype)) + "_d" + std::to_string(shape.head_dim) + lengths +
                                    "_b" + std::to_string(shape.batch) + "_kv" + std::to_string(shape.kv_heads) + mask +
                                    (shape.softcap > 0 ? "_softcap" : ""),
                                spec, compute_capability);
    }
  return cases;
}

std::vector<KernelCase> backward_masked_cases(int compute_capability, const Kernels& kernels) {
  struct Masked {
    SeqlenPair seqlens;
    bool causal;
    int window_left, window_right;
  };
  // Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no
  // key. A short causal window on seqlen_q << seqlen_k: most keys are seen by
  // no row. A (0, 0) window: each row sees one key (probability 1, dq 0).
  const std::vector<Masked> shapes = {
      {{1023, 113}, true, -1, -1}, {{113, 7}, true, -1, -1}, {{7, 1023}, true, 3, 0},
      {{113, 300}, false, 0, 0},   {{300, 113}, false, 5, 0}};
  const std::set<size_t> also_256 = {0, 2};  // shapes that run at head_dim 256 too
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    for (size_t index = 0; index < shapes.size(); ++index) {
      const Masked& shape = shapes[index];
      ProblemSpec spec;
      spec.batch = 2, spec.heads = 8, spec.kv_heads = index % 2 == 0 ? 2 : 1;
      spec.seqlen_q = shape.seqlens.first, spec.seqlen_k = shape.seqlens.second;
      spec.dtype = index % 2 == 0 ? at::kHalf : at::kBFloat16;
      spec.causal = shape.causal;
      spec.window_left = shape.window_left, spec.window_right = shape.window_right;
      for (const int head_dim : also_256.count(index) ? std::vector<int>{64, 256} : std::vector<int>{64}) {
        spec.head_dim = head_dim;
        add_if_backward_supported(cases, kernel,
                                  std::string(dtype_label(spec.dtype)) +
                                      seqlen_label(spec.seqlen_q, spec.seqlen_k) + "_kv" +
                                      std::to_string(spec.kv_heads) + (head_dim == 256 ? "_d256" : "") +
                                      masks_label(spec),
                                  spec, compute_capability);
      }
    }
    // Sequences without keys (every row masked) and empty sequences.
    for (const size_t index : {size_t{4}, size_t{3}}) {
      const at::ScalarType dtype = index == 4 ? at::kBFloat16 : at::kHalf;
      add_if_backward_supported(cases, kernel,
                                std::string(dtype_label(dtype)) + "_varlen_" +
                                    varlen_lengths()[index].label + "_causal",
                                varlen_spec(varlen_lengths()[index], dtype, 2, true),
                                compute_capability);
    }
  }
  return cases;
}

std::vector<KernelCase> backward_determinism_cases(int compute_capability, const Kernels& kernels) {
  // Many key blocks add into each dq row (seqlen_k 1023), and a query length
  // that leaves a ragged last tile.
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    for (const auto dtype : {at::kHalf, at::kBFloat16}) {
      add_if_backward_supported(cases, kernel, std::string(dtype_label(dtype)) + "_q257_k1023_kv2_runs50",
                                grouped_spec(2, 257, 1023, dtype),
                                compute_capability, /*runs=*/50);
    }
    // Deterministic mode over several rounds of its zigzag (backward_key_block):
    // 17 key blocks over 6 dq slots with an H100's (or 108 / 114 SMs') slot
    // choice, the last round partial; causal, so the rounds' work differs.
    add_if_backward_supported(cases, kernel, "bf16_b8_q257_k2049_kv2_causal_runs10",
                              grouped_spec(8, 257, 2049, at::kBFloat16, /*causal=*/true),
                              compute_capability, /*runs=*/10);
    // head_dim 256 (fa3's head dim split: two dQ slabs a consumer a step,
    // staged one after the other), causal: descending ranks.
    ProblemSpec wide = grouped_spec(2, 257, 1023, at::kBFloat16, /*causal=*/true);
    wide.head_dim = 256;
    add_if_backward_supported(cases, kernel, "bf16_d256_q257_k1023_kv2_causal_runs50", wide, compute_capability,
                              /*runs=*/50);
    // head_dim 128 without a mask: fa3's 80-row blocks (two 80 x 64 dQ^T slabs
    // a block, staged for the writers), rotated walks (8 key blocks over 13
    // query blocks), the last block one row.
    ProblemSpec rows80 = grouped_spec(2, 961, 1023, at::kBFloat16);
    rows80.head_dim = 128;
    add_if_backward_supported(cases, kernel, "bf16_d128_q961_k1023_kv2_runs20", rows80, compute_capability,
                              /*runs=*/20);
    // Stress: batch 60 fills the GPU many times over, so blocks finish in
    // every order.
    // (513: a ragged last tile; the reference's float32 scores stay at 0.5 GB.)
    add_if_backward_supported(cases, kernel, "bf16_b60_q513_k513_kv2_causal_runs10",
                              grouped_spec(60, 513, 513, at::kBFloat16, /*causal=*/true),
                              compute_capability, /*runs=*/10);
    // fa2_mma_sm80 writes each slot's first contribution to a query block when
    // every key block's rows run to the sequence's end (no left window) and
    // zeroes the slots otherwise: a sliding window takes the zeroing path, a
    // varlen batch the first-touch one with a sequence of no queries and one of
    // no keys (its slots touch nothing: dq 0).
    ProblemSpec window = grouped_spec(2, 257, 1023, at::kBFloat16);
    window.window_left = 65, window.window_right = 17;
    add_if_backward_supported(cases, kernel, "bf16_q257_k1023_kv2_w65_17_runs10", window,
                              compute_capability, /*runs=*/10);
    ProblemSpec varlen = grouped_spec(1, 257, 1023, at::kHalf, /*causal=*/true);
    varlen.seqlens_q = {5, 0, 113, 257};
    varlen.seqlens_k = {203, 7, 0, 1023};
    add_if_backward_supported(cases, kernel, "fp16_varlen_kv2_causal_runs10", varlen,
                              compute_capability, /*runs=*/10);
  }
  return cases;
}

std::vector<KernelCase> backward_sanitizer_cases(int compute_capability, const Kernels& kernels) {
  // Each run is a forward and a backward under the tool (fa2: preprocess, main
  // and convert kernels; fa1: preprocess, dk/dv and dq), so few and tiny: the
  // head dims whose tiles differ most (64, 128), ragged last tiles (113, 203),
  // GQA, causal, a window, a varlen batch with empty sequences, and the
  // deterministic mode on several key blocks, causal and not.
  struct Shape {
    std::string label;
    at::ScalarType dtype;
    int head_dim, batch, heads, kv_heads, seqlen_q, seqlen_k;
    bool causal;
    int window_left, window_right;
    bool varlen, deterministic;
    bool modified = false;  // softcap, ALiBi and sinks together
  };
  const auto fp16 = at::kHalf, bf16 = at::kBFloat16;
  const std::vector<Shape> shapes = {
      {"fp16_d64_q113_k203", fp16, 64, 1, 2, 1, 113, 203, false, -1, -1, false, false},
      {"bf16_d128_b2_q7_k113_kv2_causal", bf16, 128, 2, 4, 2, 7, 113, true, -1, -1, false, false},
      // fa3's 80-row query blocks (dQ transposed): three blocks, the last one row
      {"fp16_d128_q161_k203_kv2", fp16, 128, 1, 4, 2, 161, 203, false, -1, -1, false, false},
      // more tiles than SMs (fa3: 18 key blocks x 8 kv heads = 144): its persistent grid's
      // CTAs walk a second tile, the dQ writer warps' hand-backs across tiles included
      {"bf16_d128_q7_k2177_kv8", bf16, 128, 1, 8, 8, 7, 2177, false, -1, -1, false, false},
      // the same under masks: the CTAs take their next tiles from a counter; the
      // window leaves most key blocks unseen (handed out without K and V)
      {"fp16_d128_q7_k2177_kv8_causal", fp16, 128, 1, 8, 8, 7, 2177, true, -1, -1, false, false},
      {"bf16_d64_q7_k2177_kv8_w16_0", bf16, 64, 1, 8, 8, 7, 2177, false, 16, 0, false, false},
      {"bf16_d64_q203_k113_w17_33_softcap_alibi_sinks", bf16, 64, 1, 2, 1, 203, 113, false, 17, 33, false, false, true},
      {"fp16_d128_varlen_causal", fp16, 128, 1, 2, 1, 113, 203, true, -1, -1, true, false},  // lengths below
      {"bf16_d128_q113_k203_causal_deterministic", bf16, 128, 1, 2, 1, 113, 203, true, -1, -1, false, true},
      // no mask, three key blocks, three query blocks (d64): fa3's rotated walks
      {"fp16_d64_q300_k257_deterministic", fp16, 64, 1, 1, 1, 300, 257, false, -1, -1, false, true},
      // fa3's head dim split: two consumers swapping S^T / dP^T, one dO stage;
      // deterministic, so the swap buffers also stage the dQ slabs
      {"bf16_d256_q203_k113_kv1_w17_33_deterministic", bf16, 256, 1, 2, 1, 203, 113, false, 17, 33, false, true},
  };
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    if (kernel.backward_launch == nullptr) continue;
    for (const Shape& shape : shapes) {
      ProblemSpec spec;
      spec.batch = shape.batch, spec.heads = shape.heads, spec.kv_heads = shape.kv_heads;
      spec.seqlen_q = shape.seqlen_q, spec.seqlen_k = shape.seqlen_k;
      if (shape.varlen) {
        spec.seqlens_q = {5, 0, 113};
        spec.seqlens_k = {203, 7, 0};
      }
      spec.head_dim = shape.head_dim;
      spec.dtype = shape.dtype;
      spec.causal = shape.causal;
      spec.window_left = shape.window_left, spec.window_right = shape.window_right;
      if (shape.modified) {
        spec.softcap = 1.5;
        spec.alibi = ProblemSpec::Alibi::per_head;
        spec.sinks = true;
      }
      const size_t before = cases.size();
      add_if_backward_supported(cases, kernel, shape.label, spec, compute_capability);
      if (cases.size() > before) cases.back().deterministic = shape.deterministic;
    }
  }
  return cases;
}

// fp8_scaling_name as a GoogleTest name part (letters, digits, underscores).
std::string scaling_label(Fp8Scaling scaling) {
  std::string name = fp8_scaling_name(scaling);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

std::vector<KernelCase> fp8_cases(int compute_capability, const Kernels& kernels) {
  struct Fp8Shape {
    int head_dim, batch, seqlen_q, seqlen_k, heads, kv_heads;
    bool causal;
    int window_left, window_right;
    bool outliers;
    Fp8Scaling scaling;
    at::ScalarType output;
  };
  constexpr auto kPerHead = Fp8Scaling::per_head;
  const std::vector<Fp8Shape> shapes = {
      {128, 2, 1023, 1023, 8, 2, false, -1, -1, false, kPerHead, at::kBFloat16},
      {128, 1, 113, 4097, 4, 1, true, -1, -1, false, kPerHead, at::kBFloat16},
      {128, 2, 777, 1500, 6, 2, false, 100, 50, true, kPerHead, at::kHalf},
      {128, 3, 1, 7, 2, 2, false, -1, -1, false, kPerHead, at::kBFloat16},
      {128, 2, 300, 257, 4, 4, true, -1, -1, true, Fp8Scaling::per_tensor, at::kBFloat16},
      {128, 1, 200, 333, 4, 2, false, -1, -1, false, Fp8Scaling::none, at::kBFloat16},
      // 2048+ keys: the 192-key tile (fp8_uses_long_key_tile); 2049 leaves 129 keys in the last
      // tile, 2113 = 11 x 192 + 1 one key.
      {128, 1, 1025, 2049, 4, 2, false, -1, -1, false, kPerHead, at::kBFloat16},
      {128, 1, 300, 2113, 4, 1, true, -1, -1, false, kPerHead, at::kBFloat16},
      {128, 1, 777, 3001, 6, 2, false, 300, 100, true, kPerHead, at::kHalf},
      {64, 2, 1023, 1023, 8, 2, false, -1, -1, false, kPerHead, at::kBFloat16},
      {64, 1, 113, 4097, 4, 1, true, -1, -1, true, kPerHead, at::kHalf},
      {64, 2, 777, 1500, 6, 2, false, 100, 50, false, Fp8Scaling::per_tensor, at::kBFloat16},
      {256, 2, 1024, 1023, 4, 4, true, -1, -1, false, kPerHead, at::kBFloat16},
      {256, 1, 7, 700, 2, 1, false, -1, -1, true, kPerHead, at::kBFloat16},
      {256, 1, 4097, 4097, 2, 2, true, -1, -1, false, kPerHead, at::kHalf},
  };
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels)
    for (const Fp8Shape& shape : shapes) {
      ProblemSpec spec;
      spec.batch = shape.batch, spec.heads = shape.heads, spec.kv_heads = shape.kv_heads;
      spec.seqlen_q = shape.seqlen_q, spec.seqlen_k = shape.seqlen_k, spec.head_dim = shape.head_dim;
      spec.dtype = at::kFloat8_e4m3fn;
      spec.causal = shape.causal;
      spec.window_left = shape.window_left, spec.window_right = shape.window_right;
      spec.outliers = shape.outliers;
      spec.fp8_scaling = shape.scaling;
      spec.fp8_output_dtype = shape.output;
      add_if_supported(cases, kernel,
                       "e4m3_d" + std::to_string(shape.head_dim) + "_b" + std::to_string(shape.batch) +
                           seqlen_label(shape.seqlen_q, shape.seqlen_k) + "_kv" + std::to_string(shape.kv_heads) +
                           masks_label(spec) + (shape.outliers ? "_outliers" : "") + "_descale_" +
                           scaling_label(shape.scaling) + "_out_" + dtype_label(shape.output),
                       spec, compute_capability);
    }
  // Variable-length batches (per-sequence descales; V^T regions padded to 16 keys):
  // empty sequences, queries without keys, short ones, per head dim.
  // Sequences of 2048+ keys take head_dim 128's 192-key tile (fp8_uses_long_key_tile).
  static const Lengths long_keys{"long_keys", {1100, 0, 3001, 17}, {2049, 9, 3000, 2300}};
  struct Fp8Varlen {
    const Lengths& lengths;
    int head_dim, kv_heads;
    bool causal, outliers;
  };
  const auto& lengths_at = varlen_lengths();
  const std::vector<Fp8Varlen> packed = {
      {lengths_at[0], 128, 2, false, false}, {lengths_at[1], 128, 2, true, false},
      {lengths_at[3], 128, 1, false, true},  {lengths_at[4], 128, 2, true, false},
      {lengths_at[5], 128, 4, false, false}, {lengths_at[1], 256, 2, false, true},
      {lengths_at[1], 64, 2, true, false},   {long_keys, 128, 2, false, false},
      {long_keys, 128, 1, true, true},
  };
  for (const auto& kernel : kernels)
    for (const Fp8Varlen& entry : packed) {
      const Lengths& lengths = entry.lengths;
      ProblemSpec spec = varlen_spec(lengths, at::kFloat8_e4m3fn, entry.kv_heads, entry.causal);
      spec.head_dim = entry.head_dim;
      spec.outliers = entry.outliers;
      add_if_supported(cases, kernel,
                       "e4m3_varlen_" + lengths.label + "_d" + std::to_string(entry.head_dim) + "_kv" +
                           std::to_string(entry.kv_heads) + masks_label(spec) + (entry.outliers ? "_outliers" : ""),
                       spec, compute_capability);
    }
  return cases;
}

const std::vector<CaseMatrix>& case_matrices() {
  static const std::vector<CaseMatrix> matrices = {
      {"Correctness", correctness_cases},
      {"HeadDims", head_dim_cases},
      {"SlidingWindow", window_cases},
      {"Varlen", varlen_cases},
      {"LargeScores", large_score_cases},
      {"Properties", property_cases},
      {"Sanitizer", sanitizer_cases},
      {"BackwardCorrectness", backward_correctness_cases},
      {"BackwardHeadDims", backward_head_dim_cases},
      {"BackwardSlidingWindow", backward_window_cases},
      {"BackwardVarlen", backward_varlen_cases},
      {"BackwardQueryBlocks", backward_query_block_cases},
      {"BackwardPersistentGrid", backward_persistent_grid_cases},
      {"BackwardMasked", backward_masked_cases},
      {"BackwardDeterminism", backward_determinism_cases},
      {"BackwardSanitizer", backward_sanitizer_cases},
      {"ScoreModifications", score_modification_cases},
      {"BackwardScoreModifications", backward_score_modification_cases},
      {"Fp8", fp8_cases},
  };
  return matrices;
}

const std::vector<ScoreModificationCase>& score_modifications() {
  using Alibi = ProblemSpec::Alibi;
  static const std::vector<ScoreModificationCase> all = {{"softcap", 1.5, Alibi::none, false},
                                                         {"alibi", 0.0, Alibi::per_head, false},
                                                         {"alibi_batch", 0.0, Alibi::per_batch, false},
                                                         {"sinks", 0.0, Alibi::none, true},
                                                         {"softcap_alibi_sinks", 1.5, Alibi::per_head, true}};
  return all;
}

namespace {

// Each modification x {no mask, causal with rows that see no key (q 203 >
// k 113), a window, a varlen batch with empty sequences}, GQA (8 over 2), head
// dim 64, the 16-bit dtypes cycling; and float32 (causal) where taken. Then
// softcap alone where fa3 fixes each row's max (bf16, head_dim 128, softcap
// <= 60): those masks, scores at the bound with softmax_scale 4 at softcap 38
// (the max at the bound), 50 and 60 (the max below it, P above 1), and 61 just
// past the rule (all's code).
std::vector<KernelCase> modification_cases(int compute_capability, const Kernels& kernels, bool backward) {
  std::vector<KernelCase> cases;
  for (const auto& kernel : kernels) {
    const auto capped = [&](ProblemSpec spec, double softcap, const std::string& label) {
      spec.head_dim = 128;
      spec.softcap = softcap;
      add_if_supported(cases, kernel, label, spec, compute_capability, backward);
    };
    capped(grouped_spec(2, 203, 113, at::kBFloat16, /*causal=*/true), 30.0,
           "softcap30_bf16_d128" + seqlen_label(203, 113) + "_kv2_causal");
    capped(varlen_spec(varlen_lengths()[1], at::kBFloat16, 2, /*causal=*/true), 30.0,
           "softcap30_bf16_d128_varlen_unequal_kv2_causal");
    ProblemSpec windowed = grouped_spec(1, 257, 300, at::kBFloat16);
    windowed.window_left = 17, windowed.window_right = 33;
    capped(windowed, 1.5, "softcap1p5_bf16_d128" + seqlen_label(257, 300) + "_kv2" + window_label(17, 33));
    ProblemSpec saturated = grouped_spec(1, 1023, 1023, at::kBFloat16);
    saturated.softmax_scale = 4.0;
    capped(saturated, 38.0, "softcap38_bf16_d128" + seqlen_label(1023, 1023) + "_kv2_scale4");
    for (const double softcap : {50.0, 60.0, 61.0})
      capped(saturated, softcap,
             "softcap" + std::to_string(int(softcap)) + "_bf16_d128" + seqlen_label(1023, 1023) + "_kv2_scale4");
    for (size_t index = 0; index < score_modifications().size(); ++index) {
      const ScoreModificationCase& modification = score_modifications()[index];
      const auto modified = [&](ProblemSpec spec) {
        modification.apply(spec);
        return spec;
      };
      const auto add = [&](const ProblemSpec& spec, const std::string& shape) {
        add_if_supported(cases, kernel, std::string(modification.label) + "_" + dtype_label(spec.dtype) + shape,
                         modified(spec), compute_capability, backward);
      };
      for (int mask = 0; mask < 4; ++mask) {
        const at::ScalarType dtype = (index + mask) % 2 == 0 ? at::kHalf : at::kBFloat16;
        if (mask == 0) add(grouped_spec(2, 113, 203, dtype), seqlen_label(113, 203) + "_kv2");
        if (mask == 1) add(grouped_spec(2, 203, 113, dtype, /*causal=*/true), seqlen_label(203, 113) + "_kv2_causal");
        if (mask == 2) {
          ProblemSpec spec = grouped_spec(1, 257, 300, dtype);
          spec.window_left = 17, spec.window_right = 33;
          add(spec, seqlen_label(257, 300) + "_kv2" + window_label(17, 33));
        }
        if (mask == 3) add(varlen_spec(varlen_lengths()[1], dtype, 2, /*causal=*/false), "_varlen_unequal_kv2");
      }
      add(grouped_spec(2, 113, 203, at::kFloat, /*causal=*/true), seqlen_label(113, 203) + "_kv2_causal");
      // head_dim 256: fa3's backward runs sinks alone there and refuses the rest (fa2 runs them).
      ProblemSpec wide = grouped_spec(1, 113, 203, at::kBFloat16, /*causal=*/true);
      wide.head_dim = 256;
      add(wide, seqlen_label(113, 203) + "_kv2_causal_d256");
    }
  }
  return cases;
}

}  // namespace

std::vector<KernelCase> score_modification_cases(int compute_capability, const Kernels& kernels) {
  return modification_cases(compute_capability, kernels, /*backward=*/false);
}

std::vector<KernelCase> backward_score_modification_cases(int compute_capability, const Kernels& kernels) {
  return modification_cases(compute_capability, kernels, /*backward=*/true);
}

std::string flashlab_run_arguments(const ProblemSpec& spec) { return problem_arguments(spec); }

std::string flashlab_run_arguments(const KernelCase& kernel_case) {
  return flashlab_run_arguments(kernel_case.spec) + (kernel_case.backward ? " --backward" : "") +
         (kernel_case.deterministic ? " --deterministic" : "");
}

}  // namespace flashlab::testing
