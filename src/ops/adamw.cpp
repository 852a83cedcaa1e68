// Fused AdamW: bias corrections are computed once per call in double, then one vectorised loop
// (AVX2 where the CPU has it, cpu_isa.h) reads each of param, grad, m, v once and writes param,
// m, v once (the step is memory-bound).
#include "triax/ops/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "triax/core/cpu_isa.h"
#include "triax/core/error.h"
#include "triax/ops/shared_math.h"

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
using Consts = ops::math::AdamWCoeffs<Real>;

// Elements [i0, i1): the one AdamW loop, its arithmetic ops/shared_math.h's adamw_element (which
// kernels/adamw.cu calls too). Inlined into a baseline and an AVX2 copy (cpu_isa.h); element-wise,
// so neither the copy nor the split over threads changes a bit.
template <class Real>
[[gnu::always_inline]] inline void update_range(Real* __restrict p, const Real* __restrict g, Real* __restrict mm,
                                                Real* __restrict vv, size_t i0, size_t i1, const Consts<Real>& coeffs) {
  const Consts<Real> k = coeffs;  // a local copy: no store in the loop can change it
#pragma omp simd
  for (size_t i = i0; i < i1; ++i) {
    Real mi = mm[i], vi = vv[i];
    p[i] = ops::math::adamw_element(p[i], g[i], mi, vi, k);
    mm[i] = mi;
    vv[i] = vi;
  }
}

template <class Real>
using RangeFn = void (*)(Real*, const Real*, Real*, Real*, size_t, size_t, const Consts<Real>&);

void range_f32_base(float* p, const float* g, float* m, float* v, size_t i0, size_t i1, const Consts<float>& k) {
  update_range<float>(p, g, m, v, i0, i1, k);
}
TRIAX_TARGET_AVX2 void range_f32_avx2(float* p, const float* g, float* m, float* v, size_t i0, size_t i1,
                                      const Consts<float>& k) {
  update_range<float>(p, g, m, v, i0, i1, k);
}
void range_f64(double* p, const double* g, double* m, double* v, size_t i0, size_t i1, const Consts<double>& k) {
  update_range<double>(p, g, m, v, i0, i1, k);
}
RangeFn<float> pick(float) { return cpu_isa() == CpuIsa::avx2 ? range_f32_avx2 : range_f32_base; }
RangeFn<double> pick(double) { return range_f64; }

template <class Real>
void update(std::span<Real> param, std::span<const Real> grad, std::span<Real> m, std::span<Real> v,
            const AdamWConfig& cfg, float weight_decay, const AdamWStep& step) {
  const size_t n = param.size();
  if (grad.size() != n || m.size() != n || v.size() != n)
    TRIAX_THROW(ConfigError, "adamw_update: param has {} elements but grad {}, m {}, v {}", n, grad.size(), m.size(),
                v.size());
  if (step.t < 1) TRIAX_THROW(ConfigError, "adamw_update: step count t = {} must be >= 1", step.t);
  if (!(step.lr >= 0.0f)) TRIAX_THROW(ConfigError, "adamw_update: learning rate {} must be >= 0", step.lr);
  const Consts<Real> k = ops::math::adamw_coeffs<Real>(cfg.beta1, cfg.beta2, cfg.eps, step.lr, weight_decay,
                                                        step.grad_scale, step.t);
  const RangeFn<Real> fn = pick(Real{});
  Real* p = param.data();
  const Real* g = grad.data();
  Real* mm = m.data();
  Real* vv = v.data();
  // Threads only for large spans: under mpirun each rank runs one thread (OMP_NUM_THREADS=1).
  // Each thread takes one contiguous range (cache-line multiples), and the update is
  // element-wise, so the bits do not depend on the thread count.
  if (n <= (size_t{1} << 18)) {
    fn(p, g, mm, vv, 0, n, k);
    return;
  }
#pragma omp parallel
  {
    const size_t nt = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
    const size_t chunk = ((n + nt - 1) / nt + 15) / 16 * 16;
    const size_t i0 = std::min(n, t * chunk), i1 = std::min(n, i0 + chunk);
    if (i0 < i1) fn(p, g, mm, vv, i0, i1, k);
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
