// exp and tanh for the CPU ops' inner loops, written with arithmetic and bit operations only so
// the compiler vectorises the loops that call them (a libm call cannot be). The double overloads
// are the libm functions: double runs the gradient checks, where accuracy beats speed.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>

namespace triax::ops {

// exp(x) for float within 2 ulp for x in [-87.33, 88]; 0 below -87.33 (where float would go
// subnormal), saturates at e^88 above 88 (the ops only take exp of x <= 0).
inline float vexp(float x) {
  constexpr float kLo = -87.33654f, kHi = 88.0f;
  // Both comparisons unconditional (no nested select): a comparison that may trap, evaluated only
  // on one path, is control flow the vectoriser cannot remove.
  const float xl = x < kLo ? kLo : x;
  const float xc = xl > kHi ? kHi : xl;
  // exp(x) = 2^n * exp(r): n = round(x / ln 2), r = x - n ln 2 with ln 2 split in two (Cody-Waite)
  // so r is exact to float precision. Adding and subtracting 1.5 * 2^23 rounds to nearest.
  const float z = xc * 1.44269504088896341f;
  const float nf = (z + 12582912.0f) - 12582912.0f;
  const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
  // Taylor series of exp(r) on |r| <= ln2/2: the r^8 term is below 2^-27.
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n = static_cast<int32_t>(nf);  // in [-126, 127]: a normal power of two
  const float scale = std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23));
  // Flush to 0 below kLo with a bit mask: a select between y and 0 gets turned back into a
  // conditional multiply, which (may trap, under the default -ftrapping-math) blocks vectorising.
  const float y = p * scale;
  const int32_t keep = x < kLo ? 0 : -1;
  return std::bit_cast<float>(std::bit_cast<int32_t>(y) & keep);
}
inline double vexp(double x) { return std::exp(x); }

// tanh(x) for float with absolute error below 3e-7 (relative accuracy is lost near 0, which the
// GELU that uses it does not need: it adds 1).
inline float vtanh(float x) {
  const float a = std::fabs(x);
  const float e = vexp(2.0f * (a > 44.0f ? 44.0f : a));
  const float t = 1.0f - 2.0f / (e + 1.0f);
  return std::copysign(t, x);
}
inline double vtanh(double x) { return std::tanh(x); }

}  // namespace triax::ops
