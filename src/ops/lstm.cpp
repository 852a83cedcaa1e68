// The LSTM cell, element-wise over (row, unit), vectorised through vexp/vtanh (ops/vec_math.h;
// libm in double, which the gradient check runs), AVX2 where the CPU has it (cpu_isa.h), as
// swiglu.cpp. The sigmoid takes exp of -|x| only, so no finite pre-activation overflows. Rows
// split over OpenMP threads (parallel_ranges over rows): every element is computed alone, so
// neither the split nor the AVX2 copy changes a bit.
#include "triax/ops/lstm.h"

#include <cmath>
#include <cstdint>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {

template <class Real>
[[gnu::always_inline]] inline Real sigmoid(Real x) {
  const Real e = vexp(-std::fabs(x));
  const Real num = x >= Real(0) ? Real(1) : e;
  return num / (Real(1) + e);
}

template <class Real>
[[gnu::always_inline]] inline void forward_rows(Real* __restrict h, Real* c, Real* __restrict gates, const Real* c_prev,
                                                int64_t b0, int64_t b1, int64_t H) {
  for (int64_t b = b0; b < b1; ++b) {
    Real* __restrict gi = gates + b * 4 * H;
    Real* __restrict gf = gi + H;
    Real* __restrict gg = gf + H;
    Real* __restrict go = gg + H;
    Real* __restrict hr = h + b * H;
    Real* cr = c + b * H;
    const Real* cp = c_prev + b * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const Real i = sigmoid(gi[j]), f = sigmoid(gf[j]), g = vtanh(gg[j]), o = sigmoid(go[j]);
      gi[j] = i;
      gf[j] = f;
      gg[j] = g;
      go[j] = o;
      const Real cn = f * cp[j] + i * g;  // read c_prev before c is written: they may alias
      cr[j] = cn;
      hr[j] = o * vtanh(cn);
    }
  }
}

template <class Real>
[[gnu::always_inline]] inline void backward_rows(Real* __restrict dgates, Real* __restrict dc, const Real* __restrict dh,
                                                 const Real* __restrict gates, const Real* __restrict c,
                                                 const Real* __restrict c_prev, int64_t b0, int64_t b1, int64_t H) {
  for (int64_t b = b0; b < b1; ++b) {
    const Real* __restrict gi = gates + b * 4 * H;
    const Real* __restrict gf = gi + H;
    const Real* __restrict gg = gf + H;
    const Real* __restrict go = gg + H;
    Real* __restrict di = dgates + b * 4 * H;
    Real* __restrict df = di + H;
    Real* __restrict dg = df + H;
    Real* __restrict dout = dg + H;
    Real* __restrict dcr = dc + b * H;
    const Real* __restrict dhr = dh + b * H;
    const Real* __restrict cr = c + b * H;
    const Real* __restrict cp = c_prev + b * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const Real i = gi[j], f = gf[j], g = gg[j], o = go[j];
      const Real tc = vtanh(cr[j]);
      const Real dct = dcr[j] + dhr[j] * o * (Real(1) - tc * tc);  // the total gradient of c
      di[j] = dct * g * i * (Real(1) - i);
      df[j] = dct * cp[j] * f * (Real(1) - f);
      dg[j] = dct * i * (Real(1) - g * g);
      dout[j] = dhr[j] * tc * o * (Real(1) - o);
      dcr[j] = dct * f;
    }
  }
}

using FwdF = void (*)(float*, float*, float*, const float*, int64_t, int64_t, int64_t);
using BwdF = void (*)(float*, float*, const float*, const float*, const float*, const float*, int64_t, int64_t,
                      int64_t);
void forward_f32(float* h, float* c, float* g, const float* cp, int64_t b0, int64_t b1, int64_t H) {
  forward_rows(h, c, g, cp, b0, b1, H);
}
TRIAX_TARGET_AVX2 void forward_f32_avx2(float* h, float* c, float* g, const float* cp, int64_t b0, int64_t b1,
                                        int64_t H) {
  forward_rows(h, c, g, cp, b0, b1, H);
}
void forward_f64(double* h, double* c, double* g, const double* cp, int64_t b0, int64_t b1, int64_t H) {
  forward_rows(h, c, g, cp, b0, b1, H);
}
void backward_f32(float* dg, float* dc, const float* dh, const float* g, const float* c, const float* cp, int64_t b0,
                  int64_t b1, int64_t H) {
  backward_rows(dg, dc, dh, g, c, cp, b0, b1, H);
}
TRIAX_TARGET_AVX2 void backward_f32_avx2(float* dg, float* dc, const float* dh, const float* g, const float* c,
                                         const float* cp, int64_t b0, int64_t b1, int64_t H) {
  backward_rows(dg, dc, dh, g, c, cp, b0, b1, H);
}
void backward_f64(double* dg, double* dc, const double* dh, const double* g, const double* c, const double* cp,
                  int64_t b0, int64_t b1, int64_t H) {
  backward_rows(dg, dc, dh, g, c, cp, b0, b1, H);
}
FwdF pick_forward(float) { return cpu_isa() == CpuIsa::avx2 ? forward_f32_avx2 : forward_f32; }
auto pick_forward(double) { return forward_f64; }
BwdF pick_backward(float) { return cpu_isa() == CpuIsa::avx2 ? backward_f32_avx2 : backward_f32; }
auto pick_backward(double) { return backward_f64; }

void check(const char* op, int B, int H) {
  detail::require_positive(op, "B", B);
  detail::require_positive(op, "H", H);
}

// Rows in parallel only when there is enough work (parallel_ranges splits rows here).
bool parallel(int B, int H) { return int64_t{B} * H * 4 >= detail::kParallelMinWork && B > 1; }

}  // namespace

template <class Real>
void lstm_cell_forward(Real* h, Real* c, Real* gates, const Real* c_prev, int B, int H) {
  check("lstm_cell_forward", B, H);
  const auto fn = pick_forward(Real{});
  detail::parallel_ranges(B, parallel(B, H), [&](int64_t b0, int64_t b1) { fn(h, c, gates, c_prev, b0, b1, H); });
}

template <class Real>
void lstm_cell_backward(Real* dgates, Real* dc, const Real* dh, const Real* gates, const Real* c, const Real* c_prev,
                        int B, int H) {
  check("lstm_cell_backward", B, H);
  const auto fn = pick_backward(Real{});
  detail::parallel_ranges(B, parallel(B, H),
                          [&](int64_t b0, int64_t b1) { fn(dgates, dc, dh, gates, c, c_prev, b0, b1, H); });
}

template void lstm_cell_forward<float>(float*, float*, float*, const float*, int, int);
template void lstm_cell_forward<double>(double*, double*, double*, const double*, int, int);
template void lstm_cell_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int,
                                        int);
template void lstm_cell_backward<double>(double*, double*, const double*, const double*, const double*,
                                         const double*, int, int);

}  // namespace triax::ops
