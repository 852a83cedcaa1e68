// GELU (tanh form) forward and backward: element-wise, fp32 arithmetic (ops/shared_math.h's, as
// the CPU op), 16-byte vector loads and stores with a scalar tail, grid-stride.
#include "common.cuh"
#include "triax/cuda/gelu.h"

namespace triax::cuda {
namespace {
using namespace detail;
namespace math = ops::math;

template <class D>
__device__ __forceinline__ D gelu(D xd) {
  const float x = to_f32(xd);
  return from_f32<D>(math::gelu_from_tanh(x, tanhf(math::gelu_tanh_arg(x))));
}
template <class D>
__device__ __forceinline__ D gelu_grad(D xd, D gd) {
  const float x = to_f32(xd);
  return from_f32<D>(math::gelu_grad_from_tanh(x, tanhf(math::gelu_tanh_arg(x))) * to_f32(gd));
}

// out may be inp (in place): each element is read, then written, by the one thread that owns it,
// so __restrict__ (and the read-only cache path it lets the compiler take) stays correct.
template <class D>
struct GeluForward {
  D* __restrict__ out;
  const D* __restrict__ inp;
  __device__ void vector(int64_t v) {
    Pack<D> x = load_pack(inp, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) x.e[k] = gelu(x.e[k]);
    store_pack(out, v, x);
  }
  __device__ void scalar(int64_t i) { out[i] = gelu(inp[i]); }
};

template <class D>
struct GeluBackward {
  D* __restrict__ dinp;  // may be dout, as out and inp above
  const D* __restrict__ inp;
  const D* __restrict__ dout;
  __device__ void vector(int64_t v) {
    const Pack<D> x = load_pack(inp, v);
    Pack<D> g = load_pack(dout, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) g.e[k] = gelu_grad(x.e[k], g.e[k]);
    store_pack(dinp, v, g);
  }
  __device__ void scalar(int64_t i) { dinp[i] = gelu_grad(inp[i], dout[i]); }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    gelu_forward_kernel(D* __restrict__ out, const D* __restrict__ inp, int64_t n, math::VecSplit split) {
  GeluForward<D> body{out, inp};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    gelu_backward_kernel(D* __restrict__ dinp, const D* __restrict__ inp, const D* __restrict__ dout, int64_t n,
                         math::VecSplit split) {
  GeluBackward<D> body{dinp, inp, dout};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

}  // namespace

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::gelu_forward";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "inp", inp);
  const auto split = split_for<Real>(n, aligned16(out, inp));
  gelu_forward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(out), dptr(inp), n, split);
  check_launch();
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::gelu_backward";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "dinp", dinp);
  require_pointer(op, "inp", inp);
  require_pointer(op, "dout", dout);
  const auto split = split_for<Real>(n, aligned16(dinp, inp, dout));
  gelu_backward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(dinp), dptr(inp), dptr(dout), n, split);
  check_launch();
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_forward<f16>(f16*, const f16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<f16>(f16*, const f16*, const f16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
