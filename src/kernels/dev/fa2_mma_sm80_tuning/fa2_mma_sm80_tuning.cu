// fa2_mma_sm80 tuning configurations: the registry descriptors of the
// alternative tilings in fa2_mma_sm80_tuning.h (FlashAttention-2 forward on
// mma.sync m16n8k16 / ldmatrix / cp.async, the fa2_mma_sm80 kernel template)
// plus each head dim's default, so flashlab-bench --sweep can time them side by
// side. Tuning only: tuning_kernels() lists them; the tests and "auto" never do.
//
// Names spell the tiling: fa2_mma_sm80_d<head_dim>_q<block_q>_k<block_k>
// _w<warps>_s<stages>, with _qregs when Q is held in registers (otherwise it is
// re-read from shared memory for every key tile).
//
// Limits: those of fa2_mma_sm80 (fp16 / bf16, sm_80+, 16-byte alignment), and
// each configuration runs only its own head dim (64 or 128).
#include <string>
#include <type_traits>
#include <vector>

#include "fa2_mma_sm80_tuning.h"
#include "flashlab/kernel_registry.h"

namespace flashlab {
namespace {

namespace fa2 = fa2_mma_sm80;
namespace tuning = fa2_mma_sm80::tuning;

template <class Tr>
std::string config_name() {
  return "fa2_mma_sm80_d" + std::to_string(Tr::kHeadDim) + "_q" + std::to_string(Tr::kBlockQ) +
         "_k" + std::to_string(Tr::kBlockK) + "_w" + std::to_string(Tr::kWarps) + "_s" +
         std::to_string(Tr::kStages) + (Tr::kQInRegs ? "_qregs" : "");
}

template <class Tr>
std::string config_unsupported_reason(const AttentionParams& params) {
  if (params.head_dim != Tr::kHeadDim)
    return config_name<Tr>() + " is a tuning configuration for head_dim " +
           std::to_string(Tr::kHeadDim) + " only; got head_dim " + std::to_string(params.head_dim);
  return fa2::unsupported_reason(params);
}

template <class Tr>
TileShape config_tile_shape(const AttentionParams&) {
  return TileShape{Tr::kBlockQ, Tr::kBlockK};
}

template <class Tr, bool kIsDefault>
KernelVariant make_variant() {
  static_assert(Tr::kSmemBytes <= tuning::kMaxSmemBytes, "configuration exceeds 227 KB of shared memory");

  KernelVariant variant;
  variant.name = config_name<Tr>();
  variant.summary = "fa2_mma_sm80 tuning configuration" +
                    std::string(kIsDefault ? " (the default)" : "") + ": head_dim " +
                    std::to_string(Tr::kHeadDim) + ", block_q " + std::to_string(Tr::kBlockQ) +
                    ", block_k " + std::to_string(Tr::kBlockK) + ", " +
                    std::to_string(Tr::kWarps) + " warps with " + std::to_string(Tr::kMTiles) +
                    " m16 row slab" + (Tr::kMTiles > 1 ? "s" : "") + " each, " + std::to_string(Tr::kStages) + "-stage K/V ring, Q in " +
                    (Tr::kQInRegs ? "registers" : "shared memory") + ", " +
                    std::to_string(Tr::kSmemBytes / 1024) + " KB shared memory; fp16/bf16";
  variant.architectures = kSm80OrNewer;
  variant.supports_tile_trace = false;
  variant.unsupported_reason = config_unsupported_reason<Tr>;
  variant.tile_shape = config_tile_shape<Tr>;
  // Instantiated in the generated fa2_mma_sm80_hdim<D>.cu (defaults) or the part files here.
  variant.launch = fa2::launch<Tr>;
  return variant;
}

template <int HeadDim>
KernelVariant default_config() {
  return make_variant<typename fa2::DefaultTraits<HeadDim>::type, true>();
}

template <class Tr>
KernelVariant alternative_config() {
  static_assert(!std::is_same_v<Tr, typename fa2::DefaultTraits<Tr::kHeadDim>::type>,
                "this configuration is the default now: drop it from the alternatives");
  return make_variant<Tr, false>();
}

}  // namespace

// Per head dim: the default first, then the alternatives.
std::vector<KernelVariant> fa2_mma_sm80_tuning_variants() {
  return {
      default_config<64>(),
      alternative_config<tuning::D64_Q128_K64_W4_S2_QRegs>(),
      alternative_config<tuning::D64_Q128_K64_W4_S2>(),
      alternative_config<tuning::D64_Q128_K128_W4_S2_QRegs>(),
      alternative_config<tuning::D64_Q128_K128_W4_S3>(),
      alternative_config<tuning::D64_Q64_K128_W4_S2>(),
      alternative_config<tuning::D64_Q128_K128_W8_S2>(),
      default_config<128>(),
      alternative_config<tuning::D128_Q128_K32_W4_S2_QRegs>(),
      alternative_config<tuning::D128_Q128_K32_W4_S3_QRegs>(),
      alternative_config<tuning::D128_Q128_K32_W4_S2>(),
      alternative_config<tuning::D128_Q128_K64_W4_S3>(),
      alternative_config<tuning::D128_Q64_K64_W4_S2>(),
      alternative_config<tuning::D128_Q128_K64_W8_S2>(),
  };
}

}  // namespace flashlab
