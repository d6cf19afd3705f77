// fa2_mma_sm80: the FlashAttention-2 forward pass on tensor cores with sm_80
// instructions (mma.sync m16n8k16 + ldmatrix + cp.async; runs on sm_80 and sm_90).
//
// This file holds the registry descriptor and the dispatch on head_dim; the
// kernel template is fa2_mma_sm80_kernel.cuh and each head dim is compiled in
// its own fa2_mma_sm80_hdim<D>.cu.
//
// Tiling: per head dim, DefaultTraits<D> in the kernel header: block_q 128 with
// 4 warps (two m16 row slabs per warp) and block_k 64 (128 for D = 64) for
// D <= 128; block_q 64 with 4 warps (one slab each) and block_k 32 for D = 256;
// K/V double-buffered with cp.async. Alternative tilings for head_dim 64 and
// 128 (tuning only, flashlab-bench --sweep) are in fa2_mma_sm80_tuning*.
//
// Limits: fp16 / bf16; head_dim 32, 64, 96, 128, 256; 16-byte aligned base
// pointers and strides that are multiples of 8 elements; no tile tracing.
#include <cstdint>
#include <string>

#include "fa2_mma_sm80_kernel.cuh"
#include "flashlab/kernel_registry.h"

namespace flashlab {
namespace {

bool is_supported_head_dim(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 ||
         head_dim == 256;
}

}  // namespace

// Shared by every tile configuration, the tuning ones included
// (fa2_mma_sm80_tuning.cu).
std::string fa2_mma_sm80::unsupported_reason(const AttentionParams& params) {
  if (params.dtype != DataType::float16 && params.dtype != DataType::bfloat16)
    return std::string("fa2_mma_sm80 supports float16 and bfloat16 inputs; got ") +
           data_type_name(params.dtype);
  if (!is_supported_head_dim(params.head_dim))
    return "fa2_mma_sm80 supports head_dim 32, 64, 96, 128, 256; got " +
           std::to_string(params.head_dim);
  if (params.kv_heads <= 0 || params.heads % params.kv_heads != 0)
    return "fa2_mma_sm80 needs heads to be a multiple of kv_heads; got " +
           std::to_string(params.heads) + "/" + std::to_string(params.kv_heads);
  if (params.heads > 65535 || params.batch > 65535)
    return "fa2_mma_sm80 supports at most 65535 heads and 65535 batches";
  // cp.async and the output stores move 16 bytes (8 elements) at a time.
  const auto aligned_pointer = [](const void* pointer) {
    return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0;
  };
  const auto aligned_stride = [](int64_t stride) { return stride % 8 == 0; };
  if (!aligned_pointer(params.q) || !aligned_pointer(params.k) || !aligned_pointer(params.v) ||
      !aligned_pointer(params.out))
    return "fa2_mma_sm80 needs q, k, v and out to start on 16-byte boundaries";
  const bool varlen = params.is_varlen();
  const int64_t strides[] = {
      varlen ? 0 : params.q_batch_stride,   params.q_row_stride,   params.q_head_stride,
      varlen ? 0 : params.k_batch_stride,   params.k_row_stride,   params.k_head_stride,
      varlen ? 0 : params.v_batch_stride,   params.v_row_stride,   params.v_head_stride,
      varlen ? 0 : params.out_batch_stride, params.out_row_stride, params.out_head_stride};
  for (int64_t stride : strides)
    if (!aligned_stride(stride))
      return "fa2_mma_sm80 needs batch, row and head strides that are multiples of 8 "
             "elements (16 bytes)";
  return {};
}

namespace {

using fa2_mma_sm80::DefaultTraits;

TileShape tile_shape(const AttentionParams& params) {
  const auto shape = [](auto traits) {
    using Tr = decltype(traits);
    return TileShape{Tr::kBlockQ, Tr::kBlockK};
  };
  switch (params.head_dim) {
    case 32: return shape(DefaultTraits<32>::type{});
    case 64: return shape(DefaultTraits<64>::type{});
    case 96: return shape(DefaultTraits<96>::type{});
    case 128: return shape(DefaultTraits<128>::type{});
    case 256: return shape(DefaultTraits<256>::type{});
    default: return TileShape{};
  }
}

void launch(const AttentionParams& params) {
  switch (params.head_dim) {
    case 32: return fa2_mma_sm80::run_head_dim<32>(params);
    case 64: return fa2_mma_sm80::run_head_dim<64>(params);
    case 96: return fa2_mma_sm80::run_head_dim<96>(params);
    case 128: return fa2_mma_sm80::run_head_dim<128>(params);
    case 256: return fa2_mma_sm80::run_head_dim<256>(params);
    default: break;  // unsupported_reason rejects other head dims before launch
  }
}

}  // namespace

KernelVariant fa2_mma_sm80_variant() {
  KernelVariant variant;
  variant.name = "fa2_mma_sm80";
  variant.summary =
      "FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async "
      "double buffering), fp16/bf16, head_dim 32/64/96/128/256, causal/window, GQA, varlen";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = false;
  variant.unsupported_reason = fa2_mma_sm80::unsupported_reason;
  variant.tile_shape = tile_shape;
  variant.launch = launch;
  return variant;
}

}  // namespace flashlab
