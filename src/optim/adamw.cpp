// Fused AdamW: bias corrections are computed once per call in double, then one vectorisable loop
// reads each of param, grad, m, v once and writes param, m, v once (the step is memory-bound).
#include "triax/optim/adamw.h"

#include <cmath>

#include "triax/core/error.h"

namespace triax {

void validate(const AdamWConfig& c) {
  auto ok01 = [](float b) { return std::isfinite(b) && b >= 0.0f && b < 1.0f; };
  if (!ok01(c.beta1)) TRIAX_THROW(ConfigError, "AdamW beta1 = {} must lie in [0, 1)", c.beta1);
  if (!ok01(c.beta2)) TRIAX_THROW(ConfigError, "AdamW beta2 = {} must lie in [0, 1)", c.beta2);
  if (!(std::isfinite(c.eps) && c.eps > 0.0f)) TRIAX_THROW(ConfigError, "AdamW eps = {} must be > 0", c.eps);
  if (!(std::isfinite(c.weight_decay) && c.weight_decay >= 0.0f))
    TRIAX_THROW(ConfigError, "AdamW weight_decay = {} must be >= 0", c.weight_decay);
}

namespace {

template <class Real>
void update(std::span<Real> param, std::span<const Real> grad, std::span<Real> m, std::span<Real> v,
            const AdamWConfig& cfg, float weight_decay, const AdamWStep& step) {
  const size_t n = param.size();
  if (grad.size() != n || m.size() != n || v.size() != n)
    TRIAX_THROW(ConfigError, "adamw_update: param has {} elements but grad {}, m {}, v {}", n, grad.size(), m.size(),
                v.size());
  if (step.t < 1) TRIAX_THROW(ConfigError, "adamw_update: step count t = {} must be >= 1", step.t);
  if (!(step.lr >= 0.0f)) TRIAX_THROW(ConfigError, "adamw_update: learning rate {} must be >= 0", step.lr);
  const double td = static_cast<double>(step.t);
  const Real bc1 = static_cast<Real>(1.0 - std::pow(static_cast<double>(cfg.beta1), td));
  const Real bc2 = static_cast<Real>(1.0 - std::pow(static_cast<double>(cfg.beta2), td));
  const Real b1 = cfg.beta1, b2 = cfg.beta2, eps = cfg.eps, lr = step.lr, wd = weight_decay, gs = step.grad_scale;
  const Real ob1 = Real(1) - b1, ob2 = Real(1) - b2;
  Real* __restrict p = param.data();
  const Real* __restrict g = grad.data();
  Real* __restrict mm = m.data();
  Real* __restrict vv = v.data();
  // Threads only for large spans: under mpirun each rank runs one thread (OMP_NUM_THREADS=1), and
  // a static schedule keeps every element's arithmetic independent of the thread count.
#pragma omp parallel for simd schedule(static) if (n > (size_t{1} << 18))
  for (size_t i = 0; i < n; ++i) {
    const Real gi = g[i] * gs;
    const Real mi = b1 * mm[i] + ob1 * gi;
    const Real vi = b2 * vv[i] + ob2 * gi * gi;
    mm[i] = mi;
    vv[i] = vi;
    const Real mhat = mi / bc1;
    const Real vhat = vi / bc2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

}  // namespace

void adamw_update(std::span<float> param, std::span<const float> grad, std::span<float> m, std::span<float> v,
                  const AdamWConfig& cfg, float weight_decay, const AdamWStep& step) {
  update<float>(param, grad, m, v, cfg, weight_decay, step);
}

void adamw_update(std::span<double> param, std::span<const double> grad, std::span<double> m, std::span<double> v,
                  const AdamWConfig& cfg, float weight_decay, const AdamWStep& step) {
  update<double>(param, grad, m, v, cfg, weight_decay, step);
}

}  // namespace triax
