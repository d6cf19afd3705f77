// fa2_mma_sm80: the FlashAttention-2 forward and backward passes on tensor cores
// with sm_80 instructions (mma.sync m16n8k16 + ldmatrix + cp.async; runs on
// sm_80 and newer).
//
// This file holds the registry descriptor, the support checks, the backward's
// workspace layout and the dispatch on head_dim, all driven by
// fa2_mma_sm80::HeadDims (fa2_mma_sm80.h); it compiles no kernel. The kernel
// templates are fa2_mma_sm80_kernel.cuh (forward) and
// fa2_mma_sm80_bwd_kernel.cuh (backward: algorithm, tiling, deterministic
// mode); each head dim is instantiated in its own generated
// fa2_mma_sm80_hdim<D>.cu and fa2_mma_sm80_bwd_hdim<D>.cu.
//
// Tiling: DefaultTraits<D> in fa2_mma_sm80.h: block_q 128 with 4 warps (two m16
// row slabs per warp) and block_k 64 (128 for D = 64) up to D = 128; block_q 64
// with 4 warps (one slab each) and block_k 32 above; K/V double-buffered with
// cp.async. Alternative tilings (tuning only, flashlab-bench --sweep) are in
// src/kernels/dev/fa2_mma_sm80_tuning. Backward: DefaultBwdTraits<D>, one block
// per 128 keys (64 above D = 128) walking query blocks of 128 rows (D <= 64) or
// 64, 8 warps.
//
// Limits: fp16 / bf16; head_dim in HeadDims (32, 64, 96, 128, 256); 16-byte
// aligned base pointers and strides that are multiples of 8 elements (dout, dq,
// dk, dv too). Tile tracing (--trace-tiles) from a traced instantiation of the
// default tilings, key tiles visited in ascending order. The backward needs 130-160 KB of shared memory
// per block (refused on compute capabilities that offer less, e.g. 8.6).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "flashlab/kernel_registry.h"
#include "flashlab/cuda_check.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"
#include "sm80/fa2_mma_sm80/fa2_mma_sm80_locate.h"

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

// ---------------------------------------------------------------------------
// The backward pass (fa2_mma_sm80_bwd_kernel.cuh).

namespace {

// Largest dynamic shared memory a block may opt into, in KB, by compute
// capability; 0 when not known here (the launch then finds out).
int max_block_shared_kb(int compute_capability) {
  switch (compute_capability) {
    case 80: case 87: return 163;
    case 86: case 89: case 120: case 121: return 99;
    case 90: case 100: case 103: return 227;
    default: return 0;
  }
}

// block_q: query rows per step of a thread block's walk; block_k: the keys a
// thread block owns (its dk/dv rows). Zeros for head dims without a tiling.
TileShape backward_tile_shape(const AttentionBackwardParams& params) {
  TileShape shape{0, 0};
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    using Tr = typename fa2_mma_sm80::DefaultBwdTraits<kHeadDim>::type;
    shape = {Tr::kBlockM, Tr::kBlockN};
  });
  return shape;
}

// Deterministic mode: how many dq accumulator slots (= thread blocks per (kv
// head, batch)), each block taking one key block of each round of `slots`
// (zigzag, fa2_mma_sm80_bwd_kernel.cuh), so causal work is spread evenly. Each
// thread block holds one SM (shared memory), so the choice is about waves: of
// 2 .. max(2, 4 * SMs / kv_blocks) slots (at most about four waves), the one
// whose wave count and key-block split waste the least, the fewest slots on a
// near tie but at least two where there are two key blocks: two slots beat one
// at equal waves by 3-4% (H100, head_dim 64, bf16, 1k x 16 and 4k x 4, not
// causal: 1.60 -> 1.53 ms and 5.73 -> 5.56 ms), as each block's walk halves.
// (Each slot is a whole float32 dq accumulator.) A function of the problem and
// the device's SM count only, so runs on one device agree bitwise.
int deterministic_slots(int64_t kv_blocks, int64_t key_blocks, int multiprocessors) {
  if (kv_blocks <= 0 || key_blocks <= 1) return 1;
  const auto efficiency = [&](int64_t slots) {
    const int64_t blocks = slots * kv_blocks;
    const int64_t waves = (blocks + multiprocessors - 1) / multiprocessors;
    const int64_t longest = (key_blocks + slots - 1) / slots;  // key blocks of the busiest block
    return static_cast<double>(blocks) / (waves * multiprocessors) *
           (static_cast<double>(key_blocks) / (slots * longest));
  };
  constexpr int64_t kFewest = 2;
  const int64_t about_four_waves = 4 * static_cast<int64_t>(multiprocessors) / kv_blocks;
  const int64_t most = std::max(kFewest, std::min(key_blocks, about_four_waves));
  int64_t best = kFewest;
  double best_efficiency = efficiency(kFewest);
  for (int64_t slots = kFewest + 1; slots <= most; ++slots) {
    const double slots_efficiency = efficiency(slots);
    if (slots_efficiency > best_efficiency + 0.02) {
      best = slots;
      best_efficiency = slots_efficiency;
    }
  }
  return static_cast<int>(best);
}

}  // namespace

// Multiprocessors and shared memory per multiprocessor of the current device,
// asked once per device; an H100 SXM's (132, 228 KB) when there is no device
// to ask.
namespace {
struct DeviceShape {
  int multiprocessors = 132;
  int shared_per_multiprocessor = 228 * 1024;
};
DeviceShape current_device_shape() {
  static std::mutex mutex;
  static std::map<int, DeviceShape> shape_of_device;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  const std::lock_guard<std::mutex> lock(mutex);
  auto [entry, added] = shape_of_device.try_emplace(device);
  if (added) {
    DeviceShape shape;
    if (cudaDeviceGetAttribute(&shape.multiprocessors, cudaDevAttrMultiProcessorCount, device) !=
            cudaSuccess ||
        cudaDeviceGetAttribute(&shape.shared_per_multiprocessor,
                               cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      shape = {};
    }
    entry->second = shape;
  }
  return entry->second;
}
}  // namespace

int fa2_mma_sm80::multiprocessor_count() { return current_device_shape().multiprocessors; }
int fa2_mma_sm80::shared_memory_per_multiprocessor() {
  return current_device_shape().shared_per_multiprocessor;
}

std::string fa2_mma_sm80::backward_unsupported_reason(const AttentionBackwardParams& params) {
  std::string reason = unsupported_reason(params);  // dtype, head_dim, GQA, grid, q/k/v/out
  if (!reason.empty()) return reason;
  if (params.lse == nullptr) return "fa2_mma_sm80's backward needs the forward's lse; got none";
  // dq, dk, dv may be absent when a caller only asks whether the problem is taken.
  const std::pair<const char*, const void*> pointers[] = {
      {"dout", params.dout}, {"dq", params.dq}, {"dk", params.dk}, {"dv", params.dv}};
  for (const auto& [name, pointer] : pointers) {
    const auto misalignment = reinterpret_cast<std::uintptr_t>(pointer) % 16;
    if (misalignment != 0)
      return std::string("fa2_mma_sm80's backward needs dout, dq, dk and dv to start on 16-byte "
                         "boundaries; ") +
             name + " starts " + std::to_string(misalignment) + " bytes past one";
  }
  const bool varlen_q = params.cu_seqlens_q != nullptr, varlen_k = params.cu_seqlens_k != nullptr;
  const std::pair<const char*, int64_t> strides[] = {
      {"dout batch", varlen_q ? 0 : params.dout_batch_stride},
      {"dout row", params.dout_row_stride},
      {"dout head", params.dout_head_stride},
      {"dq batch", varlen_q ? 0 : params.dq_batch_stride},
      {"dq row", params.dq_row_stride},
      {"dq head", params.dq_head_stride},
      {"dk batch", varlen_k ? 0 : params.dk_batch_stride},
      {"dk row", params.dk_row_stride},
      {"dk head", params.dk_head_stride},
      {"dv batch", varlen_k ? 0 : params.dv_batch_stride},
      {"dv row", params.dv_row_stride},
      {"dv head", params.dv_head_stride}};
  for (const auto& [name, stride] : strides)
    if (stride % 8 != 0)
      return std::string("fa2_mma_sm80's backward needs batch, row and head strides of dout, dq, "
                         "dk and dv that are multiples of 8 elements (16 bytes); the ") +
             name + " stride is " + std::to_string(stride);
  int smem_bytes = 0;
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    smem_bytes = fa2_mma_sm80::DefaultBwdTraits<kHeadDim>::type::kSmemBytes;
  });
  const int limit_kb = max_block_shared_kb(params.device_compute_capability);
  if (limit_kb > 0 && smem_bytes > limit_kb * 1024)
    return "fa2_mma_sm80's backward at head_dim " + std::to_string(params.head_dim) + " needs " +
           std::to_string((smem_bytes + 1023) / 1024) +
           " KB of shared memory per block; compute capability " +
           compute_capability_text(params.device_compute_capability) + " allows " +
           std::to_string(limit_kb) + " KB";
  return {};
}

fa2_mma_sm80::BackwardWorkspace fa2_mma_sm80::backward_workspace(
    const AttentionBackwardParams& params, int block_m, int block_n) {
  BackwardWorkspace workspace;
  const bool varlen = params.is_varlen();
  // Query rows of the whole batch (packed for variable-length batches).
  const int64_t rows = varlen ? params.total_rows_q
                              : static_cast<int64_t>(params.batch) * params.seqlen_q;
  if (params.batch <= 0 || params.heads <= 0 || rows <= 0) return workspace;
  const auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };

  // softmax_d: the LSE's extent (its strides, its rows).
  const int64_t lse_rows = varlen ? params.total_rows_q : params.seqlen_q;
  const int64_t d_elements = static_cast<int64_t>(params.batch - 1) * params.lse_batch_stride +
                             static_cast<int64_t>(params.heads - 1) * params.lse_head_stride +
                             lse_rows;
  workspace.softmax_d_offset = 0;
  workspace.softmax_d_bytes = round_up(static_cast<size_t>(d_elements) * sizeof(float));

  // dq accumulator (BackwardWorkspace): (heads, padded rows, head_dim) float32 a slot.
  const int64_t padded_seqlen_q =
      (static_cast<int64_t>(params.seqlen_q) + block_m - 1) / block_m * block_m;
  const int64_t padded_rows = varlen ? params.total_rows_q + static_cast<int64_t>(params.batch) * block_m
                                     : params.batch * padded_seqlen_q;
  workspace.dq_accum_row_stride = params.head_dim;
  workspace.dq_accum_head_stride = padded_rows * params.head_dim;
  workspace.dq_accum_batch_stride = (varlen ? block_m : padded_seqlen_q) * params.head_dim;
  workspace.dq_accum_slot_stride = params.heads * workspace.dq_accum_head_stride;
  if (params.deterministic) {
    const int64_t key_blocks = (params.seqlen_k + block_n - 1) / block_n;
    const int64_t kv_blocks = static_cast<int64_t>(params.batch) * params.kv_heads;
    workspace.dq_accum_slots =
        deterministic_slots(kv_blocks, key_blocks, fa2_mma_sm80::multiprocessor_count());
  }
  workspace.dq_accum_offset = workspace.softmax_d_offset + workspace.softmax_d_bytes;
  workspace.dq_accum_bytes = round_up(static_cast<size_t>(workspace.dq_accum_slots) *
                                      workspace.dq_accum_slot_stride * sizeof(float));
  workspace.slot_first_offset = workspace.dq_accum_offset + workspace.dq_accum_bytes;
  if (params.deterministic && params.window_left < 0)
    workspace.slot_first_bytes =
        round_up(static_cast<size_t>(params.batch) * workspace.dq_accum_slots * sizeof(int));
  workspace.total_bytes = workspace.slot_first_offset + workspace.slot_first_bytes;
  return workspace;
}

void fa2_mma_sm80::carve_backward_workspace(AttentionBackwardParams& params, const BackwardWorkspace& workspace,
                                            size_t total_bytes, const char* kernel) {
  if (total_bytes > 0 && (params.workspace == nullptr || params.workspace_bytes < total_bytes))
    throw_cuda_error(cudaErrorInvalidValue, "backward workspace", __FILE__, __LINE__,
                     std::string(kernel) + "'s backward needs " + std::to_string(total_bytes) +
                         " bytes of workspace (backward_workspace_bytes); got " +
                         std::to_string(params.workspace_bytes));
  unsigned char* const base = static_cast<unsigned char*>(params.workspace);
  params.softmax_d = reinterpret_cast<float*>(base + workspace.softmax_d_offset);
  params.dq_accum = reinterpret_cast<float*>(base + workspace.dq_accum_offset);
  params.dq_accum_batch_stride = workspace.dq_accum_batch_stride;
  params.dq_accum_row_stride = workspace.dq_accum_row_stride;
  params.dq_accum_head_stride = workspace.dq_accum_head_stride;
}

size_t fa2_mma_sm80::backward_workspace_bytes(const AttentionBackwardParams& params) {
  const TileShape tiles = backward_tile_shape(params);
  return tiles.block_k == 0 ? 0 : backward_workspace(params, tiles.block_q, tiles.block_k).total_bytes;
}

namespace {

void backward_launch(const AttentionBackwardParams& params) {
  // backward_unsupported_reason rejects other head dims before a launch.
  FLASHLAB_HEAD_DIM_SWITCH(HeadDims, params.head_dim, kHeadDim, [&] {
    fa2_mma_sm80::launch_backward<typename fa2_mma_sm80::DefaultBwdTraits<kHeadDim>::type>(params);
  });
}

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
      "FlashAttention-2 forward and backward on tensor cores (mma.sync m16n8k16, ldmatrix, "
      "cp.async double buffering), fp16/bf16, head_dim " + HeadDims::text("/") +
      ", causal/window, GQA, varlen, deterministic backward, split-KV decoding with a "
      "contiguous or paged KV cache";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = true;  // the traced instantiation (fa2_mma_sm80_kernel.cuh)
  // Score modifications: the kModified instantiations (common/score_modification.h).
  variant.forward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.backward_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  variant.key_tiles_descending = false;
  variant.unsupported_reason = fa2_mma_sm80::unsupported_reason;
  variant.padded_head_dim = HeadDims::round_up;  // e.g. 40 runs at 64
  variant.tile_shape = tile_shape;
  variant.launch = launch;
  variant.backward_unsupported_reason = fa2_mma_sm80::backward_unsupported_reason;
  variant.backward_workspace_bytes = fa2_mma_sm80::backward_workspace_bytes;
  variant.backward_launch = backward_launch;
  variant.backward_tile_shape = backward_tile_shape;
  variant.locate = fa2_mma_sm80::locate;
  variant.kvcache_unsupported_reason = fa2_mma_sm80::kvcache_unsupported_reason;
  variant.kvcache_num_splits = fa2_mma_sm80::kvcache_num_splits;
  variant.kvcache_max_splits = fa2_mma_sm80::kvcache_max_splits;
  variant.kvcache_workspace_bytes = fa2_mma_sm80::kvcache_workspace_bytes;
  variant.kvcache_launch = fa2_mma_sm80::kvcache_launch;
  variant.supports_block_timeline = true;  // fa2_mma_sm80_splitkv_kernel.cuh
  variant.kvcache_tile_shape = fa2_mma_sm80::kvcache_tile_shape;
  variant.kvcache_launch_summary = fa2_mma_sm80::kvcache_launch_summary;
  variant.kvcache_score_modifications = {.softcap = true, .alibi = true, .sinks = true};
  return variant;
}

}  // namespace flashlab
