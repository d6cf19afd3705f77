#include "flashlab/harness/flops.h"

namespace flashlab {

const char* direction_name(Direction direction) {
  switch (direction) {
    case Direction::forward: return "fwd";
    case Direction::backward: return "bwd";
    case Direction::forward_backward: return "fwdbwd";
  }
  return "?";
}

const std::vector<std::pair<std::string, Direction>>& direction_choices() {
  static const std::vector<std::pair<std::string, Direction>> choices = {
      {"fwd", Direction::forward}, {"bwd", Direction::backward}, {"fwdbwd", Direction::forward_backward}};
  return choices;
}

double direction_flop_multiplier(Direction direction) {
  switch (direction) {
    case Direction::forward: return 1.0;
    case Direction::backward: return 2.5;
    case Direction::forward_backward: return 3.5;
  }
  return 0;
}

double attention_flops(const ProblemSpec& spec, Direction direction) {
  // Two matmuls of 2*Sq*Sk*D each; a causal square problem does half the work.
  const double forward = 4.0 * spec.batch * spec.heads * spec.seqlen_q * double(spec.seqlen_k) * spec.head_dim;
  return (spec.causal ? forward / 2 : forward) * direction_flop_multiplier(direction);
}

}  // namespace flashlab
