// Seeded inputs from cuRAND's MT19937 generator: normal(0, 1) values generated
// in float32 and then cast, on the GPU or with cuRAND's host generator. The
// same seed gives the same values on both.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashlab {

// A float32 tensor of the given shape on `device` (kCPU uses the host generator;
// the last few seeds' host values are kept, since seeding it takes seconds).
at::Tensor mt19937_normal(at::IntArrayRef shape, uint64_t seed, at::Device device);

// cuRAND's MT19937 takes at most this many outputs a call (2^31 faulted with an
// illegal address: CUDA 13.0, H100, a batch-32 x 64k-key cache of 8 kv heads
// at head_dim 128); mt19937_normal asks for more in calls of this size, which
// continue the one sequence.
inline constexpr int64_t kMostMt19937BitsPerCall = int64_t(1) << 30;
// mt19937_normal with another call size (even): for tests.
at::Tensor mt19937_normal_in_calls(at::IntArrayRef shape, uint64_t seed, at::Device device,
                                   int64_t most_bits_per_call);

}  // namespace flashlab
