// Residual add and its backward: element-wise, fp32 arithmetic, grid-stride.
#include "common.cuh"
#include "triax/cuda/residual.h"

namespace triax::cuda {
namespace {
using namespace detail;

template <class D>
__global__ void residual_forward_kernel(D* out, const D* a, const D* b, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = from_f32<D>(to_f32(a[i]) + to_f32(b[i]));
}

// Both branches in one pass: dout is read once.
template <class D>
__global__ void residual_backward_kernel(D* da, D* db, const D* dout, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float g = to_f32(dout[i]);
    if (da) da[i] = from_f32<D>(to_f32(da[i]) + g);
    if (db) db[i] = from_f32<D>(to_f32(db[i]) + g);
  }
}

}  // namespace

template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::residual_forward";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "a", a);
  require_pointer(op, "b", b);
  residual_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(out), dptr(a), dptr(b), n);
  check_launch();
}

template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::residual_backward";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "dout", dout);
  if ((da && da == dout) || (db && db == dout))
    TRIAX_THROW(ConfigError, "{}: {} aliases dout (it would be added to itself)", op, da == dout ? "da" : "db");
  if (da && da == db) TRIAX_THROW(ConfigError, "{}: da and db are the same buffer", op);
  if (!da && !db) return;
  residual_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(da), dptr(db), dptr(dout), n);
  check_launch();
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void residual_backward<float>(float*, float*, const float*, int64_t, cudaStream_t);
template void residual_backward<bf16>(bf16*, bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
