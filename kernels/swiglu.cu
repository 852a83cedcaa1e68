// SwiGLU forward and backward: one thread per output element (or 16-byte vector of them) of the
// (N, F) side, reading gate and up from the two halves of its row of h; fp32 arithmetic,
// grid-stride. With F a multiple of the vector width a vector never crosses a row, so the split
// of ops/shared_math.h over N*F elements has no scalar tail in the vector case.
#include "common.cuh"
#include "triax/cuda/llama_maps.h"
#include "triax/cuda/swiglu.h"

namespace triax::cuda {
namespace {
using namespace detail;
namespace math = ops::math;

namespace lm = llama_map;

__device__ __forceinline__ float sigmoid(float g) { return lm::sigmoid_from_exp(expf(-g)); }

// Element i of the (N, F) side and its gate in h (cuda/llama_maps.h).
struct Rows {
  int64_t F;
  __device__ int64_t gate(int64_t i) const { return lm::swiglu_gate(i, F); }
};

template <class D>
struct SwigluForward {
  D* __restrict__ out;
  const D* __restrict__ h;
  Rows rows;
  __device__ D at(D g, D u) const {
    const float gf = to_f32(g);
    return from_f32<D>(gf * sigmoid(gf) * to_f32(u));
  }
  __device__ void vector(int64_t v) {
    const int64_t gi = lm::swiglu_gate_vector(v, kVecWidth<D>, rows.F);  // a vector index of h
    const Pack<D> pg = load_pack(h, gi), pu = load_pack(h, gi + rows.F / kVecWidth<D>);
    Pack<D> po;
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) po.e[k] = at(pg.e[k], pu.e[k]);
    store_pack(out, v, po);
  }
  __device__ void scalar(int64_t i) {
    const int64_t gi = rows.gate(i);
    out[i] = at(h[gi], h[gi + rows.F]);
  }
};

template <class D>
struct SwigluBackward {
  D* __restrict__ dh;
  const D* __restrict__ dout;
  const D* __restrict__ h;
  Rows rows;
  __device__ void at(D g, D u, D d, D& dg, D& du) const {
    const float gf = to_f32(g), uf = to_f32(u), df = to_f32(d);
    const float s = sigmoid(gf);
    dg = from_f32<D>(df * uf * lm::silu_grad_from_sigmoid(gf, s));
    du = from_f32<D>(df * (gf * s));
  }
  __device__ void vector(int64_t v) {
    const int64_t gi = lm::swiglu_gate_vector(v, kVecWidth<D>, rows.F);
    const int64_t ui = gi + rows.F / kVecWidth<D>;
    const Pack<D> pg = load_pack(h, gi), pu = load_pack(h, ui), pd = load_pack(dout, v);
    Pack<D> dg, du;
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) at(pg.e[k], pu.e[k], pd.e[k], dg.e[k], du.e[k]);
    store_pack(dh, gi, dg);
    store_pack(dh, ui, du);
  }
  __device__ void scalar(int64_t i) {
    const int64_t gi = rows.gate(i);
    at(h[gi], h[gi + rows.F], dout[i], dh[gi], dh[gi + rows.F]);
  }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(D* __restrict__ out, const D* __restrict__ h, int64_t n, int64_t F, math::VecSplit split) {
  SwigluForward<D> body{out, h, Rows{F}};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(D* __restrict__ dh, const D* __restrict__ dout, const D* __restrict__ h, int64_t n,
                           int64_t F, math::VecSplit split) {
  SwigluBackward<D> body{dh, dout, h, Rows{F}};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

void check_sizes(const char* op, int N, int F) {
  require_positive(op, "N", N);
  require_positive(op, "F", F);
}

}  // namespace

template <class Real>
void swiglu_forward(Real* out, const Real* h, int N, int F, cudaStream_t stream) {
  const char* op = "cuda::swiglu_forward";
  const NvtxRange range(op);
  check_sizes(op, N, F);
  require_pointer(op, "out", out);
  require_pointer(op, "h", h);
  const int64_t n = int64_t{N} * F;
  const auto split = split_for<Real>(n, F % kVecWidth<Real> == 0 && aligned16(out, h));
  swiglu_forward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(out), dptr(h), n, int64_t{F}, split);
  check_launch();
}

template <class Real>
void swiglu_backward(Real* dh, const Real* dout, const Real* h, int N, int F, cudaStream_t stream) {
  const char* op = "cuda::swiglu_backward";
  const NvtxRange range(op);
  check_sizes(op, N, F);
  require_pointer(op, "dh", dh);
  require_pointer(op, "dout", dout);
  require_pointer(op, "h", h);
  const int64_t n = int64_t{N} * F;
  const auto split = split_for<Real>(n, F % kVecWidth<Real> == 0 && aligned16(dh, dout, h));
  swiglu_backward_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(dh), dptr(dout), dptr(h), n, int64_t{F},
                                                                      split);
  check_launch();
}

template void swiglu_forward<float>(float*, const float*, int, int, cudaStream_t);
template void swiglu_forward<bf16>(bf16*, const bf16*, int, int, cudaStream_t);
template void swiglu_forward<f16>(f16*, const f16*, int, int, cudaStream_t);
template void swiglu_backward<float>(float*, const float*, const float*, int, int, cudaStream_t);
template void swiglu_backward<bf16>(bf16*, const bf16*, const bf16*, int, int, cudaStream_t);
template void swiglu_backward<f16>(f16*, const f16*, const f16*, int, int, cudaStream_t);

}  // namespace triax::cuda
