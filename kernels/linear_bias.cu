// The linear layer's bias gradient: per-column sums of dout (N, OC) added onto an fp32 gradient,
// in two deterministic passes (per-chunk column partials with rows in order, then the chunks
// added in order), the same scheme as the LayerNorm weight/bias gradients.
#include "common.cuh"
#include "triax/cuda/linear.h"

namespace triax::cuda {
namespace {
using namespace detail;

// Block (cx, chunk): columns [cx*blockDim, ...), rows [chunk*rows_per_chunk, ...); each column
// summed over its rows in order by one thread (consecutive threads read consecutive columns).
template <class D>
__global__ void __launch_bounds__(kChunkColumns)
    linear_bias_partial_kernel(float* __restrict__ partial, const D* __restrict__ dout, int N, int OC,
                               int rows_per_chunk) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  const int r0 = blockIdx.y * rows_per_chunk;
  const int r1 = min(N, r0 + rows_per_chunk);
  float s = 0.0f;
  for (int r = r0; r < r1; ++r) s += to_f32(dout[int64_t{r} * OC + c]);
  partial[int64_t{blockIdx.y} * OC + c] = s;
}

__global__ void __launch_bounds__(kThreads)
    linear_bias_finish_kernel(float* __restrict__ dbias, const float* __restrict__ partial, int nchunks, int OC) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= OC) return;
  float s = 0.0f;
  for (int k = 0; k < nchunks; ++k) s += partial[int64_t{k} * OC + c];
  dbias[c] += s;
}

}  // namespace

template <class Real>
void linear_bias_backward(float* dbias, const Real* dout, int N, int OC, cudaStream_t stream) {
  const char* op = "cuda::linear_bias_backward";
  const NvtxRange range(op);
  require_positive(op, "N", N);
  require_positive(op, "OC", OC);
  require_pointer(op, "dbias", dbias);
  require_pointer(op, "dout", dout);
  const RowChunks chunks(N);
  Scratch partial(sizeof(float) * static_cast<size_t>(chunks.count) * OC, stream);
  const dim3 grid((OC + kChunkColumns - 1) / kChunkColumns, chunks.count);
  linear_bias_partial_kernel<<<grid, kChunkColumns, 0, stream>>>(partial.as<float>(), dptr(dout), N, OC,
                                                                 chunks.rows_per_chunk);
  check_launch();
  linear_bias_finish_kernel<<<(OC + kThreads - 1) / kThreads, kThreads, 0, stream>>>(dbias, partial.as<float>(),
                                                                                     chunks.count, OC);
  check_launch();
}

template void linear_bias_backward<float>(float*, const float*, int, int, cudaStream_t);
template void linear_bias_backward<bf16>(float*, const bf16*, int, int, cudaStream_t);
template void linear_bias_backward<f16>(float*, const f16*, int, int, cudaStream_t);

}  // namespace triax::cuda
