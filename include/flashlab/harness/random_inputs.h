// Seeded inputs from cuRAND's MT19937 generator: normal(0, 1) values generated
// in float32 and then cast, on the GPU or with cuRAND's host generator. The
// same seed gives the same values on both.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace flashlab {

// A float32 tensor of the given shape on `device` (kCPU uses the host generator).
at::Tensor mt19937_normal(at::IntArrayRef shape, uint64_t seed, at::Device device);

}  // namespace flashlab
