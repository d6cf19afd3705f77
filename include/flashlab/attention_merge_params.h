// The merge kernel's parameter block (src/kernels/sm80/attention_merge/): torch-free,
// like kernel_params.h, in a header of its own so that the attention kernels do not
// include it.
#pragma once

#include <cstdint>

#include "flashlab/kernel_params.h"

namespace flashlab {

// Merges a partial attention result into an accumulated one, in place: the
// LSE rule of common/lse_merge.h for two parts over disjoint key sets (the
// ring's step in flashlab.distributed). out (float32) and lse hold the
// accumulated part, block_out (block_dtype) and block_lse the new one. Rows
// are (batch, row, head) with head_dim columns of stride 1; strides count
// elements; the LSEs are float32, natural log.
struct AttentionMergeParams {
  float* out = nullptr;
  float* lse = nullptr;
  const void* block_out = nullptr;
  const float* block_lse = nullptr;
  DataType block_dtype = DataType::float32;
  int batch = 0, rows = 0, heads = 0, head_dim = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
  int64_t block_batch_stride = 0, block_row_stride = 0, block_head_stride = 0;
  int64_t block_lse_batch_stride = 0, block_lse_head_stride = 0, block_lse_row_stride = 0;
  void* stream = nullptr;  // cudaStream_t
};

}  // namespace flashlab
