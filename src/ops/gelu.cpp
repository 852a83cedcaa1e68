// GELU (tanh form): element-wise, vectorised through vtanh.
#include "triax/ops/gelu.h"

#include <cmath>

#include "ops_common.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kCubic = 0.044715;
}  // namespace

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "gelu_forward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("gelu_forward", "out", out);
  detail::require_pointer("gelu_forward", "inp", inp);
  const Real k0 = static_cast<Real>(kSqrt2OverPi), k1 = static_cast<Real>(kCubic);
#pragma omp parallel for simd schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    out[i] = Real(0.5) * x * (Real(1) + vtanh(k0 * (x + k1 * x * x * x)));
  }
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "gelu_backward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("gelu_backward", "dinp", dinp);
  detail::require_pointer("gelu_backward", "inp", inp);
  detail::require_pointer("gelu_backward", "dout", dout);
  const Real k0 = static_cast<Real>(kSqrt2OverPi), k1 = static_cast<Real>(kCubic);
#pragma omp parallel for simd schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const Real x = inp[i];
    const Real t = vtanh(k0 * (x + k1 * x * x * x));
    const Real du = k0 * (Real(1) + Real(3) * k1 * x * x);
    dinp[i] = (Real(0.5) * (Real(1) + t) + Real(0.5) * x * (Real(1) - t * t) * du) * dout[i];
  }
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace triax::ops
