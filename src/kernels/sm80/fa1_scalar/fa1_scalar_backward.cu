// fa1_scalar backward: FlashAttention-2's backward in plain float32 scalar code,
// three kernels (D = rowsum(dout * out); dK/dV one thread per key row; dQ one
// thread per query row), deterministic, no atomics; with attention sinks a
// fourth, the shared sink gradient (common/backward_dq.cuh). The kernels and
// their limits: fa1_scalar_backward_kernel.cuh. These are the KernelVariant
// hooks that fa1_scalar.cu registers.
#include <stdexcept>

#include "common/backward_dq.cuh"
#include "fa1_scalar_backward_kernel.cuh"

namespace flashlab {
namespace fa1_scalar {

std::string backward_unsupported_reason(const AttentionBackwardParams& params) {
  // The forward's limits (head_dim <= 128; heads and batch within grid y/z,
  // which also bounds kv_heads <= heads) are the backward's.
  return unsupported_reason(params);
}

size_t backward_workspace_bytes(const AttentionBackwardParams& params) {
  if (params.batch <= 0 || params.heads <= 0) return 0;
  // The largest lse index plus one: rows per (batch, head) are seqlen_q, or
  // for a variable-length batch (lse (heads, total_q), batch stride 0) every
  // packed row.
  const int64_t rows = params.is_varlen() ? params.total_rows_q : params.seqlen_q;
  const int64_t elements = (params.batch - 1) * params.lse_batch_stride +
                           (params.heads - 1) * params.lse_head_stride + rows;
  return sizeof(float) * static_cast<size_t>(elements > 0 ? elements : 0);
}

TileShape backward_tile_shape(const AttentionBackwardParams&) {
  // block_k: the keys one dK/dV block owns; block_q: the query rows one dQ
  // block owns (each thread walks the rows, or keys, one at a time).
  return {kBackwardThreads, kBackwardThreads};
}

void backward_launch(const AttentionBackwardParams& params) {
  const size_t needed = backward_workspace_bytes(params);
  if (needed > 0 && (params.workspace == nullptr || params.workspace_bytes < needed))
    throw std::invalid_argument("fa1_scalar backward needs a workspace of " +
                                std::to_string(needed) + " bytes (softmax_d); got " +
                                std::to_string(params.workspace_bytes));
  // softmax_d is carved from the workspace on this copy of the block; dq_accum
  // stays null (every dQ element is summed by one thread).
  AttentionBackwardParams own = params;
  own.softmax_d = static_cast<float*>(params.workspace);
  own.dq_accum = nullptr;
  switch (own.dtype) {
    case DataType::float32: backward_launch_with_element<float>(own); break;
    case DataType::float16: backward_launch_with_element<__half>(own); break;
    case DataType::bfloat16: backward_launch_with_element<__nv_bfloat16>(own); break;
    case DataType::e4m3: break;  // the kernel choice refuses e4m3 backwards (host_path.h)
  }
  // dsinks from the LSE and D, which the preprocess wrote laid out like the
  // LSE (same stream: after it); a fixed-order sum, so deterministic. No-op without sinks.
  launch_backward_sink_gradient(own, SoftmaxDLikeLse{}, "fa1_scalar backward (sink gradient)");
}

}  // namespace fa1_scalar
}  // namespace flashlab
