// "Where is this element": for a kernel that describes its layout
// (KernelVariant::locate) and a problem, the block, warp, lanes and register
// slots that hold out[batch, row, head, col] and the row's running max and sum,
// the key tiles the row's block visits, and the cuda-gdb commands that stop
// there (flashlab-run --locate B,H,ROW[,COL]). Layout arithmetic only: no GPU.
#pragma once

#include <optional>
#include <string>

#include "flashlab/harness/problem.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {

// The flashlab-run options that give this problem ("--kernel fa2_mma_sm80
// --batch 1 --heads 2 ... --seed 7").
std::string run_options(const ProblemSpec& spec);

// The 1-based line `offset` lines after the first line of `source` that holds
// `marker`; 0 when the file cannot be read or holds no such line.
int marker_line(const std::string& source, const std::string& marker, int offset = 1);

// The kernel's locate hook on the spec's parameter block, built on the host
// (cu_seqlens in host memory). Throws c10::Error when the kernel has no hook,
// or batch, head or col are out of range.
ElementLocation locate_element(const KernelVariant& kernel, const ProblemSpec& spec, int batch,
                               int head, int row, int col);

// The key tile a cuda-gdb stop names: of the tiles the block visits (in its
// order) that hold keys the row sees, the second (the first that continues
// from an earlier tile's state), or the first when there is one; -1 when the
// block visits none.
int chosen_key_tile(const ElementLocation& location);

// flashlab-run --locate's text. col: nullopt means "not given" (column 0 is
// shown, with the rule for the others). `program`: the debug build's
// flashlab-run as the commands should name it.
std::string format_location(const KernelVariant& kernel, const ProblemSpec& spec, int batch,
                            int head, int row, std::optional<int> col,
                            const std::string& program = "build/debug/flashlab-run");

// The backward (flashlab-run --backward --locate B,H,ROW[,COL]): the kernel's
// backward_locate hook on the spec's backward parameter block (deterministic
// or not), built on the host; throws c10::Error when the kernel has no hook or
// batch, head or col are out of range.
BackwardElementLocation locate_backward_element(const KernelVariant& kernel, const ProblemSpec& spec,
                                                bool deterministic, int batch, int head, int row, int col);
// Its text: where dK/dV of key row ROW and dQ of query row ROW live, and the
// cuda-gdb commands that stop there.
std::string format_backward_location(const KernelVariant& kernel, const ProblemSpec& spec, bool deterministic,
                                     int batch, int head, int row, std::optional<int> col,
                                     const std::string& program = "build/debug/flashlab-run");

}  // namespace flashlab
