// RMSNorm: row-parallel forward and input gradient; column-block-parallel weight gradient (a
// second pass, so each sum is ordered by row whatever the thread count), as layernorm.cpp.
#include "triax/ops/rmsnorm.h"

#include <cmath>
#include <utility>

#include "ops_common.h"

namespace triax::ops {

template <class Real>
void rmsnorm_forward(Real* out, Real* rstd, const Real* inp, const Real* weight, int N, int C, double eps) {
  const char* op = "rmsnorm_forward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "C", C);
  if (!(eps >= 0) || !std::isfinite(eps)) TRIAX_THROW(ConfigError, "{}: eps must be finite and >= 0, got {}", op, eps);
  for (auto [name, p] : {std::pair<const char*, const void*>{"out", out}, {"rstd", rstd}, {"inp", inp},
                         {"weight", weight}})
    detail::require_pointer(op, name, p);
  const Real e = static_cast<Real>(eps);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= detail::kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + int64_t{n} * C;
    Real* o = out + int64_t{n} * C;
    // In Real, as HF's fp32 statistics: the reference this op must match, not a wider one.
    Real sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; ++c) sq += x[c] * x[c];
    const Real s = Real(1) / std::sqrt(sq / static_cast<Real>(C) + e);
    // (x * rstd) first, then the weight: HF's order (it casts x * rstd back before the weight).
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = weight[c] * (x[c] * s);
    rstd[n] = s;
  }
}

template <class Real>
void rmsnorm_backward(Real* dinp, Real* dweight, const Real* dout, const Real* inp, const Real* weight,
                      const Real* rstd, int N, int C, GradMode dinp_mode) {
  const char* op = "rmsnorm_backward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "C", C);
  for (auto [name, p] : {std::pair<const char*, const void*>{"dinp", dinp}, {"dout", dout}, {"inp", inp},
                         {"weight", weight}, {"rstd", rstd}})
    detail::require_pointer(op, name, p);
  const bool accumulate = dinp_mode == GradMode::accumulate;
  const int64_t work = int64_t{N} * C;
  // y = w x s with s = (mean(x^2) + eps)^(-1/2): dx = s (g - x s^2 mean(g x)), g = dout * w.
#pragma omp parallel for schedule(static) if (work >= detail::kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + int64_t{n} * C;
    const Real* d = dout + int64_t{n} * C;
    Real* dx = dinp + int64_t{n} * C;
    const Real s = rstd[n];
    double sum_gx = 0;  // in double, as layernorm_backward's row sums
#pragma omp simd reduction(+ : sum_gx)
    for (int c = 0; c < C; ++c) sum_gx += d[c] * weight[c] * x[c];
    const Real k = static_cast<Real>(sum_gx / C) * s * s;
    detail::write_grad_row(dx, C, accumulate, [&](int c) { return s * (d[c] * weight[c] - x[c] * k); });
  }
  if (!dweight) return;
  detail::for_each_column_block(C, work >= detail::kParallelMinWork, [&](int64_t c0, int64_t w) {
    Real gw[detail::kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + int64_t{n} * C + c0;
      const Real* d = dout + int64_t{n} * C + c0;
      const Real s = rstd[n];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) gw[c] += d[c] * (x[c] * s);
    }
    for (int64_t c = 0; c < w; ++c) dweight[c0 + c] += gw[c];
  });
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, double);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int, double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int, int,
                                      GradMode);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*, const double*, const double*,
                                       int, int, GradMode);

}  // namespace triax::ops
