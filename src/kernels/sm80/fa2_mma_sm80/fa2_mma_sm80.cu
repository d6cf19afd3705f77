// fa2_mma_sm80: the FlashAttention-2 forward pass on tensor cores with sm_80
// instructions (mma.sync m16n8k16 + ldmatrix + cp.async; runs on sm_80 and newer).
//
// This file holds the registry descriptor, the support check and the dispatch
// on head_dim, all driven by fa2_mma_sm80::HeadDims (fa2_mma_sm80.h); it
// compiles no kernel. The kernel template is fa2_mma_sm80_kernel.cuh; each head
// dim is instantiated in its own generated fa2_mma_sm80_hdim<D>.cu.
//
// Tiling: DefaultTraits<D> in fa2_mma_sm80.h: block_q 128 with 4 warps (two m16
// row slabs per warp) and block_k 64 (128 for D = 64) up to D = 128; block_q 64
// with 4 warps (one slab each) and block_k 32 above; K/V double-buffered with
// cp.async. Alternative tilings (tuning only, flashlab-bench --sweep) are in
// src/kernels/dev/fa2_mma_sm80_tuning.
//
// Limits: fp16 / bf16; head_dim in HeadDims (32, 64, 96, 128, 256); 16-byte
// aligned base pointers and strides that are multiples of 8 elements; no tile
// tracing.
#include <cstdint>
#include <string>

#include "flashlab/kernel_registry.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab {

using fa2_mma_sm80::HeadDims;

// Shared by every tile configuration, the tuning ones included
// (fa2_mma_sm80_tuning.cu).
std::string fa2_mma_sm80::unsupported_reason(const AttentionParams& params) {
  if (params.dtype != DataType::float16 && params.dtype != DataType::bfloat16)
    return std::string("fa2_mma_sm80 supports float16 and bfloat16 inputs; got ") +
           data_type_name(params.dtype);
  if (!HeadDims::contains(params.head_dim))
    return "fa2_mma_sm80 supports head_dim " + HeadDims::text() + "; got " +
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
  TileShape shape;
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    using Tr = typename DefaultTraits<kHeadDim>::type;
    shape = {Tr::kBlockQ, Tr::kBlockK};
  });
  return shape;
}

void launch(const AttentionParams& params) {
  // unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim,
                           [&] { fa2_mma_sm80::launch<typename DefaultTraits<kHeadDim>::type>(params); });
}

}  // namespace

KernelVariant fa2_mma_sm80_variant() {
  KernelVariant variant;
  variant.name = "fa2_mma_sm80";
  variant.summary =
      "FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async "
      "double buffering), fp16/bf16, head_dim " + HeadDims::text("/") + ", causal/window, GQA, varlen";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = false;
  variant.unsupported_reason = fa2_mma_sm80::unsupported_reason;
  variant.tile_shape = tile_shape;
  variant.launch = launch;
  return variant;
}

}  // namespace flashlab
