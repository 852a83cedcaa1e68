// RMSNorm: one block per row for the forward pass and the input gradient (fixed-tree block sums,
// 16-byte row loads where the rows allow them, as kernels/layernorm.cu, the input gradient's row
// passes shared with it through norm_rows.cuh); the weight gradient in
// two deterministic passes (per-chunk column partials with rows in order, then the chunks added
// in order onto the fp32 gradient).
#include <cmath>

#include "common.cuh"
#include "norm_rows.cuh"
#include "triax/cuda/rmsnorm.h"

namespace triax::cuda {
namespace {
using namespace detail;

namespace math = ops::math;

template <class D>
struct RowSumSq {  // sum of x^2
  const D* __restrict__ x;
  float q = 0.0f;
  __device__ void add(D e) {
    const float v = to_f32(e);
    q += v * v;
  }
  __device__ void vector(int64_t v) {
    const Pack<D> p = load_pack(x, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) add(p.e[k]);
  }
  __device__ void scalar(int64_t c) { add(x[c]); }
};

template <class D>
struct RowScale {  // o = w * (x * r)
  D* __restrict__ o;
  const D* __restrict__ x;
  const D* __restrict__ w;
  float r;
  __device__ D at(D xe, D we) const { return from_f32<D>(to_f32(we) * (to_f32(xe) * r)); }
  __device__ void vector(int64_t v) {
    const Pack<D> px = load_pack(x, v), pw = load_pack(w, v);
    Pack<D> po;
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) po.e[k] = at(px.e[k], pw.e[k]);
    store_pack(o, v, po);
  }
  __device__ void scalar(int64_t c) { o[c] = at(x[c], w[c]); }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(D* __restrict__ out, float* __restrict__ rstd, const D* __restrict__ inp,
                           const D* __restrict__ weight, int C, float eps, math::VecSplit split) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  RowSumSq<D> sq{x};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, sq);
  const float r = 1.0f / sqrtf(block_sum(sq.q) / C + eps);
  RowScale<D> scale{out + row * C, x, weight, r};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, scale);
  if (threadIdx.x == 0) rstd[row] = r;
}

// dx = r g - x r^3 mean(g x), g = dout * w: one row sum, sum(g x).
struct SumGx {
  float sgx = 0.0f;
  template <class D>
  __device__ void add(D de, D xe, D we) {
    sgx += to_f32(de) * to_f32(we) * to_f32(xe);
  }
};

struct RmsDinp {
  float r, k3;  // k3 = r^3 * mean(g x)
  template <class D>
  __device__ float operator()(D de, D xe, D we) const {
    return r * (to_f32(de) * to_f32(we)) - to_f32(xe) * k3;
  }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_dinp_kernel(D* __restrict__ dinp, const D* __restrict__ dout, const D* __restrict__ inp,
                        const D* __restrict__ weight, const float* __restrict__ rstd, int C, bool accumulate,
                        math::VecSplit split) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  const D* d = dout + row * C;
  const float r = rstd[row];
  DinpRead<D, SumGx> sum{d, x, weight, {}};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, sum);
  const float k3 = r * r * r * (block_sum(sum.acc.sgx) / C);
  DinpWrite<D, RmsDinp> write{dinp + row * C, d, x, weight, {r, k3}, accumulate};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, write);
}

// Block (cx, chunk): columns [cx*blockDim, ...), rows [chunk*rows_per_chunk, ...), each column
// summed over its rows in order by one thread.
template <class D>
__global__ void __launch_bounds__(kChunkColumns)
    rmsnorm_param_partial_kernel(float* __restrict__ pw, const D* __restrict__ dout, const D* __restrict__ inp,
                                 const float* __restrict__ rstd, int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float gw = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const int64_t i = int64_t{r} * C + c;
    gw += to_f32(dout[i]) * (to_f32(inp[i]) * rstd[r]);
  }
  pw[int64_t{blockIdx.y} * C + c] = gw;
}

__global__ void __launch_bounds__(kThreads)
    rmsnorm_param_finish_kernel(float* __restrict__ dweight, const float* __restrict__ pw, int nchunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float gw = 0.0f;
  for (int k = 0; k < nchunks; ++k) gw += pw[int64_t{k} * C + c];
  dweight[c] += gw;
}

}  // namespace

template <class Real>
void rmsnorm_forward(Real* out, float* rstd, const Real* inp, const Real* weight, int N, int C, float eps,
                     cudaStream_t stream) {
  const char* op = "cuda::rmsnorm_forward";
  const NvtxRange range(op);
  if (!(eps > 0.0f) || !std::isfinite(eps)) TRIAX_THROW(ConfigError, "{}: eps must be positive and finite, got {}", op, eps);
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "out", out);
  require_pointer(op, "rstd", rstd);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  const auto split = split_for<Real>(C, C % kVecWidth<Real> == 0 && aligned16(out, inp, weight));
  rmsnorm_forward_kernel<<<N, kThreads, 0, stream>>>(dptr(out), rstd, dptr(inp), dptr(weight), C, eps, split);
  check_launch();
}

template <class Real>
void rmsnorm_backward(Real* dinp, float* dweight, const Real* dout, const Real* inp, const Real* weight,
                      const float* rstd, int N, int C, ops::GradMode dinp_mode, cudaStream_t stream) {
  const char* op = "cuda::rmsnorm_backward";
  const NvtxRange range(op);
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "dinp", dinp);
  require_pointer(op, "dout", dout);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  require_pointer(op, "rstd", rstd);
  const auto split = split_for<Real>(C, C % kVecWidth<Real> == 0 && aligned16(dinp, dout, inp, weight));
  rmsnorm_dinp_kernel<<<N, kThreads, 0, stream>>>(dptr(dinp), dptr(dout), dptr(inp), dptr(weight), rstd, C,
                                                  dinp_mode == ops::GradMode::accumulate, split);
  check_launch();
  if (!dweight) return;
  const RowChunks chunks(N);
  const int nchunks = chunks.count;
  Scratch partial(sizeof(float) * static_cast<size_t>(nchunks) * C, stream);
  const dim3 grid((C + kChunkColumns - 1) / kChunkColumns, nchunks);
  rmsnorm_param_partial_kernel<<<grid, kChunkColumns, 0, stream>>>(partial.as<float>(), dptr(dout), dptr(inp), rstd,
                                                                   N, C, chunks.rows_per_chunk);
  check_launch();
  rmsnorm_param_finish_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dweight, partial.as<float>(),
                                                                                       nchunks, C);
  check_launch();
}

#define TRIAX_RMSNORM_INSTANTIATE(R)                                                                              \
  template void rmsnorm_forward<R>(R*, float*, const R*, const R*, int, int, float, cudaStream_t);                 \
  template void rmsnorm_backward<R>(R*, float*, const R*, const R*, const R*, const float*, int, int, ops::GradMode, \
                                    cudaStream_t);
TRIAX_RMSNORM_INSTANTIATE(float)
TRIAX_RMSNORM_INSTANTIATE(bf16)
TRIAX_RMSNORM_INSTANTIATE(f16)
#undef TRIAX_RMSNORM_INSTANTIATE

}  // namespace triax::cuda
