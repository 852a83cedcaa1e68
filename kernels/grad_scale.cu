// Scale in place and flag inf/NaN, one pass (the unscale step of fp16 mixed precision), 16-byte
// vector loads and stores with a scalar tail.
#include "common.cuh"
#include "triax/cuda/grad_scale.h"

namespace triax::cuda {
namespace {
using namespace detail;

namespace math = ops::math;

// 16-byte vectors, then the scalar tail (ops/shared_math.h's split).
template <class D>
struct ScaleAndCheck {
  D* __restrict__ x;
  float factor;
  bool bad = false;
  __device__ D scale(D e) {
    const float v = to_f32(e);
    const D stored = from_f32<D>(v * factor);
    bad |= !isfinite(v) || !isfinite(to_f32(stored));  // the stored value: fp16 may overflow
    return stored;
  }
  __device__ void vector(int64_t v) {
    Pack<D> p = load_pack(x, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) p.e[k] = scale(p.e[k]);
    store_pack(x, v, p);
  }
  __device__ void scalar(int64_t i) { x[i] = scale(x[i]); }
};

template <class D>
__global__ void __launch_bounds__(kThreads) scale_and_check_kernel(D* __restrict__ x, int64_t n, float factor,
                                                                   int* __restrict__ found_nonfinite,
                                                                   math::VecSplit split) {
  ScaleAndCheck<D> body{x, factor};
  math::for_each_split(split, n, global_index(), global_stride(), body);
  // Every writer stores the same 1, so the race is benign and the result deterministic.
  if (body.bad && found_nonfinite) *found_nonfinite = 1;
}

}  // namespace

template <class Real>
void scale_and_check(Real* x, int64_t n, float factor, int* found_nonfinite, cudaStream_t stream) {
  const char* op = "cuda::scale_and_check";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "x", x);
  const auto split = split_for<Real>(n, aligned16(x));
  scale_and_check_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(x), n, factor, found_nonfinite, split);
  check_launch();
}

template void scale_and_check<float>(float*, int64_t, float, int*, cudaStream_t);
template void scale_and_check<bf16>(bf16*, int64_t, float, int*, cudaStream_t);
template void scale_and_check<f16>(f16*, int64_t, float, int*, cudaStream_t);

}  // namespace triax::cuda
