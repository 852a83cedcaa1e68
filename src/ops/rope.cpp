// RoPE: element-wise per token (each pair of channels rotated once), row-parallel over the B*T
// tokens, with a baseline and an AVX2 copy of the inner loop (cpu_isa.h; no FMA: the same bits).
// Forward and backward share one loop: the backward is the rotation by -angle (sin negated).
#include "triax/ops/rope.h"

#include <algorithm>
#include <cstdint>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"

namespace triax::ops {
namespace {

// Rotates `heads` consecutive heads of one token: pairs (i, i + H2) by the angle whose cos and
// sin are c[i], sg * s[i] (sg = -1: the inverse rotation).
template <class Real>
[[gnu::always_inline]] inline void rotate_token(Real* __restrict x, const Real* __restrict c,
                                                const Real* __restrict s, int heads, int H2, Real sg) {
  for (int hd = 0; hd < heads; ++hd) {
    Real* __restrict lo = x + int64_t{hd} * 2 * H2;
    Real* __restrict hi = lo + H2;
#pragma omp simd
    for (int i = 0; i < H2; ++i) {
      const Real a = lo[i], b = hi[i], si = sg * s[i];
      lo[i] = a * c[i] - b * si;
      hi[i] = b * c[i] + a * si;
    }
  }
}

// Tokens [r0, r1) of B*T; token r is position r % T. Row stride ld, the first `heads` heads rotated.
template <class Real>
[[gnu::always_inline]] inline void rotate_rows(Real* x, const Real* cos, const Real* sin, int64_t r0, int64_t r1,
                                               int T, int64_t ld, int heads, int H2, Real sg) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t t = r % T;
    rotate_token(x + r * ld, cos + t * H2, sin + t * H2, heads, H2, sg);
  }
}

using RowsF = void (*)(float*, const float*, const float*, int64_t, int64_t, int, int64_t, int, int, float);
void rows_f32(float* x, const float* c, const float* s, int64_t r0, int64_t r1, int T, int64_t ld, int heads, int H2,
              float sg) {
  rotate_rows(x, c, s, r0, r1, T, ld, heads, H2, sg);
}
TRIAX_TARGET_AVX2 void rows_f32_avx2(float* x, const float* c, const float* s, int64_t r0, int64_t r1, int T,
                                     int64_t ld, int heads, int H2, float sg) {
  rotate_rows(x, c, s, r0, r1, T, ld, heads, H2, sg);
}
void rows_f64(double* x, const double* c, const double* s, int64_t r0, int64_t r1, int T, int64_t ld, int heads,
              int H2, double sg) {
  rotate_rows(x, c, s, r0, r1, T, ld, heads, H2, sg);
}
RowsF pick(float) { return cpu_isa() == CpuIsa::avx2 ? rows_f32_avx2 : rows_f32; }
auto pick(double) { return rows_f64; }

template <class Real>
void rope_apply(const char* op, const char* xname, Real* x, const Real* cos, const Real* sin, int B, int T, int NH,
                int NKV, int HD, Real sg) {
  detail::require_positive(op, "B", B);
  detail::require_positive(op, "T", T);
  detail::require_positive(op, "NH", NH);
  if (NKV < 0) TRIAX_THROW(ConfigError, "{}: NKV must be >= 0 (0 means NH), got {}", op, NKV);
  detail::require_positive(op, "HD", HD);
  if (HD % 2 != 0) TRIAX_THROW(ConfigError, "{}: HD must be even to rotate channel pairs, got {}", op, HD);
  detail::require_pointer(op, xname, x);
  detail::require_pointer(op, "cos", cos);
  detail::require_pointer(op, "sin", sin);
  const int kv = NKV > 0 ? NKV : NH;
  const int heads = NH + kv;  // the query and key heads, contiguous at the start of each row
  const int64_t ld = int64_t{NH + 2 * kv} * HD;
  const int64_t rows = int64_t{B} * T;
  const auto fn = pick(Real{});
#pragma omp parallel if (rows * heads * HD >= detail::kParallelMinWork && rows > 1)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (rows + nt - 1) / nt;
    const int64_t r0 = std::min(rows, t * chunk), r1 = std::min(rows, r0 + chunk);
    if (r0 < r1) fn(x, cos, sin, r0, r1, T, ld, heads, HD / 2, sg);
  }
}

}  // namespace

template <class Real>
void rope_forward(Real* qkv, const Real* cos, const Real* sin, int B, int T, int NH, int NKV, int HD) {
  rope_apply("rope_forward", "qkv", qkv, cos, sin, B, T, NH, NKV, HD, Real(1));
}

template <class Real>
void rope_backward(Real* dqkv, const Real* cos, const Real* sin, int B, int T, int NH, int NKV, int HD) {
  rope_apply("rope_backward", "dqkv", dqkv, cos, sin, B, T, NH, NKV, HD, Real(-1));
}

template void rope_forward<float>(float*, const float*, const float*, int, int, int, int, int);
template void rope_forward<double>(double*, const double*, const double*, int, int, int, int, int);
template void rope_backward<float>(float*, const float*, const float*, int, int, int, int, int);
template void rope_backward<double>(double*, const double*, const double*, int, int, int, int, int);

}  // namespace triax::ops
