// The options that describe one problem (--batch ... --layout): one grammar for
// flashlab-run and flashlab.testing (the Python harness), so the same words
// give the same ProblemSpec, and with it the same seeded inputs, in both.
#pragma once

#include <string>
#include <vector>

#include "flashlab/harness/arguments.h"
#include "flashlab/harness/problem.h"

namespace flashlab {

struct ProblemOptions {
  ProblemSpec spec;
  // Which options were given: defaults that depend on others, and the checks
  // between them (finish_problem_options), read these.
  bool kv_heads_given = false, seqlen_q_given = false, seqlen_k_given = false;
  bool seed_given = false;
  bool fixed_length_given = false;  // --batch, --seqlen-q or --seqlen-k
  bool fp8_option_given = false;    // --descale, --out-dtype or --hadamard (they go with --dtype e4m3)
};

// Registers --batch, --heads, --kv-heads, --seqlen-q, --seqlen-k, --seqlens,
// --seqlens-k, --head-dim, --dtype, --causal, --window-left, --window-right,
// --softmax-scale, --softcap, --alibi, --sinks, --outliers, --descale,
// --out-dtype, --hadamard, --seed, --layout and --float64-reference on `parser`, writing into `options` (which must outlive
// the parse). --kernel is the tool's.
void add_problem_options(ArgumentParser& parser, ProblemOptions& options);

// After the parse: kv heads default to heads, seqlen_k to seqlen_q, the seed
// to a fresh one (printed with the problem, so a run can be repeated); then
// the rules between options (heads a multiple of kv heads, --seqlens replaces
// the fixed lengths, packed-qkv needs equal query and key lengths, softcap >=
// 0). Throws ArgumentError.
void finish_problem_options(ProblemOptions& options);

// The problem options that give `spec` back through parse_problem (kernel,
// shape, dtype, masks, modifications, FP8 quantization, layout; no --seed).
// flashlab-run command lines: --locate's recipes, the sanitizer's case list.
std::string problem_arguments(const ProblemSpec& spec);

// A problem from problem options alone ("--batch", "2", "--causal", ...), as
// flashlab-run reads them. Throws ArgumentError (unknown options included;
// with require_seed, a missing --seed: callers that parse the same options
// again must not get a fresh seed each time).
ProblemSpec parse_problem(const std::vector<std::string>& arguments, const std::string& program,
                          bool require_seed = false);

}  // namespace flashlab
