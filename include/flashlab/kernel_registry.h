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

// Where one element of a forward problem lives while a kernel runs, for
// cuda-gdb (flashlab-run --locate B,H,ROW[,COL]). A kernel describes its own
// layout through KernelVariant::locate; pure arithmetic, no device.
//
// One register slot of one thread: `name` is what cuda-gdb prints
// ("acc_o[1][3][2]", "running_max"), `index` the same indices as numbers
// (empty for a scalar), so tests can check them against the kernel's formulas.
struct RegisterSlot {
  int thread[3] = {0, 0, 0};  // threadIdx
  int warp = 0, lane = 0;     // warp within the block (threadIdx.x / 32), lane
  std::string name;
  std::vector<int> index;
};

// A place to stop: the line `line_offset` lines after the one holding `marker`
// in the kernel source, with a condition in the kernel's own local names.
struct CudaGdbStop {
  std::string marker;
  int line_offset = 1;
  bool needs_trace = false;  // the line is in the traced instantiation only (--trace-tiles)
  bool fixed_length_only = false;  // that instantiation takes no variable-length batches
  std::string condition;     // "tile == 2 && row == 5 && batch == 0 && head == 1"
  bool focus_needed = true;  // false: the thread that stops is already the one to look at
  std::vector<std::string> prints;  // expressions to print there, in the focused thread
  std::string what;          // one line: what the prints show at that line
};

struct ElementLocation {
  std::string unavailable;  // non-empty: why the element cannot be located (row past its sequence)
  int grid[3] = {0, 0, 0};          // gridDim as launched
  int block_threads[3] = {0, 0, 0};  // blockDim
  int block[3] = {-1, -1, -1};      // blockIdx of the block that computes the row
  std::string block_note;  // how the block follows from the launch (persistent grids: what it assumed)
  int query_block = 0;     // the kernel's query tile of block_q rows holding the row
  int row_in_block = 0;
  std::vector<RegisterSlot> out;       // the thread(s) and slot(s) holding out[batch, row, head, col]
  std::string out_note;                // what the slot holds (unnormalized O, ...)
  std::vector<RegisterSlot> row_max;   // the row's running max m
  std::vector<RegisterSlot> row_sum;   // the row's running sum l (partial sums: all of them)
  std::string state_note;  // units of m, whether l is split over lanes
  int block_k = 0;
  std::vector<int> key_tiles;           // the key tiles the block visits, in visiting order
  int row_first_tile = 0, row_last_tile = -1;  // the tiles holding keys this row sees
  std::string source;  // the kernel source file, as compiled
  std::vector<CudaGdbStop> stops;  // first the preferred one
};

// Where the gradients of a backward problem live while a kernel's backward
// runs (flashlab-run --backward --locate B,H,ROW[,COL]): dK/dV[batch, ROW,
// H / (heads / kv_heads), COL] (key row ROW) and dQ[batch, ROW, H, COL]
// (query row ROW). Layout arithmetic only, like ElementLocation.
struct BackwardElementLocation {
  int grid[3] = {0, 0, 0};           // gridDim of the main kernel as launched
  int block_threads[3] = {0, 0, 0};  // blockDim
  int block_q = 0, block_k = 0;      // query rows a step, keys a block
  // dK / dV: the block that owns the key row, the registers that accumulate
  // them over the block's walk, and that walk.
  std::string keys_unavailable;  // non-empty: why (the key row is past its sequence)
  int key_block = 0;
  int key_block_tile = -1;               // its tile, in the order the CTAs take them
  int key_block_cta[3] = {-1, -1, -1};  // the blockIdx of the CTA that walks that tile (-1: decided at run time)
  RegisterSlot dk, dv;
  std::string key_note;   // what the registers hold, how the store scales them
  std::string walk_note;  // the query blocks and heads the block walks, in order
  // dQ: the key blocks that add the query row's partial dQ, in the order the
  // additions land (deterministic) or any order, from which thread and
  // register, and where in the float32 accumulator.
  std::string queries_unavailable;
  int query_block = 0;
  std::vector<int> adding_key_blocks;  // in addition order when dq_ordered
  bool dq_ordered = false;
  RegisterSlot dq;          // the same thread and register in every adding block
  int64_t dq_accum_element = 0;  // from the accumulator's start (this head, batch entry)
  std::string dq_note;
  std::string source;                  // the kernel source file, as compiled
  std::vector<CudaGdbStop> stops;      // key side first
};

struct KernelVariant {
  std::string name;
  std::string summary;  // one line: algorithm and limits
  Architectures architectures;  // kSm80OrNewer, kSm90aOnly: the library the kernel is in
  bool supports_tile_trace = false;
  // Takes e4m3 (FP8) inputs in the forward (AttentionParams::output_dtype,
  // the descales); the kernel choice refuses e4m3 problems to the others.
  bool supports_e4m3 = false;
  // The order a query block visits its key tiles (the tile trace's running
  // states follow it): ascending, or from the last tile down (fa3, so the
  // tiles a causal diagonal cuts come first).
  bool key_tiles_descending = false;
  // The score modifications (ScoreModificationParams) the kernel applies, per
  // mode; a problem with another is refused by the kernel choice
  // (score_modification_reason) before any other reason.
  struct ScoreModifications {
    bool softcap = false, alibi = false, sinks = false;
  };
  ScoreModifications forward_score_modifications, backward_score_modifications, kvcache_score_modifications;

  // Empty string when the kernel can run the problem, else a sentence naming
  // what was given and what the kernel accepts. Must not touch the device. The
  // device's compute capability is checked apart (architectures).
  std::string (*unsupported_reason)(const AttentionParams& params) = nullptr;
  // The head dim the kernel runs a problem of `head_dim` at: the smallest head
  // dim >= head_dim it has code for, 0 when it has none that large. The public
  // entries (attention_forward, attention_backward and their varlen and _into
  // forms) zero-pad q, k, v (and dout, out) to it and slice the result;
  // run_kernel and run_backward_kernel never pad. nullptr: the kernel runs
  // every head dim its unsupported_reason accepts as it is.
  int (*padded_head_dim)(int head_dim) = nullptr;
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
  // Where dK/dV of key row `row` (kv head head / group) and dQ of query row
  // `row` (head `head`) live (BackwardElementLocation); nullptr: the kernel
  // does not say. cu_seqlens may point to host memory.
  BackwardElementLocation (*backward_locate)(const AttentionBackwardParams& params, int batch, int head,
                                             int row, int col) = nullptr;

  // Decoding with a KV cache (KvCacheParams), when the kernel has it
  // (nullptr: none). kvcache_num_splits is the split heuristic: the splits the
  // kernel would use for num_splits = 0, and kvcache_max_splits the most it
  // takes. The workspace holds the split partials; the launch appends k_new /
  // v_new to the cache, runs the split kernel and, with more than one split,
  // the combine kernel. Checks its own launch errors.
  std::string (*kvcache_unsupported_reason)(const KvCacheParams& params) = nullptr;
  int (*kvcache_num_splits)(const KvCacheParams& params) = nullptr;
  int (*kvcache_max_splits)(const KvCacheParams& params) = nullptr;
  size_t (*kvcache_workspace_bytes)(const KvCacheParams& params) = nullptr;
  void (*kvcache_launch)(const KvCacheParams& params) = nullptr;
  // The split kernel's tiles: block_q packed rows (query rows x the query heads
  // of one kv head), block_k keys per step.
  TileShape (*kvcache_tile_shape)(const KvCacheParams& params) = nullptr;
  // How the launch runs params (params.num_splits as it will be launched): its
  // configuration, grid and launch shape in words, for reports (flashlab-run
  // --kvcache); nullptr: the kernel does not say.
  std::string (*kvcache_launch_summary)(const KvCacheParams& params) = nullptr;
  // The split kernel writes KvCacheParams::block_timeline (the blocks below
  // block_timeline_blocks); its grid is splits x packed-row tiles
  // (kvcache_tile_shape's block_q) x batch x kv_heads.
  bool supports_block_timeline = false;

  // Where out[batch, row, head, col] and the row's m and l live (block, warp,
  // lanes, register slots), the key tiles the row's block visits and where to
  // stop in cuda-gdb; nullptr: the kernel does not say. `params` is the block
  // the launch would get, except that cu_seqlens_* may point to host memory
  // (the hook reads them; it launches nothing). `row` counts within its
  // sequence (varlen: within batch entry `batch`).
  ElementLocation (*locate)(const AttentionParams& params, int batch, int head, int row,
                            int col) = nullptr;
};

const std::vector<KernelVariant>& registered_kernels();
// nullptr when no registered kernel has that name.
const KernelVariant* find_kernel(std::string_view name);
std::string registered_kernel_names();  // "fa2_mma_sm80, fa1_scalar"

// The head dim `kernel` runs head_dim at: its padded_head_dim hook's answer
// (0: none), or head_dim itself when it has no hook.
int padded_head_dim(const KernelVariant& kernel, int head_dim);

// "9.0" for 90.
std::string compute_capability_text(int compute_capability);
// Empty when the kernel's code runs on this compute capability (or it is 0,
// unknown), else "fa3_wgmma_sm90 runs on compute capability 9.0 (sm_90a); this
// device has 8.0".
std::string architecture_reason(const KernelVariant& kernel, int compute_capability);
// Everything that stops `kernel` from running `params` in their mode (the
// forward, the backward, a KV-cache call), in the order a user fixes it: the
// kernel has no such mode, the problem (the mode's unsupported_reason), the
// device (params.device_compute_capability), what the mode asks besides (a
// tile trace: forward only; a block timeline: KV cache). Empty: it can.
// Why `kernel` cannot apply `modification` in a mode (`mode`: which of its
// *_score_modifications; `mode_words`: "" for the forward, "'s backward",
// "'s KV-cache path"): the modifications it lacks, and the registered kernels
// that have them in that mode. Empty: it applies every one asked.
std::string score_modification_reason(
    const KernelVariant& kernel, const ScoreModificationParams& modification,
    KernelVariant::ScoreModifications KernelVariant::*mode = &KernelVariant::forward_score_modifications,
    const char* mode_words = "");
std::string cannot_run_reason(const KernelVariant& kernel, const AttentionParams& params);
std::string cannot_run_reason(const KernelVariant& kernel, const AttentionBackwardParams& params);
std::string cannot_run_reason(const KernelVariant& kernel, const KvCacheParams& params);

}  // namespace flashlab
