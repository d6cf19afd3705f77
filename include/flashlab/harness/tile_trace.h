// The tile-state diff: a kernel that opts in (KernelVariant::supports_tile_trace)
// records its online-softmax state (running max m, running sum l) per query row
// after every key tile into AttentionParams::trace. The harness recomputes the
// same states in float64 with the kernel's block_k and names the first
// (key tile, row, statistic) where they part. Opting in costs a kernel a few
// lines: write m and l at [batch][head][row][key_tile] when trace.enabled().
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flashlab/kernel_registry.h"
#include "flashlab/harness/problem.h"

namespace flashlab {

struct ExpectedTileStates {
  at::Tensor row_max;  // (batch, heads, seqlen_q, key tiles), float64, -inf before any visible key
  at::Tensor row_sum;  // same shape: sum of exp(score - row_max) over the keys seen so far
};

// q: (B, Sq, H, D), k/v: (B, Sk, Hkv, D); the same masking as reference_attention.
// descending: the key tiles are visited from the last one down (the state at
// tile t then covers tiles t..last), as KernelVariant::key_tiles_descending says.
ExpectedTileStates expected_tile_states(const at::Tensor& q, const at::Tensor& k, double softmax_scale,
                                        int window_left, int window_right, int block_k,
                                        bool descending = false);

struct TileStateDifference {
  int64_t batch = 0, head = 0, row = 0, key_tile = 0;
  std::string statistic;  // "m" (running max) or "l" (running sum)
  double kernel_value = 0, expected_value = 0;
};

struct TileTraceReport {
  std::string kernel, problem;
  TileShape tiles;
  bool key_tiles_descending = false;  // the kernel's visiting order
  int64_t key_tiles = 0;
  int64_t recorded = 0;   // (row, tile) states the kernel wrote (tiles it skipped whole are not)
  int64_t differing = 0;  // states where m or l departs
  std::optional<TileStateDifference> first_difference;  // first key tile visited, then batch, head, row
  // The first recorded state (in visiting order) whose m is NaN or +inf or
  // whose l is NaN or inf: where a NaN/inf entered the online softmax.
  std::optional<TileStateDifference> first_nonfinite;
  bool matches() const { return recorded > 0 && differing == 0; }
  std::string format() const;
  std::string to_json() const;
};

// What the trace buffers hold before the launch: a NaN of its own bit pattern
// (no kernel computes it), so a state the kernel never wrote is told apart
// from one it wrote as NaN. recorded_states: true where the kernel wrote.
at::Tensor unwritten_trace_states(at::IntArrayRef sizes, const at::TensorOptions& options);
at::Tensor recorded_states(const at::Tensor& row_max);

// The first (in visiting order, then batch, head, row) recorded state whose m
// is NaN or +inf or whose l is NaN or +-inf; statistic "m" when m is, else "l".
// row_max, row_sum, recorded: (batch, heads, seqlen_q, key tiles).
std::optional<TileStateDifference> first_nonfinite_state(const at::Tensor& row_max,
                                                         const at::Tensor& row_sum,
                                                         const at::Tensor& recorded,
                                                         bool descending);

// Runs `kernel` (a registered or test-only one) on the spec's inputs with tile
// tracing on and diffs the recorded states against expected_tile_states.
TileTraceReport trace_tiles(const ProblemSpec& spec, const KernelVariant& kernel);
// trace_tiles' diff step for states any code recorded (flashlab.testing: a
// Triton kernel writing m and l): row_max and row_sum float32 (batch, heads,
// seqlen_q, key tiles), made by unwritten_trace_states before the run; m in
// natural-log units of the scaled scores, l = sum of exp(score - m). `name`
// and `tiles` are what the report names. Fixed-length problems only.
TileTraceReport tile_trace_report(const std::string& name, const ProblemSpec& spec, const ProblemInputs& inputs,
                                  const TileShape& tiles, bool descending, const at::Tensor& row_max,
                                  const at::Tensor& row_sum);

// The expected (m, l) of one row after one key tile, for cuda-gdb checks.
std::pair<double, double> expected_state_at(const ProblemSpec& spec, int block_k, int64_t batch,
                                            int64_t head, int64_t row, int64_t key_tile,
                                            bool descending = false);

}  // namespace flashlab
