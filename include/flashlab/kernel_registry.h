// The registered kernel variants: what "auto" chooses from, what the tests'
// matrix and the benchmark iterate over. A kernel file defines one function
// returning its KernelVariant; src/ops/registry.cpp lists those functions.
// Developer kernels (planted bugs, tuning configurations) are listed apart, in
// flashlab/harness/dev_kernels.h, and only the tools and tests link them.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "flashlab/kernel_params.h"

namespace flashlab {

struct TileShape {
  int block_q = 0;  // query rows per thread block
  int block_k = 0;  // key rows per inner-loop step
};

// Which compute capabilities a kernel's compiled code really runs on, and the
// words that say so ("<kernel> runs on <description>; this device has 8.6").
struct Architectures {
  bool (*runs_on)(int compute_capability) = nullptr;
  const char* description = "";
};

// Kernels of flashlab_kernels_sm80 (mma.sync, ldmatrix, cp.async: sm_80
// instructions), built for "80;90a": CMake's "80" embeds sm_80 SASS, which runs
// on every 8.x device, and compute_80 PTX, which the driver JIT-compiles on
// devices newer than 9.0 (10.x, 12.x: a one-time compile at the first launch);
// "90a" adds sm_90a SASS for 9.0. So: compute capability 8.0 and newer. (Built
// without 80 in FLASHLAB_CUDA_ARCHITECTURES, this would not hold.)
inline bool runs_on_sm80_or_newer(int compute_capability) { return compute_capability >= 80; }
inline constexpr Architectures kSm80OrNewer{
    runs_on_sm80_or_newer,
    "compute capability 8.0 or newer (sm_80 SASS on 8.x, sm_90a SASS on 9.0, compute_80 PTX "
    "JIT-compiled on later GPUs)"};

// Kernels of flashlab_kernels_sm90a (wgmma, TMA, setmaxnreg): sm_90a code runs
// on compute capability 9.0 exactly, neither on 8.x nor on 10.x and later.
inline bool runs_on_sm90a(int compute_capability) { return compute_capability == 90; }
inline constexpr Architectures kSm90aOnly{runs_on_sm90a, "compute capability 9.0 (sm_90a)"};

struct KernelVariant {
  std::string name;
  std::string summary;  // one line: algorithm and limits
  Architectures architectures;  // kSm80OrNewer, kSm90aOnly: the library the kernel is in
  bool supports_tile_trace = false;
  // The order a query block visits its key tiles (the tile trace's running
  // states follow it): ascending, or from the last tile down (fa3, so the
  // tiles a causal diagonal cuts come first).
  bool key_tiles_descending = false;

  // Empty string when the kernel can run the problem, else a sentence naming
  // what was given and what the kernel accepts. Must not touch the device. The
  // device's compute capability is checked apart (architectures).
  std::string (*unsupported_reason)(const AttentionParams& params) = nullptr;
  TileShape (*tile_shape)(const AttentionParams& params) = nullptr;
  // Bytes of device workspace a launch needs (dq accumulators, split-KV
  // partials, scheduler semaphores); nullptr: none. The op library allocates it
  // and passes it in params.workspace.
  size_t (*workspace_bytes)(const AttentionParams& params) = nullptr;
  // Enqueues the kernel on params.stream. Checks its own launch error.
  void (*launch)(const AttentionParams& params) = nullptr;

  // The backward pass, when the kernel has one (nullptr: none). The workspace
  // (backward_workspace_bytes, allocated by the op library into
  // params.workspace) holds what the kernel needs beyond dq/dk/dv: the launch
  // carves softmax_d and dq_accum out of it on its own copy of the block and
  // zeroes what must start at zero. Checks its own launch errors.
  std::string (*backward_unsupported_reason)(const AttentionBackwardParams& params) = nullptr;
  size_t (*backward_workspace_bytes)(const AttentionBackwardParams& params) = nullptr;
  void (*backward_launch)(const AttentionBackwardParams& params) = nullptr;
  // The backward's tiles: block_q query rows per inner step, block_k key rows
  // per thread block (the key block that owns dk and dv). The harness names
  // them in dq/dk/dv reports; nullptr: it names the forward's tile_shape.
  TileShape (*backward_tile_shape)(const AttentionBackwardParams& params) = nullptr;
};

const std::vector<KernelVariant>& registered_kernels();
// nullptr when no registered kernel has that name.
const KernelVariant* find_kernel(std::string_view name);
std::string registered_kernel_names();  // "fa2_mma_sm80, fa1_scalar"

// "9.0" for 90.
std::string compute_capability_text(int compute_capability);
// Empty when the kernel's code runs on this compute capability (or it is 0,
// unknown), else "fa3_wgmma_sm90 runs on compute capability 9.0 (sm_90a); this
// device has 8.0".
std::string architecture_reason(const KernelVariant& kernel, int compute_capability);
// Everything that stops `kernel` from running `params`, in the order a user
// fixes it: the problem (unsupported_reason), the device
// (params.device_compute_capability), a requested tile trace. Empty: it can.
std::string cannot_run_reason(const KernelVariant& kernel, const AttentionParams& params);

}  // namespace flashlab
