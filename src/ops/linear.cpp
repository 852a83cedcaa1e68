// Linear layer = GEMMs + a bias pre-fill (forward) and a column sum (backward).
#include "triax/ops/linear.h"

#include <algorithm>
#include <cstring>

#include "ops_common.h"
#include "triax/ops/gemm.h"

namespace triax::ops {

template <class Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int N, int IC, int OC) {
  const char* op = "linear_forward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "IC", IC);
  detail::require_positive(op, "OC", OC);
  detail::require_pointer(op, "out", out);
  detail::require_pointer(op, "inp", inp);
  detail::require_pointer(op, "weight", weight);
  if (bias) {
    // Start from the bias and let the GEMM add onto it (beta = 1): one pass over out, not two.
#pragma omp parallel for schedule(static) if (int64_t{N} * OC >= detail::kParallelMinWork)
    for (int n = 0; n < N; ++n) std::memcpy(out + int64_t{n} * OC, bias, sizeof(Real) * OC);
  }
  gemm<Real>(Trans::no, Trans::yes, N, OC, IC, Real(1), inp, IC, weight, IC, bias ? Real(1) : Real(0), out, OC);
}

template <class Real>
void linear_backward(Real* dinp, Real* dweight, Real* dbias, const Real* dout, const Real* inp, const Real* weight, int N,
                     int IC, int OC, GradMode dinp_mode) {
  const char* op = "linear_backward";
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "IC", IC);
  detail::require_positive(op, "OC", OC);
  detail::require_pointer(op, "dout", dout);
  if (dinp) {
    detail::require_pointer(op, "weight", weight);
    gemm<Real>(Trans::no, Trans::no, N, IC, OC, Real(1), dout, OC, weight, IC,
               dinp_mode == GradMode::accumulate ? Real(1) : Real(0), dinp, IC);
  }
  if (dweight) {
    detail::require_pointer(op, "inp", inp);
    gemm<Real>(Trans::yes, Trans::no, OC, IC, N, Real(1), dout, OC, inp, IC, Real(1), dweight, IC);
  }
  if (dbias) detail::add_column_sums(dbias, dout, N, OC, OC);
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int, int);
template void linear_forward<double>(double*, const double*, const double*, const double*, int, int, int);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int,
                                     GradMode);
template void linear_backward<double>(double*, double*, double*, const double*, const double*, const double*, int, int,
                                      int, GradMode);

}  // namespace triax::ops
