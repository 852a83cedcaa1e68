// Fused AdamW with fp32 master weights and an optional bf16/fp16 copy: one memory-bound pass.
// The per-call constants (bias corrections in double) and the per-element update are
// ops/shared_math.h's, the CPU adamw_update's own. 4 elements per access (16 bytes of each fp32
// array, 8 of a 16-bit one) when every pointer is aligned, then a scalar tail.
#include <cmath>

#include "common.cuh"
#include "triax/cuda/adamw.h"

namespace triax::cuda {
namespace {
using namespace detail;

using Coeffs = ops::math::AdamWCoeffs<float>;

constexpr int kAdamWWidth = 4;

template <class G, class P>
struct AdamWBody {
  float* __restrict__ master;
  P* __restrict__ copy;  // may be null
  const G* __restrict__ grad;
  float* __restrict__ m;
  float* __restrict__ v;
  Coeffs k;
  __device__ void vector(int64_t i) {
    constexpr int W = kAdamWWidth;
    Pack<float, W> pp = load_pack<W>(master, i), pm = load_pack<W>(m, i), pv = load_pack<W>(v, i);
    const Pack<G, W> pg = load_pack<W>(grad, i);
    Pack<P, W> pc;
#pragma unroll
    for (int e = 0; e < W; ++e) {
      pp.e[e] = ops::math::adamw_element(pp.e[e], to_f32(pg.e[e]), pm.e[e], pv.e[e], k);
      pc.e[e] = from_f32<P>(pp.e[e]);
    }
    store_pack(m, i, pm);
    store_pack(v, i, pv);
    store_pack(master, i, pp);
    if (copy) store_pack(copy, i, pc);
  }
  __device__ void scalar(int64_t i) {
    float mi = m[i], vi = v[i];
    const float p = ops::math::adamw_element(master[i], to_f32(grad[i]), mi, vi, k);
    m[i] = mi;
    v[i] = vi;
    master[i] = p;
    if (copy) copy[i] = from_f32<P>(p);
  }
};

template <class G, class P>
__global__ void __launch_bounds__(kThreads)
    adamw_kernel(float* __restrict__ master, P* __restrict__ copy, const G* __restrict__ grad, float* __restrict__ m,
                 float* __restrict__ v, int64_t n, Coeffs k, ops::math::VecSplit split) {
  AdamWBody<G, P> body{master, copy, grad, m, v, k};
  ops::math::for_each_split(split, n, global_index(), global_stride(), body);
}

}  // namespace

template <class Grad, class Copy>
void adamw_update(float* master, Copy* copy, const Grad* grad, float* m, float* v, int64_t n, const AdamWConfig& cfg,
                  float weight_decay, const AdamWStep& step, cudaStream_t stream) {
  const char* op = "cuda::adamw_update";
  const NvtxRange range(op);
  validate(cfg);
  if (step.t < 1) TRIAX_THROW(ConfigError, "{}: step count t = {} must be >= 1", op, step.t);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "master", master);
  require_pointer(op, "grad", grad);
  require_pointer(op, "m", m);
  require_pointer(op, "v", v);
  const Coeffs k =
      ops::math::adamw_coeffs<float>(cfg.beta1, cfg.beta2, cfg.eps, step.lr, weight_decay, step.grad_scale, step.t);
  const auto split = ops::math::vec_split(n, kAdamWWidth, aligned16(master, copy, grad, m, v));
  adamw_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(master, dptr(copy), dptr(grad), m, v, n, k, split);
  check_launch();
}

#define TRIAX_INSTANTIATE(G, P)                                                                                      \
  template void adamw_update<G, P>(float*, P*, const G*, float*, float*, int64_t, const AdamWConfig&, float,        \
                                   const AdamWStep&, cudaStream_t);
TRIAX_INSTANTIATE(float, bf16)
TRIAX_INSTANTIATE(float, f16)
TRIAX_INSTANTIATE(bf16, bf16)
TRIAX_INSTANTIATE(bf16, f16)
TRIAX_INSTANTIATE(f16, bf16)
TRIAX_INSTANTIATE(f16, f16)
#undef TRIAX_INSTANTIATE

}  // namespace triax::cuda
