// fa3_wgmma_sm90: FlashAttention-3 style forward for Hopper (TMA, wgmma, warp
// specialization; sm_90a only). The kernel, its tiling and limits:
// fa3_wgmma_sm90_kernel.cuh. This file holds the registry descriptor, the
// support check, the TMA tensor maps and the dispatch on head_dim, all driven
// by fa3_wgmma_sm90::HeadDims (fa3_wgmma_sm90.h); each head dim is compiled in
// its own generated fa3_wgmma_sm90_hdim<D>.cu.
#include <cuda.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>
#include <string>

#include "flashlab/cuda_check.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90.h"
#include "sm90/fa3_wgmma_sm90/fa3_wgmma_sm90_locate.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {
namespace fa3_wgmma_sm90 {
namespace {

// cuTensorMapEncodeTiled from the driver, found at run time so nothing links
// libcuda directly.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static EncodeTiled function = [] {
    void* pointer = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    FLASHLAB_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pointer, 12000,
                                                         cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || pointer == nullptr)
      throw_cuda_error(cudaErrorSymbolNotFound, "cuTensorMapEncodeTiled", __FILE__, __LINE__,
                       "the driver has no cuTensorMapEncodeTiled (needs CUDA 12 or newer)");
    return reinterpret_cast<EncodeTiled>(pointer);
  }();
  return function;
}

// TMA (and the FP8 V transpose's 16-byte accesses) need 16-byte aligned base
// addresses and strides.
bool aligned_pointer(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Why `strides` (in elements) do not suit: the first one that is not a multiple of
// `multiple`, named in "<needs> batch, row and head strides that are ...". Empty when all do.
std::string stride_reason(const std::string& needs, std::initializer_list<int64_t> strides, int multiple,
                          const char* why) {
  for (const int64_t stride : strides)
    if (stride % multiple != 0)
      return needs + " batch, row and head strides that are multiples of " + std::to_string(multiple) +
             " elements (" + why + "); got a stride of " + std::to_string(stride);
  return {};
}

}  // namespace

TensorOperand tensor_operand(const AttentionParams& p, Operand operand) {
  switch (operand) {
    case Operand::q:
      return {p.q, p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.heads, true, "q"};
    case Operand::k:
      return {p.k, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.kv_heads, false, "k"};
    case Operand::v:
      break;
  }
  return {p.v, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.kv_heads, false, "v"};
}

CUtensorMap make_tensor_map(const AttentionParams& p, const TensorOperand& operand, int box_rows, int panel_bytes) {
  // Variable-length batches are one packed sequence of rows (batch extent 1):
  // the kernel adds cu_seqlens[b] to the row coordinate.
  const bool varlen = p.is_varlen();
  const int64_t rows = varlen ? (operand.query_rows ? p.total_rows_q : p.total_rows_k)
                              : (operand.query_rows ? p.seqlen_q : p.seqlen_k);
  const cuuint64_t extent[4] = {static_cast<cuuint64_t>(p.head_dim),
                                static_cast<cuuint64_t>(rows > 0 ? rows : 1),
                                static_cast<cuuint64_t>(operand.heads),
                                static_cast<cuuint64_t>(varlen ? 1 : p.batch)};
  // Byte strides of dimensions 1..3; TMA wants multiples of 16 (checked by
  // unsupported_reason). A batch of one may have any batch stride.
  const int bytes = p.dtype == DataType::e4m3 ? 1 : 2;
  const cuuint64_t strides[3] = {
      static_cast<cuuint64_t>(operand.row_stride * bytes), static_cast<cuuint64_t>(operand.head_stride * bytes),
      static_cast<cuuint64_t>(
          (varlen || p.batch == 1 ? operand.head_stride * operand.heads : operand.batch_stride) * bytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(panel_bytes / bytes), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult status = encode_tiled()(
      &map,
      p.dtype == DataType::e4m3       ? CU_TENSOR_MAP_DATA_TYPE_UINT8
      : p.dtype == DataType::bfloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                      : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      4, const_cast<void*>(operand.base), extent, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, panel_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw_cuda_error(cudaErrorInvalidValue, "cuTensorMapEncodeTiled", __FILE__, __LINE__,
                     "driver error " + std::to_string(static_cast<int>(status)) +
                         " encoding the tensor map of " + operand.name + " for " +
                         describe_problem(p));
  return map;
}

CUtensorMap make_vt_tensor_map(const AttentionParams& p, const void* vt, int panel_keys) {
  if (panel_keys != 128 && panel_keys != 64)
    throw std::invalid_argument("make_vt_tensor_map: V^T panels of 64 or 128 keys; got " + std::to_string(panel_keys));
  const int64_t keys = std::max<int64_t>(fp8_vt_row_keys(p), 16);  // no keys: a map never read
  const cuuint64_t extent[4] = {static_cast<cuuint64_t>(keys), static_cast<cuuint64_t>(p.head_dim),
                                static_cast<cuuint64_t>(p.kv_heads), static_cast<cuuint64_t>(fp8_vt_planes(p))};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(keys), static_cast<cuuint64_t>(keys * p.head_dim),
                                 static_cast<cuuint64_t>(keys * p.head_dim * p.kv_heads)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(panel_keys), static_cast<cuuint32_t>(p.head_dim), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map;
  const CUresult status = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(vt), extent, strides, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, panel_keys == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw_cuda_error(cudaErrorInvalidValue, "cuTensorMapEncodeTiled", __FILE__, __LINE__,
                     "driver error " + std::to_string(static_cast<int>(status)) +
                         " encoding the tensor map of V^T (FP8) for " + describe_problem(p));
  return map;
}

DeviceLimits device_limits() {
  static std::mutex mutex;
  static std::map<int, DeviceLimits> limits_of_device;
  int device = 0;
  FLASHLAB_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  auto [entry, added] = limits_of_device.try_emplace(device);
  if (added) {
    FLASHLAB_CUDA_CHECK(cudaDeviceGetAttribute(&entry->second.multiprocessors,
                                               cudaDevAttrMultiProcessorCount, device));
    FLASHLAB_CUDA_CHECK(
        cudaDeviceGetAttribute(&entry->second.l2_bytes, cudaDevAttrL2CacheSize, device));
  }
  return entry->second;
}

size_t workspace_bytes(const AttentionParams& params) {
  if (params.dtype == DataType::e4m3) return kFp8VtOffset + static_cast<size_t>(fp8_vt_bytes(params));
  bool dynamic = false;
  if (HeadDims::contains(params.head_dim))
    FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
      dynamic = DefaultTraits<kHeadDim>::type::kDynamicSchedule && unequal_work_tiles(params);
    });
  return dynamic ? sizeof(int) : 0;  // the tile counter (the traced build leaves it unused)
}

// The FP8 forward's own limits (fa3_wgmma_sm90_kernel.cuh, Fp8Traits).
std::string fp8_unsupported_reason(const AttentionParams& params) {
  if (!Fp8HeadDims::contains(params.head_dim))
    return "fa3_wgmma_sm90 takes e4m3 (FP8) inputs at head_dim " + Fp8HeadDims::text() + " (64- or 128-byte rows); got " +
           std::to_string(params.head_dim);
  if (params.modification.any())
    return "fa3_wgmma_sm90's e4m3 (FP8) forward applies no score modifications (softcap, alibi_slopes, sinks)";
  if (params.trace.enabled()) return "fa3_wgmma_sm90's e4m3 (FP8) forward records no tile states";
  if (params.output_dtype != DataType::bfloat16 && params.output_dtype != DataType::float16)
    return std::string("fa3_wgmma_sm90's e4m3 (FP8) forward writes a bf16 or fp16 output; got ") +
           data_type_name(params.output_dtype);
  const bool batched = params.batch > 1;
  // q and k for TMA, v for the transpose's 16-byte loads.
  return stride_reason("fa3_wgmma_sm90 needs e4m3 q, k and v",
                       {batched ? params.q_batch_stride : 0, params.q_row_stride, params.q_head_stride,
                        batched ? params.k_batch_stride : 0, params.k_row_stride, params.k_head_stride,
                        batched ? params.v_batch_stride : 0, params.v_row_stride, params.v_head_stride},
                       16, "16-byte strides: TMA, the V transpose");
}

std::string unsupported_reason(const AttentionParams& params) {
  if (params.dtype == DataType::e4m3) {
    std::string reason = fp8_unsupported_reason(params);
    if (!reason.empty()) return reason;
  } else if (params.dtype != DataType::float16 && params.dtype != DataType::bfloat16) {
    return std::string("fa3_wgmma_sm90 supports float16, bfloat16 and e4m3 inputs; got ") +
           data_type_name(params.dtype);
  }
  if (!HeadDims::contains(params.head_dim))
    return "fa3_wgmma_sm90 supports head_dim " + HeadDims::text() + "; got " +
           std::to_string(params.head_dim);
  if (params.kv_heads <= 0 || params.heads % params.kv_heads != 0)
    return "fa3_wgmma_sm90 needs heads to be a multiple of kv_heads; got " +
           std::to_string(params.heads) + "/" + std::to_string(params.kv_heads);
  if (params.trace.enabled() && params.is_varlen())
    return "fa3_wgmma_sm90 records tile states for fixed-length batches only; got a "
           "variable-length batch";
  if (!aligned_pointer(params.q) || !aligned_pointer(params.k) || !aligned_pointer(params.v) ||
      !aligned_pointer(params.out))
    return "fa3_wgmma_sm90 needs q, k, v and out to start on 16-byte boundaries (TMA)";
  const bool batched = !params.is_varlen() && params.batch > 1;
  return stride_reason("fa3_wgmma_sm90 needs",
                       {batched ? params.q_batch_stride : 0,   params.q_row_stride,   params.q_head_stride,
                        batched ? params.k_batch_stride : 0,   params.k_row_stride,   params.k_head_stride,
                        batched ? params.v_batch_stride : 0,   params.v_row_stride,   params.v_head_stride,
                        batched ? params.out_batch_stride : 0, params.out_row_stride, params.out_head_stride},
                       8, "TMA takes 16-byte strides");
}

std::string backward_unsupported_reason(const AttentionBackwardParams& params) {
  if (params.dtype == DataType::e4m3) return "fa3_wgmma_sm90's e4m3 (FP8) path is a forward only";
  if (!BackwardHeadDims::contains(params.head_dim) && HeadDims::contains(params.head_dim))
    return "fa3_wgmma_sm90's backward supports head_dim " + BackwardHeadDims::text() + "; got " +
           std::to_string(params.head_dim) + " (fa2_mma_sm80 has a backward for it)";
  std::string reason = unsupported_reason(params);
  if (!reason.empty()) return reason;
  if (params.trace.enabled())
    return "fa3_wgmma_sm90's backward records no tile states (tile traces are forward only)";
  bool splits_head_dim = false;
  FLASHLAB_HEAD_DIM_SWITCH(BackwardHeadDims, params.head_dim, kHeadDim,
                           [&] { splits_head_dim = DefaultBwdTraits<kHeadDim>::type::kSplitsHeadDim; });
  if (splits_head_dim && params.modification.per_element())
    return "fa3_wgmma_sm90's backward takes no softcap or ALiBi at head_dim " + std::to_string(params.head_dim) +
           " (fa2_mma_sm80 does; sinks alone run)";
  if (!aligned_pointer(params.dout) || !aligned_pointer(params.dq) || !aligned_pointer(params.dk) ||
      !aligned_pointer(params.dv))
    return "fa3_wgmma_sm90's backward needs dout, dq, dk and dv to start on 16-byte boundaries (TMA)";
  const bool batched = !params.is_varlen() && params.batch > 1;
  return stride_reason(
      "fa3_wgmma_sm90's backward needs dout, dq, dk and dv",
      {batched ? params.dout_batch_stride : 0, params.dout_row_stride, params.dout_head_stride,
       batched ? params.dq_batch_stride : 0,   params.dq_row_stride,   params.dq_head_stride,
       batched ? params.dk_batch_stride : 0,   params.dk_row_stride,   params.dk_head_stride,
       batched ? params.dv_batch_stride : 0,   params.dv_row_stride,   params.dv_head_stride},
      8, "TMA takes 16-byte strides");
}

TileShape backward_tile_shape(const AttentionBackwardParams& params) {
  TileShape shape;
  FLASHLAB_HEAD_DIM_SWITCH(BackwardHeadDims, params.head_dim, kHeadDim, [&] {
    with_bwd_traits<kHeadDim>(params, [&](auto traits) {
      using Tr = decltype(traits);
      shape = {Tr::kBlockM, Tr::kBlockN};
    });
  });
  return shape;
}

BackwardWorkspace backward_workspace(const AttentionBackwardParams& params, int block_m, int block_n,
                                     bool tile_counter) {
  BackwardWorkspace workspace;
  AttentionBackwardParams one_accumulator = params;
  one_accumulator.deterministic = false;
  workspace.dq = fa2_mma_sm80::backward_workspace(one_accumulator, block_m, block_n);
  workspace.total_bytes = workspace.dq.total_bytes;
  if (workspace.total_bytes == 0) return workspace;  // no rows
  workspace.query_blocks = (params.seqlen_q + block_m - 1) / block_m;
  workspace.dq_block_slabs = dq_block_slabs(block_m, params.head_dim);
  const auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  // dq_accum_bytes is a multiple of 256: the semaphores follow the accumulator,
  // then the padded statistics.
  size_t end = workspace.dq.dq_accum_offset + workspace.dq.dq_accum_bytes;
  if (params.deterministic) {
    workspace.semaphore_offset = end;
    workspace.semaphore_bytes =
        round_up(static_cast<size_t>(params.batch) * params.heads * workspace.query_blocks *
                 workspace.dq_block_slabs * sizeof(int));
    end += workspace.semaphore_bytes;
  }
  if (tile_counter) {
    workspace.tile_counter_offset = end;
    workspace.tile_counter_bytes = round_up(sizeof(int));
    end += workspace.tile_counter_bytes;
  }
  const int64_t rows = params.is_varlen() ? params.total_rows_q : static_cast<int64_t>(params.batch) * params.seqlen_q;
  workspace.stats_rows = params.is_varlen()
                             ? (rows + static_cast<int64_t>(params.batch) * block_m + block_m - 1) / block_m * block_m
                             : static_cast<int64_t>(params.batch) * workspace.query_blocks * block_m;
  workspace.stats_bytes = round_up(static_cast<size_t>(workspace.stats_rows) * params.heads * sizeof(float));
  workspace.lse_log2_offset = std::max(end, workspace.dq.total_bytes);
  workspace.dsum_offset = workspace.lse_log2_offset + workspace.stats_bytes;
  workspace.total_bytes = workspace.dsum_offset + workspace.stats_bytes;
  return workspace;
}

size_t backward_workspace_bytes(const AttentionBackwardParams& params) {
  size_t bytes = 0;
  FLASHLAB_HEAD_DIM_SWITCH(BackwardHeadDims, params.head_dim, kHeadDim, [&] {
    with_bwd_traits<kHeadDim>(params, [&](auto traits) {
      using Tr = decltype(traits);
      bytes = backward_workspace(params, Tr::kBlockM, Tr::kBlockN, backward_schedules_dynamically<Tr>(params))
                  .total_bytes;
    });
  });
  return bytes;
}

}  // namespace fa3_wgmma_sm90

namespace {

void backward_launch(const AttentionBackwardParams& params) {
  // backward_unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(fa3_wgmma_sm90::BackwardHeadDims, params.head_dim, kHeadDim,
                           [&] { fa3_wgmma_sm90::launch_backward_at<kHeadDim>(params); });
}

using fa3_wgmma_sm90::BackwardHeadDims;
using fa3_wgmma_sm90::DefaultTraits;
using fa3_wgmma_sm90::HeadDims;

TileShape tile_shape(const AttentionParams& params) {
  TileShape shape;
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    using Tr = typename DefaultTraits<kHeadDim>::type;
    shape = {Tr::kBlockM, Tr::kBlockN};
    if constexpr (fa3_wgmma_sm90::Fp8HeadDims::contains(kHeadDim)) {
      if (params.dtype == DataType::e4m3)
        fa3_wgmma_sm90::with_fp8_traits<kHeadDim>(params, [&](auto fp8) {
          shape = {decltype(fp8)::kBlockM, decltype(fp8)::kBlockN};
        });
    }
  });
  return shape;
}

void launch(const AttentionParams& params) {
  // unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    if (params.dtype == DataType::e4m3) fa3_wgmma_sm90::launch_fp8_at<kHeadDim>(params);
    else fa3_wgmma_sm90::launch<typename DefaultTraits<kHeadDim>::type>(params);
  });
}

}  // namespace

KernelVariant fa3_wgmma_sm90_variant() {
  KernelVariant variant;
  variant.name = "fa3_wgmma_sm90";
  variant.summary =
      "FlashAttention-3 style forward for Hopper (TMA, wgmma, producer/consumer warpgroups, "
      "persistent grid), fp16/bf16 (e4m3 at head_dim " + fa3_wgmma_sm90::Fp8HeadDims::text("/") +
      ", forward only), head_dim " + HeadDims::text("/") +
      ", causal/window, GQA, varlen; backward (FA3-style, head_dim " + BackwardHeadDims::text("/") +
      ", deterministic mode); sm_90a only";
  variant.architectures = kSm90aOnly;
  variant.supports_tile_trace = true;
  variant.supports_e4m3 = true;
  // Score modifications: the kModified instantiations (common/score_modification.h).
  variant.forward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.backward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.key_tiles_descending = true;
  variant.unsupported_reason = fa3_wgmma_sm90::unsupported_reason;
  variant.padded_head_dim = HeadDims::round_up;  // e.g. 40 runs at 64
  variant.tile_shape = tile_shape;
  variant.launch = launch;
  variant.workspace_bytes = fa3_wgmma_sm90::workspace_bytes;
  variant.locate = fa3_wgmma_sm90::locate;
  variant.backward_unsupported_reason = fa3_wgmma_sm90::backward_unsupported_reason;
  variant.backward_workspace_bytes = fa3_wgmma_sm90::backward_workspace_bytes;
  variant.backward_launch = backward_launch;
  variant.backward_tile_shape = fa3_wgmma_sm90::backward_tile_shape;
  variant.backward_locate = fa3_wgmma_sm90::locate_backward;
  return variant;
}

// Tuning only (tuning_kernels(), flashlab-bench --sweep): the same kernel with
// no workspace, so every problem runs the static round-robin schedule; the
// A/B for the dynamic schedule under masks and varlen.
KernelVariant fa3_wgmma_sm90_static_schedule_variant() {
  KernelVariant variant = fa3_wgmma_sm90_variant();
  variant.name = "fa3_wgmma_sm90_static";
  variant.summary = "fa3_wgmma_sm90 with the static work-tile order under masks and varlen too "
                    "(no tile counter); tuning only";
  variant.workspace_bytes = nullptr;
  variant.supports_e4m3 = false;  // the FP8 forward's V^T lives in the workspace
  return variant;
}

}  // namespace flashlab
