// Private row passes of the normalisation kernels' input gradients (kernels/layernorm.cu,
// kernels/rmsnorm.cu): one block per row reads dout, x and the weight twice, first for the row
// sums, then to write dx. Both are bodies of ops::math::for_each_split (vector(v): 16-byte
// vector v of the row; scalar(c): element c) and differ between the norms only in the per-element
// math, which the caller gives as a functor on (dout, x, weight) elements.
#pragma once
#include "common.cuh"

namespace triax::cuda::detail {

// Feeds every (dout, x, weight) element of the row to acc.add(d, x, w): the sums pass.
template <class D, class Acc>
struct DinpRead {
  const D* __restrict__ d;
  const D* __restrict__ x;
  const D* __restrict__ w;
  Acc acc;
  __device__ void vector(int64_t v) {
    const Pack<D> pd = load_pack(d, v), px = load_pack(x, v), pw = load_pack(w, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) acc.add(pd.e[k], px.e[k], pw.e[k]);
  }
  __device__ void scalar(int64_t c) { acc.add(d[c], x[c], w[c]); }
};

// dx = grad(d, x, w) in fp32, added to dx's old value when accumulating, rounded to D once.
template <class D, class Grad>
struct DinpWrite {
  D* __restrict__ dx;
  const D* __restrict__ d;
  const D* __restrict__ x;
  const D* __restrict__ w;
  Grad grad;
  bool accumulate;
  __device__ void vector(int64_t v) {
    const Pack<D> pd = load_pack(d, v), px = load_pack(x, v), pw = load_pack(w, v);
    Pack<D> po;
    if (accumulate) po = load_pack(dx, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) {
      float val = grad(pd.e[k], px.e[k], pw.e[k]);
      if (accumulate) val += to_f32(po.e[k]);
      po.e[k] = from_f32<D>(val);
    }
    store_pack(dx, v, po);
  }
  __device__ void scalar(int64_t c) {
    float val = grad(d[c], x[c], w[c]);
    if (accumulate) val += to_f32(dx[c]);
    dx[c] = from_f32<D>(val);
  }
};

}  // namespace triax::cuda::detail
