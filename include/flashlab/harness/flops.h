// What the benchmark counts: the floating-point work of one attention call in
// each direction, and the direction names its --direction option takes.
#pragma once

#include <string>
#include <vector>

#include "flashlab/harness/problem.h"

namespace flashlab {

enum class Direction { forward, backward, forward_backward };

// "fwd", "bwd", "fwdbwd".
const char* direction_name(Direction direction);
// Every direction with its name, in that order (for parse_choice and --help).
const std::vector<std::pair<std::string, Direction>>& direction_choices();

// FLOPs of the forward's two matmuls, 4 * batch * heads * seqlen_q * seqlen_k *
// head_dim, halved for a causal mask (exact for seqlen_q == seqlen_k at large
// seqlens, the benchmark's cases). The backward does five matmuls of that size
// (S and dP recomputed, dV, dK, dQ): 2.5x the forward's; forward + backward 3.5x.
// FlashAttention's papers count the same way.
double attention_flops(const ProblemSpec& spec, Direction direction = Direction::forward);
double direction_flop_multiplier(Direction direction);

}  // namespace flashlab
