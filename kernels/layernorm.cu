// LayerNorm: one block per row for the forward pass and the input gradient; the weight and bias
// gradients in two deterministic passes (per-chunk column partials, then chunks summed in order).
#include <cmath>

#include "common.cuh"
#include "triax/cuda/layernorm.h"

namespace triax::cuda {
namespace {
using namespace detail;

template <class D>
__global__ void layernorm_forward_kernel(D* out, float* mean, float* rstd, const D* inp, const D* weight,
                                         const D* bias, int C, float eps) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  D* o = out + row * C;
  float s = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(x[c]);
  const float m = block_sum(s) / C;
  float q = 0.0f;  // two passes: the variance of the centred values, as the CPU op
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_f32(x[c]) - m;
    q += d * d;
  }
  const float r = 1.0f / sqrtf(block_sum(q) / C + eps);
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    o[c] = from_f32<D>((to_f32(x[c]) - m) * r * to_f32(weight[c]) + to_f32(bias[c]));
  if (threadIdx.x == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight.
template <class D>
__global__ void layernorm_dinp_kernel(D* dinp, const D* dout, const D* inp, const D* weight, const float* mean,
                                      const float* rstd, int C, bool accumulate) {
  const int64_t row = blockIdx.x;
  const D* x = inp + row * C;
  const D* d = dout + row * C;
  D* dx = dinp + row * C;
  const float m = mean[row], r = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_f32(d[c]) * to_f32(weight[c]);
    sg += g;
    sgx += g * (to_f32(x[c]) - m) * r;
  }
  const float mg = block_sum(sg) / C;
  const float mgx = block_sum(sgx) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const float xhat = (to_f32(x[c]) - m) * r;
    float v = r * (to_f32(d[c]) * to_f32(weight[c]) - mg - xhat * mgx);
    if (accumulate) v += to_f32(dx[c]);
    dx[c] = from_f32<D>(v);
  }
}

// Block (cx, chunk): columns [cx*blockDim, ...), rows [chunk*rows_per_chunk, ...), each column
// summed over its rows in order by one thread.
template <class D>
__global__ void layernorm_param_partial_kernel(float* pw, float* pb, const D* dout, const D* inp, const float* mean,
                                               const float* rstd, int N, int C, int rows_per_chunk) {
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
__global__ void layernorm_param_finish_kernel(float* dweight, float* dbias, const float* pw, const float* pb,
                                              int nchunks, int C) {
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
  if (!(eps > 0.0f) || !std::isfinite(eps)) TRIAX_THROW(ConfigError, "{}: eps must be positive and finite, got {}", op, eps);
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "out", out);
  require_pointer(op, "mean", mean);
  require_pointer(op, "rstd", rstd);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  require_pointer(op, "bias", bias);
  layernorm_forward_kernel<<<N, kThreads, 0, stream>>>(dptr(out), mean, rstd, dptr(inp), dptr(weight), dptr(bias), C, eps);
  check_launch();
}

template <class Real>
void layernorm_backward(Real* dinp, float* dweight, float* dbias, const Real* dout, const Real* inp, const Real* weight,
                        const float* mean, const float* rstd, int N, int C, ops::GradMode dinp_mode,
                        cudaStream_t stream) {
  const char* op = "cuda::layernorm_backward";
  require_positive(op, "N", N);
  require_positive(op, "C", C);
  require_pointer(op, "dinp", dinp);
  require_pointer(op, "dout", dout);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  require_pointer(op, "mean", mean);
  require_pointer(op, "rstd", rstd);
  layernorm_dinp_kernel<<<N, kThreads, 0, stream>>>(dptr(dinp), dptr(dout), dptr(inp), dptr(weight), mean, rstd, C,
                                                    dinp_mode == ops::GradMode::accumulate);
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
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int, int, ops::GradMode, cudaStream_t);
template void layernorm_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, int, int, ops::GradMode, cudaStream_t);

}  // namespace triax::cuda
