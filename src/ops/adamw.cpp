// AdamW: one element-wise pass (parameters, gradient, both moments read once, three written).
#include "triax/ops/adamw.h"

#include <cmath>

#include "ops_common.h"

namespace triax::ops {

template <class Real>
void adamw_step(Real* params, Real* m, Real* v, const Real* grads, int64_t n, const AdamWConfig& cfg, int64_t step,
                Real grad_scale) {
  const char* op = "adamw_step";
  if (n < 0) TRIAX_THROW(ConfigError, "{}: negative element count {}", op, n);
  if (step < 1) TRIAX_THROW(ConfigError, "{}: step counts from 1, got {}", op, step);
  if (!(cfg.lr >= 0)) TRIAX_THROW(ConfigError, "{}: learning rate {} is negative", op, cfg.lr);
  if (!(cfg.weight_decay >= 0)) TRIAX_THROW(ConfigError, "{}: weight_decay {} is negative", op, cfg.weight_decay);
  if (!(cfg.beta1 >= 0 && cfg.beta1 < 1)) TRIAX_THROW(ConfigError, "{}: beta1 {} is outside [0, 1)", op, cfg.beta1);
  if (!(cfg.beta2 >= 0 && cfg.beta2 < 1)) TRIAX_THROW(ConfigError, "{}: beta2 {} is outside [0, 1)", op, cfg.beta2);
  if (!(cfg.eps > 0)) TRIAX_THROW(ConfigError, "{}: eps {} must be positive", op, cfg.eps);
  if (n == 0) return;
  for (auto [name, p] : {std::pair<const char*, const void*>{"params", params}, {"m", m}, {"v", v}, {"grads", grads}})
    detail::require_pointer(op, name, p);
  const Real b1 = static_cast<Real>(cfg.beta1), b2 = static_cast<Real>(cfg.beta2);
  const Real lr = static_cast<Real>(cfg.lr), wd = static_cast<Real>(cfg.weight_decay), eps = static_cast<Real>(cfg.eps);
  // Bias corrections in double: beta^step underflows gracefully and 1 - beta2^step is tiny early.
  const Real bc1 = static_cast<Real>(1.0 - std::pow(cfg.beta1, static_cast<double>(step)));
  const Real bc2 = static_cast<Real>(1.0 - std::pow(cfg.beta2, static_cast<double>(step)));
#pragma omp parallel for simd schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    const Real g = grad_scale * grads[i];
    const Real mi = b1 * m[i] + (Real(1) - b1) * g;
    const Real vi = b2 * v[i] + (Real(1) - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const Real p = params[i];
    params[i] = p - lr * ((mi / bc1) / (std::sqrt(vi / bc2) + eps) + wd * p);
  }
}

template void adamw_step<float>(float*, float*, float*, const float*, int64_t, const AdamWConfig&, int64_t, float);
template void adamw_step<double>(double*, double*, double*, const double*, int64_t, const AdamWConfig&, int64_t, double);

}  // namespace triax::ops
