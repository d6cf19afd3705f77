#include "flashlab/harness/problem_options.h"

#include <iomanip>
#include <limits>
#include <random>
#include <sstream>

namespace flashlab {

namespace {
constexpr int kIntMax = std::numeric_limits<int>::max();

std::string comma_list(const std::vector<int>& values) {
  std::string text;
  for (const int value : values) text += (text.empty() ? "" : ",") + std::to_string(value);
  return text;
}
}  // namespace

std::string problem_arguments(const ProblemSpec& spec) {
  std::ostringstream text;
  text << std::setprecision(9) << "--kernel " << spec.kernel;
  if (spec.is_varlen()) {
    text << " --seqlens " << comma_list(spec.seqlens_q);
    if (!spec.seqlens_k.empty() && spec.seqlens_k != spec.seqlens_q) text << " --seqlens-k " << comma_list(spec.seqlens_k);
  } else {
    text << " --batch " << spec.batch << " --seqlen-q " << spec.seqlen_q << " --seqlen-k " << spec.seqlen_k;
  }
  text << " --heads " << spec.heads << " --kv-heads " << spec.kv_heads << " --head-dim " << spec.head_dim
       << " --dtype " << dtype_argument(spec.dtype);
  if (spec.causal) text << " --causal";
  if (spec.window_left >= 0) text << " --window-left " << spec.window_left;
  if (spec.window_right >= 0) text << " --window-right " << spec.window_right;
  if (spec.softmax_scale) text << " --softmax-scale " << *spec.softmax_scale;
  if (spec.softcap != 0.0) text << " --softcap " << spec.softcap;
  if (spec.alibi != ProblemSpec::Alibi::none)
    text << " --alibi " << (spec.alibi == ProblemSpec::Alibi::per_head ? "per-head" : "per-batch");
  if (spec.sinks) text << " --sinks";
  if (spec.outliers) text << " --outliers";
  if (spec.is_fp8())
    text << " --descale " << fp8_scaling_name(spec.fp8_scaling) << " --out-dtype "
         << dtype_argument(spec.fp8_output_dtype) << (spec.fp8_hadamard ? " --hadamard" : "");
  if (spec.layout == Layout::packed_qkv) text << " --layout packed-qkv";
  return text.str();
}

void add_problem_options(ArgumentParser& parser, ProblemOptions& options) {
  ProblemSpec& spec = options.spec;
  parser
      .option("--batch", "B", "(default 2)",
              [&](const std::string& v) {
                spec.batch = parse_int("--batch", v, 1, kIntMax), options.fixed_length_given = true;
              })
      .option("--heads", "H", "query heads (default 8)",
              [&](const std::string& v) { spec.heads = parse_int("--heads", v, 1, kIntMax); })
      .option("--kv-heads", "HKV", "key/value heads, H % HKV == 0 (default: H)",
              [&](const std::string& v) {
                spec.kv_heads = parse_int("--kv-heads", v, 1, kIntMax), options.kv_heads_given = true;
              })
      .option("--seqlen-q", "SQ", "(default 113)",
              [&](const std::string& v) {
                spec.seqlen_q = parse_int("--seqlen-q", v, 1, kIntMax);
                options.fixed_length_given = options.seqlen_q_given = true;
              })
      .option("--seqlen-k", "SK", "(default: SQ)",
              [&](const std::string& v) {
                spec.seqlen_k = parse_int("--seqlen-k", v, 1, kIntMax);
                options.fixed_length_given = options.seqlen_k_given = true;
              })
      .option("--seqlens", "L1,L2,...",
              "variable-length batch: per-sequence query lengths (>= 0; replaces\n--batch, --seqlen-q "
              "and --seqlen-k), inputs packed (total, H, D)",
              [&](const std::string& v) { spec.seqlens_q = parse_int_list("--seqlens", v, 0, kIntMax); })
      .option("--seqlens-k", "L1,L2,...", "per-sequence key lengths, as many as --seqlens (default: --seqlens)",
              [&](const std::string& v) { spec.seqlens_k = parse_int_list("--seqlens-k", v, 0, kIntMax); })
      .option("--head-dim", "D", "(default 64)",
              [&](const std::string& v) { spec.head_dim = parse_int("--head-dim", v, 1, kIntMax); })
      .option("--dtype", "fp32|fp16|bf16|e4m3",
              "(default fp16) e4m3: the FP8 forward; Q, K, V drawn in float32, then\nquantized "
              "(--descale), output --out-dtype",
              [&](const std::string& v) { spec.dtype = parse_dtype("--dtype", v); })
      .option("--descale", "per-head|per-tensor|none",
              "e4m3: one factor amax / 448 per (batch, kv head) (FA3's descales;\ndefault), one per tensor, "
              "or none (a plain cast)",
              [&](const std::string& v) {
                spec.fp8_scaling = parse_choice<Fp8Scaling>(
                    "--descale", v,
                    {{"per-head", Fp8Scaling::per_head}, {"per-tensor", Fp8Scaling::per_tensor}, {"none", Fp8Scaling::none}});
                options.fp8_option_given = true;
              })
      .option("--out-dtype", "bf16|fp16", "e4m3: the output's dtype (default bf16)",
              [&](const std::string& v) {
                spec.fp8_output_dtype =
                    parse_choice<at::ScalarType>("--out-dtype", v, {{"bf16", at::kBFloat16}, {"fp16", at::kHalf}});
                options.fp8_option_given = true;
              })
      .flag("--hadamard",
            "e4m3: Q and K times a random-sign Hadamard matrix (from the seed) before\nquantizing "
            "(q k^T unchanged; FA3's incoherent processing); head_dim a power of two",
            [&] { spec.fp8_hadamard = true, options.fp8_option_given = true; })
      .flag("--outliers", "channels 3-6 of Q, K and V 20x larger (activations' outlier features)",
            [&] { spec.outliers = true; })
      .flag("--causal", "bottom-right aligned causal mask", [&] { spec.causal = true; })
      .option("--window-left", "N", "sliding window, -1 = unbounded (default -1)",
              [&](const std::string& v) { spec.window_left = parse_int("--window-left", v, -1, kIntMax); })
      .option("--window-right", "N", "(default -1)",
              [&](const std::string& v) { spec.window_right = parse_int("--window-right", v, -1, kIntMax); })
      .option("--softmax-scale", "X", "(default 1/sqrt(D))",
              [&](const std::string& v) { spec.softmax_scale = parse_number("--softmax-scale", v); })
      .option("--softcap", "X", "cap the scaled scores at X * tanh(s / X) (flash-attn's softcap; 0 = off)",
              [&](const std::string& v) { spec.softcap = parse_number("--softcap", v); })
      .option("--alibi", "per-head|per-batch",
              "ALiBi slopes 2^(-8 (h + 1) / H), per head, or per batch entry and head\n(times (b + 1) / B)",
              [&](const std::string& v) {
                spec.alibi = parse_choice<ProblemSpec::Alibi>(
                    "--alibi", v,
                    {{"per-head", ProblemSpec::Alibi::per_head}, {"per-batch", ProblemSpec::Alibi::per_batch}});
              })
      .flag("--sinks",
            "a sink logit per head, normal(0, 1) from the seed, in every row's softmax\ndenominator "
            "(--backward also checks dsinks)",
            [&] { spec.sinks = true; })
      .option("--seed", "N", "(default: a fresh seed, printed so the run can be repeated)",
              [&](const std::string& v) {
                spec.seed = static_cast<uint64_t>(parse_integer("--seed", v, 0));
                options.seed_given = true;
              })
      .option("--layout", "bshd|packed-qkv", "packed-qkv: Q, K, V are views of one (B, S, H+2*HKV, D) tensor",
              [&](const std::string& v) {
                spec.layout =
                    parse_choice<Layout>("--layout", v, {{"bshd", Layout::bshd}, {"packed-qkv", Layout::packed_qkv}});
              })
      .flag("--float64-reference", "compare against a float64 reference (always for fp32)",
            [&] { spec.float64_reference = true; });
}

void finish_problem_options(ProblemOptions& options) {
  ProblemSpec& spec = options.spec;
  if (!options.kv_heads_given) spec.kv_heads = spec.heads;
  if (!options.seqlen_k_given) spec.seqlen_k = spec.seqlen_q;
  if (!options.seed_given) spec.seed = std::random_device{}() % 1000000;
  if (spec.heads % spec.kv_heads != 0)
    throw ArgumentError("--heads " + std::to_string(spec.heads) + " must be a multiple of --kv-heads " +
                        std::to_string(spec.kv_heads) + " (each kv head serves heads / kv_heads query heads)");
  if (!spec.seqlens_k.empty() && spec.seqlens_q.empty())
    throw ArgumentError("--seqlens-k needs --seqlens (the query lengths)");
  if (spec.is_varlen()) {
    if (options.fixed_length_given)
      throw ArgumentError("--seqlens replaces --batch, --seqlen-q and --seqlen-k; give one or the other");
    if (spec.key_seqlens().size() != spec.seqlens_q.size())
      throw ArgumentError("--seqlens-k must give as many lengths as --seqlens; got " +
                          std::to_string(spec.seqlens_k.size()) + " and " + std::to_string(spec.seqlens_q.size()));
    if (spec.layout == Layout::packed_qkv && spec.key_seqlens() != spec.seqlens_q)
      throw ArgumentError("--layout packed-qkv needs --seqlens-k equal to --seqlens");
  } else if (spec.layout == Layout::packed_qkv && spec.seqlen_q != spec.seqlen_k) {
    throw ArgumentError("--layout packed-qkv needs --seqlen-q == --seqlen-k");
  }
  if (options.fp8_option_given && !spec.is_fp8())
    throw ArgumentError("--descale, --out-dtype and --hadamard go with --dtype e4m3 (the FP8 forward)");
  if (spec.fp8_hadamard && (spec.head_dim & (spec.head_dim - 1)) != 0)
    throw ArgumentError("--hadamard needs a power-of-two --head-dim (Sylvester's construction); got " +
                        std::to_string(spec.head_dim));
  if (spec.is_fp8() && spec.layout == Layout::packed_qkv)
    throw ArgumentError("--dtype e4m3 takes the bshd layout (Q, K and V are quantized one by one), not --layout "
                        "packed-qkv");
  if (spec.softcap < 0.0)
    throw ArgumentError("--softcap must be >= 0 (0 = off); got " + std::to_string(spec.softcap));
}

ProblemSpec parse_problem(const std::vector<std::string>& arguments, const std::string& program,
                          bool require_seed) {
  ProblemOptions options;
  ArgumentParser parser(program, "One seeded attention problem.");
  add_problem_options(parser, options);
  std::vector<const char*> argv{program.c_str()};
  for (const std::string& argument : arguments) argv.push_back(argument.c_str());
  if (parser.parse(static_cast<int>(argv.size()), argv.data()).help)
    throw ArgumentError("the problem options are:\n" + parser.usage());
  if (require_seed && !options.seed_given)
    throw ArgumentError("--seed is needed: " + program + " parses the options at every call, and each would draw "
                        "a fresh seed");
  finish_problem_options(options);
  return options.spec;
}

}  // namespace flashlab
