// Scale in place and flag inf/NaN, one pass (the unscale step of fp16 mixed precision).
#include "common.cuh"
#include "triax/cuda/grad_scale.h"

namespace triax::cuda {
namespace {
using namespace detail;

template <class D>
__global__ void __launch_bounds__(kThreads)
    scale_and_check_kernel(D* __restrict__ x, int64_t n, float factor, int* __restrict__ found_nonfinite) {
  bool bad = false;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float v = to_f32(x[i]);
    const D stored = from_f32<D>(v * factor);
    bad |= !isfinite(v) || !isfinite(to_f32(stored));  // the stored value: fp16 may overflow
    x[i] = stored;
  }
  // Every writer stores the same 1, so the race is benign and the result deterministic.
  if (bad && found_nonfinite) *found_nonfinite = 1;
}

}  // namespace

template <class Real>
void scale_and_check(Real* x, int64_t n, float factor, int* found_nonfinite, cudaStream_t stream) {
  const char* op = "cuda::scale_and_check";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "x", x);
  scale_and_check_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(x), n, factor, found_nonfinite);
  check_launch();
}

template void scale_and_check<float>(float*, int64_t, float, int*, cudaStream_t);
template void scale_and_check<bf16>(bf16*, int64_t, float, int*, cudaStream_t);
template void scale_and_check<f16>(f16*, int64_t, float, int*, cudaStream_t);

}  // namespace triax::cuda
