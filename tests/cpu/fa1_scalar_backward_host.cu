// fa1_scalar_backward_on_host (fa1_scalar_backward_host.h): the grids of
// fa1_scalar::backward_launch_with_element, walked on the host.
#include "fa1_scalar_backward_host.h"

#include <stdexcept>
#include <vector>

#include "sm80/fa1_scalar/fa1_scalar_backward_kernel.cuh"

namespace flashlab::testing {
namespace {

using fa1_scalar::kBackwardThreads;
using fa1_scalar::kPreprocessThreads;

int blocks_of(int rows, int threads) { return (rows + threads - 1) / threads; }

template <typename Element>
void run_on_host(const AttentionBackwardParams& params) {
  const int stride = fa1_scalar::backward_row_stride(params.head_dim);
  // One thread's rows at a time: threads never share them, so one set is enough.
  std::vector<float> rows(4 * stride);

  // 1. preprocess: grid (query blocks, heads, batch) of kPreprocessThreads.
  for (int batch = 0; batch < params.batch; ++batch)
    for (int head = 0; head < params.heads; ++head)
      for (int block = 0; block < blocks_of(params.seqlen_q, kPreprocessThreads); ++block)
        for (int thread = 0; thread < kPreprocessThreads; ++thread)
          fa1_scalar::preprocess_thread<Element>(params, block * kPreprocessThreads + thread, head,
                                                 batch);
  // 2. dK/dV: grid (key blocks, kv heads, batch) of kBackwardThreads.
  for (int batch = 0; batch < params.batch; ++batch)
    for (int kv_head = 0; kv_head < params.kv_heads; ++kv_head)
      for (int block = 0; block < blocks_of(params.seqlen_k, kBackwardThreads); ++block)
        for (int thread = 0; thread < kBackwardThreads; ++thread)
          fa1_scalar::dk_dv_thread<Element>(params, block, thread, kv_head, batch, rows.data(),
                                            rows.data() + stride, rows.data() + 2 * stride,
                                            rows.data() + 3 * stride);
  // 3. dQ: grid (query blocks, heads, batch) of kBackwardThreads.
  for (int batch = 0; batch < params.batch; ++batch)
    for (int head = 0; head < params.heads; ++head)
      for (int block = 0; block < blocks_of(params.seqlen_q, kBackwardThreads); ++block)
        for (int thread = 0; thread < kBackwardThreads; ++thread)
          fa1_scalar::dq_thread<Element>(params, block, thread, head, batch, rows.data(),
                                         rows.data() + stride, rows.data() + 2 * stride);
}

}  // namespace

void fa1_scalar_backward_on_host(const AttentionBackwardParams& params) {
  if (params.workspace_bytes < fa1_scalar::backward_workspace_bytes(params))
    throw std::invalid_argument("fa1_scalar_backward_on_host: workspace too small");
  // Carved as backward_launch carves it.
  AttentionBackwardParams own = params;
  own.softmax_d = static_cast<float*>(params.workspace);
  own.dq_accum = nullptr;
  switch (own.dtype) {
    case DataType::float32: return run_on_host<float>(own);
    case DataType::float16: return run_on_host<__half>(own);
    case DataType::bfloat16: return run_on_host<__nv_bfloat16>(own);
    case DataType::e4m3: throw std::invalid_argument("fa1_scalar_backward_on_host: no e4m3 backward");
  }
}

}  // namespace flashlab::testing
