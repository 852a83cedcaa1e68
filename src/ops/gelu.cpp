// GELU (tanh form): element-wise, vectorised through vtanh, AVX2 where the CPU has it (cpu_isa.h).
// The arithmetic around tanh is ops/shared_math.h's, which kernels/gelu.cu calls too.
#include "triax/ops/gelu.h"

#include <cmath>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"
#include "triax/ops/shared_math.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {

// The element loops over [i0, i1), inlined into a baseline and an AVX2 copy (core/cpu_isa.h):
// element-wise, so neither the copy nor the split over threads changes a bit.
template <class Real>
[[gnu::always_inline]] inline void forward_range(Real* __restrict out, const Real* __restrict inp, int64_t i0,
                                                 int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    const Real x = inp[i];
    out[i] = math::gelu_from_tanh(x, vtanh(math::gelu_tanh_arg(x)));
  }
}

template <class Real>
[[gnu::always_inline]] inline void backward_range(Real* __restrict dinp, const Real* __restrict inp,
                                                  const Real* __restrict dout, int64_t i0, int64_t i1) {
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    const Real x = inp[i];
    dinp[i] = math::gelu_grad_from_tanh(x, vtanh(math::gelu_tanh_arg(x))) * dout[i];
  }
}

void forward_f32(float* out, const float* inp, int64_t i0, int64_t i1) { forward_range(out, inp, i0, i1); }
TRIAX_TARGET_AVX2 void forward_f32_avx2(float* out, const float* inp, int64_t i0, int64_t i1) {
  forward_range(out, inp, i0, i1);
}
void forward_f64(double* out, const double* inp, int64_t i0, int64_t i1) { forward_range(out, inp, i0, i1); }
void backward_f32(float* dinp, const float* inp, const float* dout, int64_t i0, int64_t i1) {
  backward_range(dinp, inp, dout, i0, i1);
}
TRIAX_TARGET_AVX2 void backward_f32_avx2(float* dinp, const float* inp, const float* dout, int64_t i0, int64_t i1) {
  backward_range(dinp, inp, dout, i0, i1);
}
void backward_f64(double* dinp, const double* inp, const double* dout, int64_t i0, int64_t i1) {
  backward_range(dinp, inp, dout, i0, i1);
}
auto pick_forward(float) { return cpu_isa() == CpuIsa::avx2 ? forward_f32_avx2 : forward_f32; }
auto pick_forward(double) { return forward_f64; }
auto pick_backward(float) { return cpu_isa() == CpuIsa::avx2 ? backward_f32_avx2 : backward_f32; }
auto pick_backward(double) { return backward_f64; }

}  // namespace

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "gelu_forward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("gelu_forward", "out", out);
  detail::require_pointer("gelu_forward", "inp", inp);
  const auto fn = pick_forward(Real{});
  detail::parallel_ranges(n, n >= detail::kParallelMinWork, [&](int64_t i0, int64_t i1) { fn(out, inp, i0, i1); });
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "gelu_backward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("gelu_backward", "dinp", dinp);
  detail::require_pointer("gelu_backward", "inp", inp);
  detail::require_pointer("gelu_backward", "dout", dout);
  const auto fn = pick_backward(Real{});
  detail::parallel_ranges(n, n >= detail::kParallelMinWork,
                          [&](int64_t i0, int64_t i1) { fn(dinp, inp, dout, i0, i1); });
}

template void gelu_forward<float>(float*, const float*, int64_t);
template void gelu_forward<double>(double*, const double*, int64_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t);
template void gelu_backward<double>(double*, const double*, const double*, int64_t);

}  // namespace triax::ops
