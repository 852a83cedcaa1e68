// SwiGLU: element-wise per row, vectorised through vexp, AVX2 where the CPU has it (cpu_isa.h),
// as gelu.cpp. The sigmoid takes exp of -|g| only, so nothing overflows for any finite gate:
// sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) below, with e = exp(-|g|) in (0, 1].
#include "triax/ops/swiglu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {

template <class Real>
[[gnu::always_inline]] inline Real sigmoid(Real g) {
  const Real e = vexp(-std::fabs(g));
  const Real num = g >= Real(0) ? Real(1) : e;  // a select of values, no arithmetic on one path only
  return num / (Real(1) + e);
}

// Rows [n0, n1), inlined into a baseline and an AVX2 copy: element-wise, so neither the copy nor
// the split over threads changes a bit.
template <class Real>
[[gnu::always_inline]] inline void forward_rows(Real* __restrict out, const Real* __restrict h, int64_t n0, int64_t n1,
                                                int64_t F) {
  for (int64_t n = n0; n < n1; ++n) {
    const Real* __restrict gate = h + n * 2 * F;
    const Real* __restrict up = gate + F;
    Real* __restrict o = out + n * F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const Real g = gate[i];
      o[i] = g * sigmoid(g) * up[i];
    }
  }
}

template <class Real>
[[gnu::always_inline]] inline void backward_rows(Real* __restrict dh, const Real* __restrict dout,
                                                 const Real* __restrict h, int64_t n0, int64_t n1, int64_t F) {
  for (int64_t n = n0; n < n1; ++n) {
    const Real* __restrict gate = h + n * 2 * F;
    const Real* __restrict up = gate + F;
    const Real* __restrict d = dout + n * F;
    Real* __restrict dgate = dh + n * 2 * F;
    Real* __restrict dup = dgate + F;
#pragma omp simd
    for (int64_t i = 0; i < F; ++i) {
      const Real g = gate[i];
      const Real s = sigmoid(g);
      // silu'(g) = s (1 + g (1 - s))
      dgate[i] = d[i] * up[i] * (s * (Real(1) + g * (Real(1) - s)));
      dup[i] = d[i] * (g * s);
    }
  }
}

using FwdF = void (*)(float*, const float*, int64_t, int64_t, int64_t);
using BwdF = void (*)(float*, const float*, const float*, int64_t, int64_t, int64_t);
void forward_f32(float* o, const float* h, int64_t n0, int64_t n1, int64_t F) { forward_rows(o, h, n0, n1, F); }
TRIAX_TARGET_AVX2 void forward_f32_avx2(float* o, const float* h, int64_t n0, int64_t n1, int64_t F) {
  forward_rows(o, h, n0, n1, F);
}
void forward_f64(double* o, const double* h, int64_t n0, int64_t n1, int64_t F) { forward_rows(o, h, n0, n1, F); }
void backward_f32(float* dh, const float* d, const float* h, int64_t n0, int64_t n1, int64_t F) {
  backward_rows(dh, d, h, n0, n1, F);
}
TRIAX_TARGET_AVX2 void backward_f32_avx2(float* dh, const float* d, const float* h, int64_t n0, int64_t n1, int64_t F) {
  backward_rows(dh, d, h, n0, n1, F);
}
void backward_f64(double* dh, const double* d, const double* h, int64_t n0, int64_t n1, int64_t F) {
  backward_rows(dh, d, h, n0, n1, F);
}
FwdF pick_forward(float) { return cpu_isa() == CpuIsa::avx2 ? forward_f32_avx2 : forward_f32; }
auto pick_forward(double) { return forward_f64; }
BwdF pick_backward(float) { return cpu_isa() == CpuIsa::avx2 ? backward_f32_avx2 : backward_f32; }
auto pick_backward(double) { return backward_f64; }

// Runs fn(n0, n1) over row ranges: one static chunk per thread when the work is large enough.
template <class Fn>
void over_rows(int N, int F, const Fn& fn) {
#pragma omp parallel if (int64_t{N} * F >= detail::kParallelMinWork && N > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (N + nt - 1) / nt;
    const int64_t n0 = std::min<int64_t>(N, t * chunk), n1 = std::min<int64_t>(N, n0 + chunk);
    if (n0 < n1) fn(n0, n1);
  }
}

}  // namespace

template <class Real>
void swiglu_forward(Real* out, const Real* h, int N, int F) {
  const char* op = "swiglu_forward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "F", F);
  detail::require_pointer(op, "out", out);
  detail::require_pointer(op, "h", h);
  const auto fn = pick_forward(Real{});
  over_rows(N, F, [&](int64_t n0, int64_t n1) { fn(out, h, n0, n1, F); });
}

template <class Real>
void swiglu_backward(Real* dh, const Real* dout, const Real* h, int N, int F) {
  const char* op = "swiglu_backward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "F", F);
  detail::require_pointer(op, "dh", dh);
  detail::require_pointer(op, "dout", dout);
  detail::require_pointer(op, "h", h);
  if (dh == h) TRIAX_THROW(ConfigError, "{}: dh may not alias h", op);
  const auto fn = pick_backward(Real{});
  over_rows(N, F, [&](int64_t n0, int64_t n1) { fn(dh, dout, h, n0, n1, F); });
}

template void swiglu_forward<float>(float*, const float*, int, int);
template void swiglu_forward<double>(double*, const double*, int, int);
template void swiglu_backward<float>(float*, const float*, const float*, int, int);
template void swiglu_backward<double>(double*, const double*, const double*, int, int);

}  // namespace triax::ops
