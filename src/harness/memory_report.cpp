#include "flashlab/harness/memory_report.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <sstream>

#include "flashlab/attention.h"
#include "flashlab/harness/backward_check.h"
#include "flashlab/harness/reference.h"

namespace flashlab {
namespace {

// What a first attempt at attention does: the whole score matrix, its softmax, then P @ V.
at::Tensor naive_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, bool causal) {
  const int64_t group = q.size(2) / k.size(2);
  const at::Tensor query = q.transpose(1, 2);
  const at::Tensor key = (group > 1 ? k.repeat_interleave(group, 2) : k).transpose(1, 2);
  const at::Tensor value = (group > 1 ? v.repeat_interleave(group, 2) : v).transpose(1, 2);
  at::Tensor scores = at::matmul(query, key.transpose(-2, -1)).mul_(scale);
  if (causal)
    scores.masked_fill_(visibility_mask(q.size(1), k.size(1), -1, 0, q.device()).logical_not(),
                        -std::numeric_limits<double>::infinity());
  return at::matmul(scores.softmax(-1), value).transpose(1, 2);
}

}  // namespace

int64_t peak_bytes_during(const std::function<void()>& call) {
  using namespace c10::cuda::CUDACachingAllocator;
  const c10::DeviceIndex device = 0;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  resetPeakStats(device);
  const int64_t before = getDeviceStats(device).allocated_bytes[aggregate].current;
  call();
  return getDeviceStats(device).allocated_bytes[aggregate].peak - before;
}

std::vector<MemoryMeasurement> measure_memory(ProblemSpec spec, const std::vector<int>& seqlens,
                                              const MemoryOptions& options) {
  std::vector<MemoryMeasurement> rows;
  for (const int seqlen : seqlens) {
    spec.seqlen_q = spec.seqlen_k = seqlen;
    const ProblemInputs inputs = make_inputs(spec, current_cuda_device());
    const KernelVariant& kernel =
        options.backward ? resolve_backward_kernel(spec, inputs) : resolve_kernel(spec, inputs);
    const double scale = spec.softmax_scale.value_or(1.0 / std::sqrt(double(spec.head_dim)));
    // What attention_forward does: allocate out and lse, then run (the workspace, if any,
    // is allocated inside run_kernel).
    const auto forward = [&] {
      const ForwardOutputs outputs{
          at::empty(inputs.q.sizes(), inputs.q.options()),
          at::empty({spec.batch, spec.heads, seqlen}, inputs.q.options().dtype(at::kFloat))};
      run_kernel(kernel, forward_params(spec, inputs, outputs.out, outputs.lse));
      return outputs;
    };
    const auto fused = [&] { forward(); };
    MemoryMeasurement row;
    row.seqlen = seqlen;
    row.kernel = kernel.name;
    row.workspace_bytes =
        kernel.workspace_bytes == nullptr ? 0 : kernel.workspace_bytes(forward_params(spec, inputs));
    // Warm up first so that one-time allocations (cuBLAS workspaces) are not counted.
    fused();
    naive_attention(inputs.q, inputs.k, inputs.v, scale, spec.causal);
    row.kernel_bytes = peak_bytes_during(fused);
    row.naive_bytes = peak_bytes_during([&] { naive_attention(inputs.q, inputs.k, inputs.v, scale, spec.causal); });
    if (options.backward) {
      const at::Tensor dout = make_dout(spec, inputs);
      // A training step's attention: forward, then backward into fresh dq, dk,
      // dv (what attention_backward allocates; its workspace comes inside).
      const auto training = [&] {
        const ForwardOutputs outputs = forward();
        const Gradients gradients{at::empty(inputs.q.sizes(), inputs.q.options()),
                                  at::empty(inputs.k.sizes(), inputs.k.options()),
                                  at::empty(inputs.v.sizes(), inputs.v.options())};
        run_backward(kernel, spec, inputs, outputs, dout, gradients, options.deterministic);
      };
      // The naive forward keeps its scores and probabilities for autograd's backward.
      const auto naive_training = [&] {
        const c10::AutoGradMode enable_grad(true);
        const at::Tensor q = inputs.q.detach().requires_grad_(true);
        const at::Tensor k = inputs.k.detach().requires_grad_(true);
        const at::Tensor v = inputs.v.detach().requires_grad_(true);
        const at::Tensor out = naive_attention(q, k, v, scale, spec.causal);
        torch::autograd::grad({out}, {q, k, v}, {dout});
      };
      row.backward_workspace_bytes =
          kernel.backward_workspace_bytes == nullptr
              ? 0
              : static_cast<int64_t>(kernel.backward_workspace_bytes(
                    backward_params(spec, inputs, {}, dout, {}, options.deterministic)));
      training();
      naive_training();
      row.training_bytes = peak_bytes_during(training);
      row.naive_training_bytes = peak_bytes_during(naive_training);
    }
    rows.push_back(row);
  }
  return rows;
}

std::string format_memory_table(const ProblemSpec& spec, const std::vector<MemoryMeasurement>& rows) {
  std::ostringstream text;
  text << "peak device memory of one call, inputs excluded (batch " << spec.batch << ", heads "
       << spec.heads << "/" << spec.kv_heads << ", head_dim " << spec.head_dim << ", "
       << c10::toString(spec.dtype) << (spec.causal ? ", causal" : "") << ")\n";
  char line[160];
  if (!rows.empty()) text << "kernel " << rows.front().kernel << "\n";
  std::snprintf(line, sizeof line, "%8s %16s %16s %16s %8s\n", "seqlen", "fused bytes", "of which workspace",
                "naive bytes", "saving");
  text << line;
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "%8d %16lld %16lld %16lld %7.1f%%\n", row.seqlen,
                  static_cast<long long>(row.kernel_bytes), static_cast<long long>(row.workspace_bytes),
                  static_cast<long long>(row.naive_bytes), 100 * row.saving());
    text << line;
  }
  if (rows.empty() || rows.front().training_bytes < 0) return text.str();
  text << "forward + backward (dq, dk, dv and the backward's workspace on top of out and lse; "
          "naive: torch autograd through matmul -> softmax -> matmul)\n";
  std::snprintf(line, sizeof line, "%8s %16s %20s %16s %8s\n", "seqlen", "fused bytes",
                "of which bwd workspace", "naive bytes", "saving");
  text << line;
  for (const auto& row : rows) {
    std::snprintf(line, sizeof line, "%8d %16lld %20lld %16lld %7.1f%%\n", row.seqlen,
                  static_cast<long long>(row.training_bytes),
                  static_cast<long long>(row.backward_workspace_bytes),
                  static_cast<long long>(row.naive_training_bytes), 100 * row.training_saving());
    text << line;
  }
  return text.str();
}

KvCacheMemory measure_kvcache_memory(const KvCacheSpec& spec) {
  const KvCacheTensors inputs = make_kvcache_inputs(spec, current_cuda_device());
  const KernelVariant& kernel = resolve_kvcache_kernel(spec, inputs);
  const auto bytes = [](const at::Tensor& tensor) {
    return tensor.defined() ? static_cast<int64_t>(tensor.numel() * tensor.element_size()) : int64_t{0};
  };
  KvCacheMemory memory;
  memory.kernel = kernel.name;
  KvCacheParams params = kvcache_params(spec, inputs);
  memory.num_splits = kvcache_splits(kernel, params);
  params.num_splits = memory.num_splits;
  memory.workspace_bytes = kernel.kvcache_workspace_bytes != nullptr
                               ? static_cast<int64_t>(kernel.kvcache_workspace_bytes(params))
                               : 0;
  memory.k_cache_bytes = bytes(inputs.k_cache);
  memory.v_cache_bytes = bytes(inputs.v_cache);
  int64_t keys = 0;
  for (const int64_t length : inputs.key_lengths()) keys += length;
  memory.valid_key_bytes = 2 * keys * spec.kv_heads * spec.head_dim * inputs.k_cache.element_size();
  memory.block_table_bytes = bytes(inputs.block_table);
  memory.cache_seqlens_bytes = bytes(inputs.cache_seqlens);
  memory.new_rows_bytes = bytes(inputs.k_new) + bytes(inputs.v_new);
  // What attention_with_kvcache allocates: out, lse, and the workspace inside
  // the launch. Once first, so one-time allocations are not counted.
  const KvCacheOptions options = inputs.options(spec.attention_options(), spec.num_splits);
  const auto call = [&] { attention_with_kvcache(inputs.q, inputs.k_cache, inputs.v_cache, options); };
  call();
  memory.call_bytes = peak_bytes_during(call);
  return memory;
}

std::string format_kvcache_memory(const KvCacheSpec& spec, const KvCacheMemory& memory) {
  std::ostringstream text;
  const auto line = [&](const char* what, int64_t bytes, const std::string& note = {}) {
    char row[160];
    std::snprintf(row, sizeof row, "  %-28s %16lld bytes", what, static_cast<long long>(bytes));
    text << row << (note.empty() ? "" : "  " + note) << "\n";
  };
  const int64_t cache = memory.k_cache_bytes + memory.v_cache_bytes;
  text << "KV cache memory (" << spec.describe() << ")\n"
       << "kernel " << memory.kernel << ", num_splits " << memory.num_splits << "\n";
  line("k_cache", memory.k_cache_bytes);
  line("v_cache", memory.v_cache_bytes);
  char share[64];
  std::snprintf(share, sizeof share, "(%.1f%% of the caches)", cache > 0 ? 100.0 * memory.valid_key_bytes / cache : 0.0);
  line("of which valid keys", memory.valid_key_bytes, std::string(share) + ", after the append");
  line("block_table", memory.block_table_bytes, spec.paged() ? "" : "(contiguous cache: none)");
  line("cache_seqlens", memory.cache_seqlens_bytes);
  line("k_new + v_new", memory.new_rows_bytes);
  line("kvcache workspace", memory.workspace_bytes,
       memory.num_splits > 1 ? "(float32 partial out + lse per split)" : "(one split: none)");
  line("one call, above its inputs", memory.call_bytes, "(out, lse, workspace: peak allocated)");
  return text.str();
}

}  // namespace flashlab
