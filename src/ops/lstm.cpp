// The LSTM cell, element-wise over (row, unit). The sigmoid takes exp of -|x| only (as swiglu.cpp),
// so no finite pre-activation overflows; tanh is the C library's. Rows split over OpenMP threads:
// every element is computed alone, so the split changes no bit.
#include "triax/ops/lstm.h"

#include <cmath>
#include <cstdint>

namespace triax::ops {
namespace {

template <class Real>
inline Real sigmoid(Real x) {
  const Real e = std::exp(-std::fabs(x));
  return (x >= Real(0) ? Real(1) : e) / (Real(1) + e);
}

}  // namespace

template <class Real>
void lstm_cell_forward(Real* h, Real* c, Real* gates, const Real* c_prev, int B, int H) {
#pragma omp parallel for schedule(static) if (int64_t{B} * H > 16384)
  for (int b = 0; b < B; ++b) {
    Real* g = gates + int64_t{b} * 4 * H;
    for (int j = 0; j < H; ++j) {
      const Real i = sigmoid(g[j]), f = sigmoid(g[H + j]), gg = std::tanh(g[2 * H + j]), o = sigmoid(g[3 * H + j]);
      g[j] = i;
      g[H + j] = f;
      g[2 * H + j] = gg;
      g[3 * H + j] = o;
      const int64_t k = int64_t{b} * H + j;
      const Real cn = f * c_prev[k] + i * gg;
      c[k] = cn;
      h[k] = o * std::tanh(cn);
    }
  }
}

template <class Real>
void lstm_cell_backward(Real* dgates, Real* dc, const Real* dh, const Real* gates, const Real* c, const Real* c_prev,
                        int B, int H) {
#pragma omp parallel for schedule(static) if (int64_t{B} * H > 16384)
  for (int b = 0; b < B; ++b) {
    const Real* g = gates + int64_t{b} * 4 * H;
    Real* dg = dgates + int64_t{b} * 4 * H;
    for (int j = 0; j < H; ++j) {
      const int64_t k = int64_t{b} * H + j;
      const Real i = g[j], f = g[H + j], gg = g[2 * H + j], o = g[3 * H + j];
      const Real tc = std::tanh(c[k]);
      const Real dct = dc[k] + dh[k] * o * (Real(1) - tc * tc);  // total gradient of c
      dg[j] = dct * gg * i * (Real(1) - i);
      dg[H + j] = dct * c_prev[k] * f * (Real(1) - f);
      dg[2 * H + j] = dct * i * (Real(1) - gg * gg);
      dg[3 * H + j] = dh[k] * tc * o * (Real(1) - o);
      dc[k] = dct * f;
    }
  }
}

template void lstm_cell_forward<float>(float*, float*, float*, const float*, int, int);
template void lstm_cell_forward<double>(double*, double*, double*, const double*, int, int);
template void lstm_cell_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int,
                                        int);
template void lstm_cell_backward<double>(double*, double*, const double*, const double*, const double*,
                                         const double*, int, int);

}  // namespace triax::ops
