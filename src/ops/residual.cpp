// Residual add and its backward: element-wise.
#include "triax/ops/residual.h"

#include "ops_common.h"

namespace triax::ops {

template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "residual_forward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("residual_forward", "out", out);
  detail::require_pointer("residual_forward", "a", a);
  detail::require_pointer("residual_forward", "b", b);
#pragma omp parallel for simd schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t n) {
  if (n < 0) TRIAX_THROW(ConfigError, "residual_backward: negative element count {}", n);
  if (n == 0) return;
  detail::require_pointer("residual_backward", "dout", dout);
  if ((da && da == dout) || (db && db == dout))
    TRIAX_THROW(ConfigError, "residual_backward: {} aliases dout (it would be added to itself)", da == dout ? "da" : "db");
  for (Real* g : {da, db}) {
    if (!g) continue;
#pragma omp parallel for simd schedule(static) if (n >= detail::kParallelMinWork)
    for (int64_t i = 0; i < n; ++i) g[i] += dout[i];
  }
}

template void residual_forward<float>(float*, const float*, const float*, int64_t);
template void residual_forward<double>(double*, const double*, const double*, int64_t);
template void residual_backward<float>(float*, float*, const float*, int64_t);
template void residual_backward<double>(double*, double*, const double*, int64_t);

}  // namespace triax::ops
