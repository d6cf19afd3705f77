// fa2_mma_sm80 tuning configurations: alternative tilings of the same
// FlashAttention-2 forward kernel (fa2_mma_sm80_kernel.cuh) for head_dim 64 and
// 128, for flashlab-bench --sweep to show why DefaultTraits<D> was chosen.
// Tuning only: registered in tuning_kernels(), never in the tests' kernel
// matrix or "auto"; reachable by name through find_kernel(name, true).
//
// Each alias below is one configuration, Traits<HeadDim, BlockQ, BlockK, Warps,
// Stages, QInRegs>, varying one or two knobs against the head dim's default:
// block_q (rows per block: 64 gives each of 4 warps one m16 slab, 128 two),
// block_k (keys per K/V tile), warps (8 warps at block_q 128: one slab each),
// stages (cp.async K/V ring depth) and Q in registers vs re-read from shared
// memory with ldmatrix per key tile. The default configurations themselves are
// listed too (fa2_mma_sm80_tuning.cu adds DefaultTraits<D>::type, which
// reuses the generated fa2_mma_sm80_hdim<D>.cu instantiation).
//
// Limits: those of fa2_mma_sm80 (fp16 / bf16, sm_80+, 16-byte alignment),
// each configuration for its own head dim only; every one fits in the 227 KB
// of shared memory a block may opt into on sm_90 (checked below).
#pragma once

#include "sm80/fa2_mma_sm80/fa2_mma_sm80.h"

namespace flashlab::fa2_mma_sm80::tuning {

//                     Traits<D,   BQ,  BK,  W, S, QInRegs>
// head_dim 64; the default is Traits<64, 128, 128, 4, 2, false>.
using D64_Q128_K64_W4_S2_QRegs = Traits<64, 128, 64, 4, 2, true>;
using D64_Q128_K64_W4_S2 = Traits<64, 128, 64, 4, 2, false>;
using D64_Q128_K128_W4_S2_QRegs = Traits<64, 128, 128, 4, 2, true>;
using D64_Q128_K128_W4_S3 = Traits<64, 128, 128, 4, 3, false>;
using D64_Q64_K128_W4_S2 = Traits<64, 64, 128, 4, 2, false>;
using D64_Q128_K128_W8_S2 = Traits<64, 128, 128, 8, 2, false>;

// head_dim 128; the default is Traits<128, 128, 64, 4, 2, false>.
using D128_Q128_K32_W4_S2_QRegs = Traits<128, 128, 32, 4, 2, true>;
using D128_Q128_K32_W4_S3_QRegs = Traits<128, 128, 32, 4, 3, true>;
using D128_Q128_K32_W4_S2 = Traits<128, 128, 32, 4, 2, false>;
using D128_Q128_K64_W4_S3 = Traits<128, 128, 64, 4, 3, false>;
using D128_Q64_K64_W4_S2 = Traits<128, 64, 64, 4, 2, false>;
using D128_Q128_K64_W8_S2 = Traits<128, 128, 64, 8, 2, false>;

// The largest dynamic shared memory one block may opt into on sm_90 (the
// configurations here, at most 136 KB, also fit sm_80's 163 KB).
inline constexpr int kMaxSmemBytes = 227 * 1024;

// Each configuration runs through fa2_mma_sm80::launch<Tr> (fa2_mma_sm80.h),
// explicitly instantiated in fa2_mma_sm80_tuning_d<D>_part<N>.cu, a few
// configurations per file so each compiles in well under a minute (the
// defaults' instantiations are the registered kernel's generated files).

}  // namespace flashlab::fa2_mma_sm80::tuning
