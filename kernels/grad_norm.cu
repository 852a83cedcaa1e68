// Sum of squares in double with a fixed two-pass reduction: block partials, then one block adds
// them in index order. No atomics, so the result does not depend on block scheduling.
#include "common.cuh"
#include "triax/cuda/grad_norm.h"

namespace triax::cuda {
namespace {
using namespace detail;

template <class D>
__global__ void __launch_bounds__(kThreads)
    sumsq_partial_kernel(double* __restrict__ partial, const D* __restrict__ x, int64_t n) {
  double s = 0.0;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const double v = to_f32(x[i]);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kThreads)
    sumsq_finish_kernel(double* __restrict__ acc, const double* __restrict__ partial, int nblocks) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nblocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) acc[0] += s;
}

}  // namespace

template <class Real>
void sumsq_accumulate(double* acc, const Real* x, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::sumsq_accumulate";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "acc", acc);
  require_pointer(op, "x", x);
  const int blocks = static_cast<int>(std::min<int64_t>(kSumsqBlocks, (n + kThreads - 1) / kThreads));
  Scratch partial(sizeof(double) * blocks, stream);
  sumsq_partial_kernel<<<blocks, kThreads, 0, stream>>>(partial.as<double>(), dptr(x), n);
  check_launch();
  sumsq_finish_kernel<<<1, kThreads, 0, stream>>>(acc, partial.as<double>(), blocks);
  check_launch();
}

template void sumsq_accumulate<float>(double*, const float*, int64_t, cudaStream_t);
template void sumsq_accumulate<bf16>(double*, const bf16*, int64_t, cudaStream_t);
template void sumsq_accumulate<f16>(double*, const f16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
