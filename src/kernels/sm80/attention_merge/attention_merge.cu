// The ring's merge step (flashlab.distributed, issue 34): a block's partial
// attention result merged into the accumulated one in place, by the LSE rule
// the split-KV combine uses (common/lse_merge.h). One warp per (batch, row,
// head): the lanes read both LSEs, compute the merged LSE and the two weights,
// and stride over the head_dim columns; lane 0 writes the LSE after every lane
// has read the old one. Memory-bound: it reads the accumulator (float32) and
// the block's output (16-bit or float32) and writes the accumulator once,
// where the same merge in torch operations made about ten passes.
//
// Limits: any strides with unit column stride; head_dim any size; rows that
// saw no key in either part keep out 0 and lse -inf.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/lse_merge.h"
#include "flashlab/cuda_check.h"
#include "flashlab/attention_merge_params.h"

namespace flashlab {
namespace {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename BlockElement>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) attention_merge_kernel(const AttentionMergeParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t slot = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (slot >= static_cast<int64_t>(p.batch) * p.rows * p.heads) return;
  const int head = static_cast<int>(slot % p.heads);
  const int row = static_cast<int>(slot / p.heads % p.rows);
  const int batch = static_cast<int>(slot / (static_cast<int64_t>(p.heads) * p.rows));

  float* lse = p.lse + batch * p.lse_batch_stride + head * p.lse_head_stride + row * p.lse_row_stride;
  const float old_lse = *lse;
  const float block_lse = p.block_lse[batch * p.block_lse_batch_stride + head * p.block_lse_head_stride +
                                      row * p.block_lse_row_stride];
  const float max_lse = fmaxf(old_lse, block_lse);
  const float new_lse = merged_lse(max_lse, lse_part_weight(old_lse, max_lse) + lse_part_weight(block_lse, max_lse));
  const float old_weight = lse_part_weight(old_lse, new_lse);
  const float block_weight = lse_part_weight(block_lse, new_lse);

  float* out = p.out + batch * p.out_batch_stride + row * p.out_row_stride + head * p.out_head_stride;
  const BlockElement* block = static_cast<const BlockElement*>(p.block_out) + batch * p.block_batch_stride +
                              row * p.block_row_stride + head * p.block_head_stride;
  for (int col = lane; col < p.head_dim; col += 32)
    out[col] = old_weight * out[col] + block_weight * to_float(block[col]);
  __syncwarp();  // every lane has read the old LSE
  if (lane == 0) *lse = new_lse;
}

}  // namespace

namespace detail {
void launch_attention_merge(const AttentionMergeParams& params) {
  const int64_t rows = static_cast<int64_t>(params.batch) * params.rows * params.heads;
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock));
  const auto stream = static_cast<cudaStream_t>(params.stream);
  switch (params.block_dtype) {
    case DataType::float16:
      attention_merge_kernel<__half><<<grid, kWarpsPerBlock * 32, 0, stream>>>(params);
      break;
    case DataType::bfloat16:
      attention_merge_kernel<__nv_bfloat16><<<grid, kWarpsPerBlock * 32, 0, stream>>>(params);
      break;
    default:
      attention_merge_kernel<float><<<grid, kWarpsPerBlock * 32, 0, stream>>>(params);
  }
  FLASHLAB_CUDA_CHECK(cudaGetLastError());
  if (synchronous_launch_checks()) FLASHLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
}
}  // namespace detail

}  // namespace flashlab
