// The LSTM cell: one thread per (row, unit) of the (B, H) state, reading its four gates from the
// row of gates (B, 4H); fp32 arithmetic whatever the storage type, grid-stride. The sigmoid takes
// exp of -|x| only, as the CPU reference (src/ops/lstm.cpp), so no finite input overflows.
#include "common.cuh"
#include "triax/cuda/lstm.h"

namespace triax::cuda {
namespace {
using namespace detail;

__device__ __forceinline__ float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  return (x >= 0.f ? 1.f : e) / (1.f + e);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    lstm_forward_kernel(D* __restrict__ h, D* c, D* __restrict__ gates, const D* c_prev, int64_t n, int64_t H) {
  for (int64_t k = global_index(); k < n; k += global_stride()) {
    const int64_t b = k / H, j = k % H;
    D* g = gates + b * 4 * H;
    const float i = sigmoid(to_f32(g[j])), f = sigmoid(to_f32(g[H + j]));
    const float gg = tanhf(to_f32(g[2 * H + j])), o = sigmoid(to_f32(g[3 * H + j]));
    g[j] = from_f32<D>(i);
    g[H + j] = from_f32<D>(f);
    g[2 * H + j] = from_f32<D>(gg);
    g[3 * H + j] = from_f32<D>(o);
    const float cn = f * to_f32(c_prev[k]) + i * gg;
    c[k] = from_f32<D>(cn);
    h[k] = from_f32<D>(o * tanhf(cn));
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    lstm_backward_kernel(D* __restrict__ dgates, D* __restrict__ dc, const D* __restrict__ dh,
                         const D* __restrict__ gates, const D* __restrict__ c, const D* __restrict__ c_prev, int64_t n,
                         int64_t H) {
  for (int64_t k = global_index(); k < n; k += global_stride()) {
    const int64_t b = k / H, j = k % H;
    const D* g = gates + b * 4 * H;
    D* dg = dgates + b * 4 * H;
    const float i = to_f32(g[j]), f = to_f32(g[H + j]), gg = to_f32(g[2 * H + j]), o = to_f32(g[3 * H + j]);
    const float tc = tanhf(to_f32(c[k])), d = to_f32(dh[k]);
    const float dct = to_f32(dc[k]) + d * o * (1.f - tc * tc);
    dg[j] = from_f32<D>(dct * gg * i * (1.f - i));
    dg[H + j] = from_f32<D>(dct * to_f32(c_prev[k]) * f * (1.f - f));
    dg[2 * H + j] = from_f32<D>(dct * i * (1.f - gg * gg));
    dg[3 * H + j] = from_f32<D>(d * tc * o * (1.f - o));
    dc[k] = from_f32<D>(dct * f);
  }
}

void check_sizes(const char* op, int B, int H) {
  require_positive(op, "B", B);
  require_positive(op, "H", H);
}

}  // namespace

template <class Real>
void lstm_cell_forward(Real* h, Real* c, Real* gates, const Real* c_prev, int B, int H, cudaStream_t stream) {
  const char* op = "cuda::lstm_cell_forward";
  const NvtxRange range(op);
  check_sizes(op, B, H);
  require_pointer(op, "h", h);
  require_pointer(op, "c", c);
  require_pointer(op, "gates", gates);
  require_pointer(op, "c_prev", c_prev);
  const int64_t n = int64_t{B} * H;
  lstm_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(h), dptr(c), dptr(gates), dptr(c_prev), n,
                                                            int64_t{H});
  check_launch();
}

template <class Real>
void lstm_cell_backward(Real* dgates, Real* dc, const Real* dh, const Real* gates, const Real* c, const Real* c_prev,
                        int B, int H, cudaStream_t stream) {
  const char* op = "cuda::lstm_cell_backward";
  const NvtxRange range(op);
  check_sizes(op, B, H);
  require_pointer(op, "dgates", dgates);
  require_pointer(op, "dc", dc);
  require_pointer(op, "dh", dh);
  require_pointer(op, "gates", gates);
  require_pointer(op, "c", c);
  require_pointer(op, "c_prev", c_prev);
  const int64_t n = int64_t{B} * H;
  lstm_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(dgates), dptr(dc), dptr(dh), dptr(gates), dptr(c),
                                                             dptr(c_prev), n, int64_t{H});
  check_launch();
}

template void lstm_cell_forward<float>(float*, float*, float*, const float*, int, int, cudaStream_t);
template void lstm_cell_forward<bf16>(bf16*, bf16*, bf16*, const bf16*, int, int, cudaStream_t);
template void lstm_cell_forward<f16>(f16*, f16*, f16*, const f16*, int, int, cudaStream_t);
template void lstm_cell_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int,
                                        int, cudaStream_t);
template void lstm_cell_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*, int, int,
                                       cudaStream_t);
template void lstm_cell_backward<f16>(f16*, f16*, const f16*, const f16*, const f16*, const f16*, int, int,
                                      cudaStream_t);

}  // namespace triax::cuda
