// Residual add and its backward: element-wise, fp32 arithmetic, 16-byte vector loads and stores
// with a scalar tail (ops/shared_math.h's split), grid-stride.
#include "common.cuh"
#include "triax/cuda/residual.h"

namespace triax::cuda {
namespace {
using namespace detail;

namespace math = ops::math;

template <class D>
__device__ __forceinline__ D add(D x, D y) {
  return from_f32<D>(to_f32(x) + to_f32(y));
}

// out may be a or b (in place): each element is read, then written, by the one thread that owns
// it, so __restrict__ stays correct.
template <class D>
struct ResidualForward {
  D* __restrict__ out;
  const D* __restrict__ a;
  const D* __restrict__ b;
  __device__ void vector(int64_t v) {
    Pack<D> x = load_pack(a, v);
    const Pack<D> y = load_pack(b, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) x.e[k] = add(x.e[k], y.e[k]);
    store_pack(out, v, x);
  }
  __device__ void scalar(int64_t i) { out[i] = add(a[i], b[i]); }
};

// Both branches in one pass: dout is read once. da, db: either may be null (not both).
template <class D>
struct ResidualBackward {
  D* __restrict__ da;
  D* __restrict__ db;
  const D* __restrict__ dout;
  __device__ void vector(int64_t v) {
    const Pack<D> g = load_pack(dout, v);
    if (da) accumulate(da, v, g);
    if (db) accumulate(db, v, g);
  }
  __device__ static void accumulate(D* __restrict__ d, int64_t v, const Pack<D>& g) {
    Pack<D> x = load_pack(d, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) x.e[k] = add(x.e[k], g.e[k]);
    store_pack(d, v, x);
  }
  __device__ void scalar(int64_t i) {
    const D g = dout[i];
    if (da) da[i] = add(da[i], g);
    if (db) db[i] = add(db[i], g);
  }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    residual_forward_kernel(D* __restrict__ out, const D* __restrict__ a, const D* __restrict__ b, int64_t n,
                            math::VecSplit split) {
  ResidualForward<D> body{out, a, b};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    residual_backward_kernel(D* __restrict__ da, D* __restrict__ db, const D* __restrict__ dout, int64_t n,
                             math::VecSplit split) {
  ResidualBackward<D> body{da, db, dout};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

}  // namespace

template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::residual_forward";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "a", a);
  require_pointer(op, "b", b);
  const auto split = split_for<Real>(n, aligned16(out, a, b));
  residual_forward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(out), dptr(a), dptr(b), n, split);
  check_launch();
}

template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::residual_backward";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "dout", dout);
  if ((da && da == dout) || (db && db == dout))
    TRIAX_THROW(ConfigError, "{}: {} aliases dout (it would be added to itself)", op, da == dout ? "da" : "db");
  if (da && da == db) TRIAX_THROW(ConfigError, "{}: da and db are the same buffer", op);
  if (!da && !db) return;
  const auto split = split_for<Real>(n, aligned16(da, db, dout));
  residual_backward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(da), dptr(db), dptr(dout), n, split);
  check_launch();
}

template void residual_forward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void residual_forward<f16>(f16*, const f16*, const f16*, int64_t, cudaStream_t);
template void residual_backward<float>(float*, float*, const float*, int64_t, cudaStream_t);
template void residual_backward<bf16>(bf16*, bf16*, const bf16*, int64_t, cudaStream_t);
template void residual_backward<f16>(f16*, f16*, const f16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
