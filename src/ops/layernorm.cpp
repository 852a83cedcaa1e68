// LayerNorm: row-parallel forward and input gradient; column-block-parallel weight and bias
// gradients (a second pass, so each sum is ordered by row whatever the thread count).
#include "triax/ops/layernorm.h"

#include <cmath>

#include "ops_common.h"

namespace triax::ops {

template <class Real>
void layernorm_forward(Real* out, Real* mean, Real* rstd, const Real* inp, const Real* weight, const Real* bias, int N,
                       int C) {
  const char* op = "layernorm_forward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "C", C);
  for (auto [name, p] : {std::pair<const char*, const void*>{"out", out}, {"mean", mean}, {"rstd", rstd}, {"inp", inp},
                         {"weight", weight}, {"bias", bias}})
    detail::require_pointer(op, name, p);
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= detail::kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + int64_t{n} * C;
    Real* o = out + int64_t{n} * C;
    // Row sums in double: a float sum of C terms drifts by ~sqrt(C) ulp, visible in the mean of
    // inputs with an offset. Two passes: the variance of the centred values, not E[x^2] - m^2.
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    const Real m = static_cast<Real>(sum / C);
    double sq = 0;
#pragma omp simd reduction(+ : sq)
    for (int c = 0; c < C; ++c) {
      const Real d = x[c] - m;
      sq += d * d;
    }
    const Real s = static_cast<Real>(1.0 / std::sqrt(sq / C + kLayerNormEps));
#pragma omp simd
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

template <class Real>
void layernorm_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight,
                        const Real* mean, const Real* rstd, int N, int C, GradMode dinp_mode) {
  const char* op = "layernorm_backward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "C", C);
  for (auto [name, p] : {std::pair<const char*, const void*>{"dinp", dinp}, {"dout", dout}, {"inp", inp},
                         {"weight", weight}, {"mean", mean}, {"rstd", rstd}})
    detail::require_pointer(op, name, p);
  const bool accumulate = dinp_mode == GradMode::accumulate;
  const int64_t work = int64_t{N} * C;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * weight.
#pragma omp parallel for schedule(static) if (work >= detail::kParallelMinWork)
  for (int n = 0; n < N; ++n) {
    const Real* x = inp + int64_t{n} * C;
    const Real* d = dout + int64_t{n} * C;
    Real* dx = dinp + int64_t{n} * C;
    const Real m = mean[n], s = rstd[n];
    double sum_g = 0, sum_gx = 0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
    for (int c = 0; c < C; ++c) {
      const Real g = d[c] * weight[c];
      sum_g += g;
      sum_gx += g * (x[c] - m) * s;
    }
    const Real mg = static_cast<Real>(sum_g / C), mgx = static_cast<Real>(sum_gx / C);
    detail::write_grad_row(dx, C, accumulate,
                           [&](int c) { return s * (d[c] * weight[c] - mg - (x[c] - m) * s * mgx); });
  }
  if (!dweight && !dbias) return;
  detail::for_each_column_block(C, work >= detail::kParallelMinWork, [&](int64_t c0, int64_t w) {
    Real gw[detail::kColumnBlock] = {}, gb[detail::kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const Real* x = inp + int64_t{n} * C + c0;
      const Real* d = dout + int64_t{n} * C + c0;
      const Real m = mean[n], s = rstd[n];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        gw[c] += d[c] * (x[c] - m) * s;
        gb[c] += d[c];
      }
    }
    for (int64_t c = 0; c < w; ++c) {
      if (dweight) dweight[c0 + c] += gw[c];
      if (dbias) dbias[c0 + c] += gb[c];
    }
  });
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int,
                                        int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int, int, GradMode);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int, int, GradMode);

}  // namespace triax::ops
