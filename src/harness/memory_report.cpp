#include "flashlab/harness/memory_report.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <cstdio>
#include <sstream>

#include "flashlab/attention.h"
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

std::vector<MemoryMeasurement> measure_memory(ProblemSpec spec, const std::vector<int>& seqlens) {
  std::vector<MemoryMeasurement> rows;
  for (const int seqlen : seqlens) {
    spec.seqlen_q = spec.seqlen_k = seqlen;
    const ProblemInputs inputs = make_inputs(spec, at::Device(at::kCUDA, 0));
    const KernelVariant& kernel = resolve_kernel(spec, inputs);
    const double scale = spec.softmax_scale.value_or(1.0 / std::sqrt(double(spec.head_dim)));
    // What attention_forward does: allocate out and lse, then run (the workspace, if any,
    // is allocated inside run_kernel).
    const auto fused = [&] {
      const at::Tensor out = at::empty(inputs.q.sizes(), inputs.q.options());
      const at::Tensor lse = at::empty({spec.batch, spec.heads, seqlen}, inputs.q.options().dtype(at::kFloat));
      run_kernel(kernel, forward_params(spec, inputs, out, lse));
    };
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
  return text.str();
}

}  // namespace flashlab
