// Turns pairs of MT19937 32-bit outputs into two normal(0, 1) floats (Box-Muller)
// using only correctly rounded float operations (+, -, *, /, sqrt) in a fixed
// order, with hand-written log and sin/cos polynomials. The host and the GPU
// therefore produce bitwise identical values from identical bits, which
// curandGenerateNormal does not guarantee (its host and device results differ
// in the last bit). Accuracy: about 1e-7 relative to exact Box-Muller.
#pragma once

#include <cstdint>
#include <cstring>

#include "flashlab/kernel_params.h"  // FLASHLAB_HOST_DEVICE

namespace flashlab::normal_from_bits_detail {

// Explicitly rounded operations: nvcc must not contract a*b+c into an FMA on the
// device (the host build compiles this with -ffp-contract=off for the same reason).
FLASHLAB_HOST_DEVICE inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FLASHLAB_HOST_DEVICE inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FLASHLAB_HOST_DEVICE inline float divide(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FLASHLAB_HOST_DEVICE inline float square_root(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}

// ln(x) for x in (0, 1]: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), then the
// atanh series ln(m) = 2 (s + s^3/3 + ...), s = (m - 1) / (m + 1), |s| < 0.172.
FLASHLAB_HOST_DEVICE inline float natural_log(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  int exponent = static_cast<int>((bits >> 23) & 0xff) - 127;
  bits = (bits & 0x007fffffu) | 0x3f800000u;  // mantissa in [1, 2)
  float mantissa;
  memcpy(&mantissa, &bits, sizeof mantissa);
  if (mantissa > 1.41421356f) {
    mantissa = mul(mantissa, 0.5f);
    exponent += 1;
  }
  const float s = divide(add(mantissa, -1.f), add(mantissa, 1.f));
  const float s2 = mul(s, s);
  float series = 1.f / 13.f;
  series = add(mul(series, s2), 1.f / 11.f);
  series = add(mul(series, s2), 1.f / 9.f);
  series = add(mul(series, s2), 1.f / 7.f);
  series = add(mul(series, s2), 1.f / 5.f);
  series = add(mul(series, s2), 1.f / 3.f);
  series = add(mul(series, s2), 1.f);
  const float log_mantissa = mul(mul(2.f, s), series);
  return add(mul(static_cast<float>(exponent), 0.693147180559945f), log_mantissa);
}

// sin and cos of y in [0, pi/2) by Taylor series (error < 1e-9 before rounding).
FLASHLAB_HOST_DEVICE inline void sine_cosine(float y, float& sine, float& cosine) {
  const float y2 = mul(y, y);
  float s = 1.f / 6227020800.f;                  // 1/13!
  s = add(mul(s, y2), -1.f / 39916800.f);        // -1/11!
  s = add(mul(s, y2), 1.f / 362880.f);           // 1/9!
  s = add(mul(s, y2), -1.f / 5040.f);            // -1/7!
  s = add(mul(s, y2), 1.f / 120.f);              // 1/5!
  s = add(mul(s, y2), -1.f / 6.f);               // -1/3!
  s = add(mul(s, y2), 1.f);
  sine = mul(s, y);
  float c = 1.f / 87178291200.f;                 // 1/14!
  c = add(mul(c, y2), -1.f / 479001600.f);       // -1/12!
  c = add(mul(c, y2), 1.f / 3628800.f);          // 1/10!
  c = add(mul(c, y2), -1.f / 40320.f);           // -1/8!
  c = add(mul(c, y2), 1.f / 720.f);              // 1/6!
  c = add(mul(c, y2), -1.f / 24.f);              // -1/4!
  c = add(mul(c, y2), 0.5f);                     // 1/2!
  cosine = add(1.f, -mul(c, y2));
}

}  // namespace flashlab::normal_from_bits_detail

namespace flashlab {

// Two normal(0, 1) values from two 32-bit generator outputs.
FLASHLAB_HOST_DEVICE inline void normal_pair_from_bits(uint32_t first, uint32_t second, float& z0,
                                                       float& z1) {
  using namespace normal_from_bits_detail;
  // 24-bit uniforms, exact in float: u1 in (0, 1], u2 in [0, 1).
  const float u1 = mul(static_cast<float>((first >> 8) + 1u), 5.9604644775390625e-08f);
  const float quarter_turns = mul(static_cast<float>(second >> 8), 2.384185791015625e-07f);  // 4 * u2
  const int quadrant = static_cast<int>(quarter_turns);  // floor: exact
  const float fraction = add(quarter_turns, -static_cast<float>(quadrant));
  const float radius = square_root(mul(-2.f, natural_log(u1)));
  float sine, cosine;
  sine_cosine(mul(fraction, 1.57079632679489662f), sine, cosine);
  // Rotate by the quadrant: angle = quadrant * pi/2 + fraction * pi/2.
  float c = cosine, s = sine;
  if (quadrant == 1) c = -sine, s = cosine;
  if (quadrant == 2) c = -cosine, s = -sine;
  if (quadrant == 3) c = sine, s = -cosine;
  z0 = mul(radius, c);
  z1 = mul(radius, s);
}

// Device path: bits and out on the GPU; count values (bits holds count rounded
// up to even). Checks its launch.
void normal_from_bits_on_device(const uint32_t* bits, float* out, int64_t count, void* stream);

}  // namespace flashlab
