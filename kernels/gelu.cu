// GELU (tanh form) forward and backward: element-wise, fp32 arithmetic, grid-stride.
#include "common.cuh"
#include "triax/cuda/gelu.h"

namespace triax::cuda {
namespace {
using namespace detail;

constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kCubic = 0.044715f;

template <class D>
__global__ void gelu_forward_kernel(D* out, const D* inp, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float x = to_f32(inp[i]);
    out[i] = from_f32<D>(0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x))));
  }
}

template <class D>
__global__ void gelu_backward_kernel(D* dinp, const D* inp, const D* dout, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float x = to_f32(inp[i]);
    const float t = tanhf(kSqrt2OverPi * (x + kCubic * x * x * x));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    dinp[i] = from_f32<D>((0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du) * to_f32(dout[i]));
  }
}

}  // namespace

template <class Real>
void gelu_forward(Real* out, const Real* inp, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::gelu_forward";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "inp", inp);
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(out), dptr(inp), n);
  check_launch();
}

template <class Real>
void gelu_backward(Real* dinp, const Real* inp, const Real* dout, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::gelu_backward";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "dinp", dinp);
  require_pointer(op, "inp", inp);
  require_pointer(op, "dout", dout);
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(dinp), dptr(inp), dptr(dout), n);
  check_launch();
}

template void gelu_forward<float>(float*, const float*, int64_t, cudaStream_t);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, cudaStream_t);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
