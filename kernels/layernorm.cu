// LayerNorm: one block per row for the forward pass and the input gradient; the weight and bias
// gradients in two deterministic passes (per-chunk column partials, then chunks summed in order).
// The row loops read 16-byte vectors (8 bf16 or 4 fp32) when the rows allow it.
#include <cmath>

#include "common.cuh"
#include "norm_rows.cuh"
#include "triax/cuda/layernorm.h"

namespace triax::cuda {
namespace {
using namespace detail;

namespace math = ops::math;

// The row loops below read 16-byte vectors when C is a multiple of the vector width and every
// pointer is aligned (then every row is), else single elements: ops/shared_math.h's split, walked
// by the block's threads (first = threadIdx.x, stride = blockDim.x). Each body applies elem() to
// element c of the row, for every element, whichever way it was loaded.
template <class D, class Elem>
__device__ __forceinline__ void row_vector(const D* __restrict__ x, int64_t v, Elem&& elem) {
  const Pack<D> p = load_pack(x, v);
#pragma unroll
  for (int k = 0; k < kVecWidth<D>; ++k) elem(p.e[k]);
}

template <class D>
struct RowSum {  // sum of x
  const D* __restrict__ x;
  float s = 0.0f;
  __device__ void vector(int64_t v) {
    row_vector(x, v, [this](D e) { s += to_f32(e); });
  }
  __device__ void scalar(int64_t c) { s += to_f32(x[c]); }
};

template <class D>
struct RowSqDev {  // sum of (x - m)^2: the variance of the centred values, as the CPU op
  const D* __restrict__ x;
  float m;
  float q = 0.0f;
  __device__ void add(D e) {
    const float d = to_f32(e) - m;
    q += d * d;
  }
  __device__ void vector(int64_t v) {
    row_vector(x, v, [this](D e) { add(e); });
  }
  __device__ void scalar(int64_t c) { add(x[c]); }
};

template <class D>
struct RowNormalize {  // o = (x - m) r w + b
  D* __restrict__ o;
  const D* __restrict__ x;
  const D* __restrict__ w;
  const D* __restrict__ b;
  float m, r;
  __device__ D at(D xe, D we, D be) const { return from_f32<D>((to_f32(xe) - m) * r * to_f32(we) + to_f32(be)); }
  __device__ void vector(int64_t v) {
    const Pack<D> px = load_pack(x, v), pw = load_pack(w, v), pb = load_pack(b, v);
    Pack<D> po;
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) po.e[k] = at(px.e[k], pw.e[k], pb.e[k]);
    store_pack(o, v, po);
  }
  __device__ void scalar(int64_t c) { o[c] = at(x[c], w[c], b[c]); }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(D* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                             const D* __restrict__ inp, const D* __restrict__ weight, const D* __restrict__ bias, int C,
                             float eps, math::VecSplit split) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  RowSum<D> sum{x};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, sum);
  const float m = block_sum(sum.s) / C;
  RowSqDev<D> dev{x, m};  // two passes: the variance of the centred values, as the CPU op
  math::for_each_split(split, C, threadIdx.x, blockDim.x, dev);
  const float r = 1.0f / sqrtf(block_sum(dev.q) / C + eps);
  RowNormalize<D> norm{out + row * C, x, weight, bias, m, r};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, norm);
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight.
struct SumsGGx {  // sums of g and g * xhat
  float m, r;
  float sg = 0.0f, sgx = 0.0f;
  template <class D>
  __device__ void add(D de, D xe, D we) {
    const float g = to_f32(de) * to_f32(we);
    sg += g;
    sgx += g * (to_f32(xe) - m) * r;
  }
};

struct LnDinp {
  float m, r, mg, mgx;
  template <class D>
  __device__ float operator()(D de, D xe, D we) const {
    const float xhat = (to_f32(xe) - m) * r;
    return r * (to_f32(de) * to_f32(we) - mg - xhat * mgx);
  }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    layernorm_dinp_kernel(D* __restrict__ dinp, const D* __restrict__ dout, const D* __restrict__ inp,
                          const D* __restrict__ weight, const float* __restrict__ mean, const float* __restrict__ rstd,
                          int C, bool accumulate, math::VecSplit split) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  const D* d = dout + row * C;
  const float m = mean[row], r = rstd[row];
  DinpRead<D, SumsGGx> sums{d, x, weight, {m, r}};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, sums);
  const float mg = block_sum(sums.acc.sg) / C;
  const float mgx = block_sum(sums.acc.sgx) / C;
  DinpWrite<D, LnDinp> write{dinp + row * C, d, x, weight, {m, r, mg, mgx}, accumulate};
  math::for_each_split(split, C, threadIdx.x, blockDim.x, write);
}

// Block (cx, chunk): columns [cx*blockDim, ...), rows [chunk*rows_per_chunk, ...), each column
// summed over its rows in order by one thread.
template <class D>
__global__ void __launch_bounds__(kChunkColumns)
    layernorm_param_partial_kernel(float* __restrict__ pw, float* __restrict__ pb, const D* __restrict__ dout,
                                   const D* __restrict__ inp, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, int N, int C, int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float gw = 0.0f, gb = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const float d = to_f32(dout[int64_t{r} * C + c]);
    gw += d * (to_f32(inp[int64_t{r} * C + c]) - mean[r]) * rstd[r];
    gb += d;
  }
  pw[int64_t{blockIdx.y} * C + c] = gw;
  pb[int64_t{blockIdx.y} * C + c] = gb;
}

// fp32 parameter gradients whatever the activation type: no rounding to Real on the way.
__global__ void __launch_bounds__(kThreads)
    layernorm_param_finish_kernel(float* __restrict__ dweight, float* __restrict__ dbias, const float* __restrict__ pw,
                                  const float* __restrict__ pb, int nchunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float gw = 0.0f, gb = 0.0f;
  for (int k = 0; k < nchunks; ++k) {
    gw += pw[int64_t{k} * C + c];
    gb += pb[int64_t{k} * C + c];
  }
  if (dweight) dweight[c] += gw;
  if (dbias) dbias[c] += gb;
}

}  // namespace

template <class Real>
void layernorm_forward(Real* out, float* mean, float* rstd, const Real* inp, const Real* weight, const Real* bias,
                       int N, int C, float eps, cudaStream_t stream) {
  const char* op = "cuda::layernorm_forward";
  const NvtxRange range(op);
  if (!(eps > 0.0f) || !std::isfinite(eps)) TRIAX_THROW(ConfigError, "{}: eps must be positive and finite, got {}", op, eps);
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "out", out);
  require_pointer(op, "mean", mean);
  require_pointer(op, "rstd", rstd);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  require_pointer(op, "bias", bias);
  const auto split = split_for<Real>(C, C % kVecWidth<Real> == 0 && aligned16(out, inp, weight, bias));
  layernorm_forward_kernel<<<N, kThreads, 0, stream>>>(dptr(out), mean, rstd, dptr(inp), dptr(weight), dptr(bias), C,
                                                       eps, split);
  check_launch();
}

template <class Real>
void layernorm_backward(Real* dinp, float* dweight, float* dbias, const Real* dout, const Real* inp, const Real* weight,
                        const float* mean, const float* rstd, int N, int C, ops::GradMode dinp_mode,
                        cudaStream_t stream) {
  const char* op = "cuda::layernorm_backward";
  const NvtxRange range(op);
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "dinp", dinp);
  require_pointer(op, "dout", dout);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  require_pointer(op, "mean", mean);
  require_pointer(op, "rstd", rstd);
  const auto split = split_for<Real>(C, C % kVecWidth<Real> == 0 && aligned16(dinp, dout, inp, weight));
  layernorm_dinp_kernel<<<N, kThreads, 0, stream>>>(dptr(dinp), dptr(dout), dptr(inp), dptr(weight), mean, rstd, C,
                                                    dinp_mode == ops::GradMode::accumulate, split);
  check_launch();
  if (!dweight && !dbias) return;
  const RowChunks chunks(N);
  const int nchunks = chunks.count;
  Scratch partial(sizeof(float) * 2 * static_cast<size_t>(nchunks) * C, stream);
  float* pw = partial.as<float>();
  float* pb = pw + static_cast<size_t>(nchunks) * C;
  const dim3 grid((C + kChunkColumns - 1) / kChunkColumns, nchunks);
  layernorm_param_partial_kernel<<<grid, kChunkColumns, 0, stream>>>(pw, pb, dptr(dout), dptr(inp), mean, rstd, N, C,
                                                                     chunks.rows_per_chunk);
  check_launch();
  layernorm_param_finish_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dweight, dbias, pw, pb,
                                                                                         nchunks, C);
  check_launch();
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int,
                                       float, cudaStream_t);
template void layernorm_forward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int, int,
                                      float, cudaStream_t);
template void layernorm_forward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*, int, int,
                                     float, cudaStream_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int, int, ops::GradMode, cudaStream_t);
template void layernorm_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, int, int, ops::GradMode, cudaStream_t);
template void layernorm_backward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*, const float*,
                                      const float*, int, int, ops::GradMode, cudaStream_t);

}  // namespace triax::cuda
