// merge_attention_states_ (attention.h): checks the tensors and hands their
// pointers and strides to the merge kernel (src/kernels/sm80/attention_merge/).
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "flashlab/attention.h"
#include "flashlab/attention_merge_params.h"
#include "validation.h"

namespace flashlab {
namespace detail {
void launch_attention_merge(const AttentionMergeParams& params);
}  // namespace detail

void merge_attention_states_(const at::Tensor& out, const at::Tensor& lse, const at::Tensor& block_out,
                             const at::Tensor& block_lse) {
  TORCH_CHECK_VALUE(out.dim() == 4 || out.dim() == 3,
                    "merge_attention_states_: out must be (batch, rows, heads, head_dim) or packed (rows, heads, "
                    "head_dim); got ", out.sizes());
  TORCH_CHECK_VALUE(block_out.sizes() == out.sizes(), "merge_attention_states_: block_out is ", block_out.sizes(),
                    "; expected out's shape ", out.sizes());
  const bool packed = out.dim() == 3;
  const int64_t batch = packed ? 1 : out.size(0), rows = out.size(-3), heads = out.size(-2);
  const std::vector<int64_t> lse_shape =
      packed ? std::vector<int64_t>{heads, rows} : std::vector<int64_t>{batch, heads, rows};
  for (const auto& [name, tensor] : {std::pair{"lse", lse}, std::pair{"block_lse", block_lse}})
    TORCH_CHECK_VALUE(tensor.sizes() == at::IntArrayRef(lse_shape) && tensor.scalar_type() == at::kFloat,
                      "merge_attention_states_: ", name, " is ", tensor.sizes(), " ", tensor.scalar_type(),
                      "; expected float32 ", at::IntArrayRef(lse_shape));
  TORCH_CHECK_VALUE(out.scalar_type() == at::kFloat, "merge_attention_states_: out (the accumulator) must be "
                    "float32; got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.is_cuda(), "merge_attention_states_: out is on ", out.device(), "; expected a CUDA tensor");
  for (const auto& [name, tensor] : {std::pair{"lse", lse}, std::pair{"block_out", block_out},
                                     std::pair{"block_lse", block_lse}}) {
    TORCH_CHECK_VALUE(tensor.device() == out.device(), "merge_attention_states_: ", name, " is on ", tensor.device(),
                      "; every tensor must be on out's device (", out.device(), ")");
  }
  const at::ScalarType block_dtype = block_out.scalar_type();
  TORCH_CHECK_VALUE(block_dtype == at::kFloat || block_dtype == at::kHalf || block_dtype == at::kBFloat16,
                    "merge_attention_states_: block_out is ", block_dtype, "; expected float32, float16 or bfloat16");
  // Each row is read and written by one warp: an element shared by two rows (a stride 0) would race.
  at::assert_no_internal_overlap(out);
  at::assert_no_internal_overlap(lse);
  TORCH_CHECK_VALUE(out.stride(-1) == 1 && block_out.stride(-1) == 1,
                    "merge_attention_states_: out and block_out need contiguous columns (last stride 1); got ",
                    out.stride(-1), " and ", block_out.stride(-1));
  const c10::cuda::CUDAGuard guard(out.device());
  AttentionMergeParams params;
  params.out = out.data_ptr<float>();
  params.lse = lse.data_ptr<float>();
  params.block_out = block_out.data_ptr();
  params.block_lse = block_lse.data_ptr<float>();
  params.block_dtype = detail::to_data_type(block_out.scalar_type());
  params.batch = static_cast<int>(batch), params.rows = static_cast<int>(rows), params.heads = static_cast<int>(heads);
  params.head_dim = static_cast<int>(out.size(-1));
  // A packed tensor is one batch: its batch strides are 0.
  const auto batch_stride = [packed](const at::Tensor& t) { return packed ? int64_t{0} : t.stride(0); };
  params.out_batch_stride = batch_stride(out), params.out_row_stride = out.stride(-3);
  params.out_head_stride = out.stride(-2);
  params.block_batch_stride = batch_stride(block_out), params.block_row_stride = block_out.stride(-3);
  params.block_head_stride = block_out.stride(-2);
  params.lse_batch_stride = batch_stride(lse), params.lse_head_stride = lse.stride(-2);
  params.lse_row_stride = lse.stride(-1);
  params.block_lse_batch_stride = batch_stride(block_lse), params.block_lse_head_stride = block_lse.stride(-2);
  params.block_lse_row_stride = block_lse.stride(-1);
  params.stream = c10::cuda::getCurrentCUDAStream(out.device().index()).stream();
  detail::launch_attention_merge(params);
}

}  // namespace flashlab
