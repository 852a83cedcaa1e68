// Token + position embedding. Forward: one block per (b, t) row gathers its table row. Backward:
// the (b, t) positions are sorted by token with CUB's stable radix sort, so equal tokens form runs
// in ascending (b, t) order; the block at the head of each run adds the run's dout rows into the
// table row, one thread per channel, in that order. No atomics: deterministic, and in fp32 the
// same additions in the same order as the CPU op (bit-identical).
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "triax/cuda/embedding.h"

namespace triax::cuda {
namespace {
using namespace detail;

void check_embedding(const char* op, int B, int T, int C, int V, int v0, int v1) {
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  require_positive(op, "C", C);
  require_positive(op, "V", V);
  if (v0 < 0 || v1 <= v0 || v1 > V)
    TRIAX_THROW(ConfigError, "{}: vocab shard [{}, {}) is empty or outside the table [0, {})", op, v0, v1, V);
  if (int64_t{B} * T > int64_t{1} << 30)
    TRIAX_THROW(ConfigError, "{}: B*T = {} positions is more than the 2^30 supported", op, int64_t{B} * T);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    embedding_forward_kernel(D* __restrict__ out, const int32_t* __restrict__ tokens, const D* __restrict__ wte,
                             const D* __restrict__ wpe, int T, int C, int v0, int v1) {
  const int64_t row = blockIdx.x;  // b * T + t
  const int t = static_cast<int>(row % T);
  const int tok = tokens[row];
  const bool in_shard = tok >= v0 && tok < v1;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float v = in_shard ? to_f32(wte[int64_t{tok - v0} * C + c]) : 0.0f;
    if (wpe) v += to_f32(wpe[int64_t{t} * C + c]);
    out[row * C + c] = from_f32<D>(v);
  }
}

__global__ void __launch_bounds__(kThreads) iota_kernel(int32_t* __restrict__ p, int n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) p[i] = static_cast<int32_t>(i);
}

// Block i looks at sorted position i; only the head of a run of equal tokens does any work. The
// gradient tables are fp32 whatever the activation type D (parameter gradients keep their own type).
template <class D>
__global__ void __launch_bounds__(kThreads)
    embedding_wte_backward_kernel(float* __restrict__ dwte, const D* __restrict__ dout,
                                  const int32_t* __restrict__ sorted_tokens, const int32_t* __restrict__ sorted_rows,
                                  int n, int C, int v0, int v1) {
  const int i = blockIdx.x;
  const int tok = sorted_tokens[i];
  if ((i > 0 && sorted_tokens[i - 1] == tok) || tok < v0 || tok >= v1) return;
  int end = i + 1;
  while (end < n && sorted_tokens[end] == tok) ++end;
  float* g = dwte + int64_t{tok - v0} * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = g[c];  // start from the old value: the CPU op's order of additions
    for (int k = i; k < end; ++k) acc += to_f32(dout[int64_t{sorted_rows[k]} * C + c]);
    g[c] = acc;
  }
}

// One thread per (t, c): dwpe[t, c] += dout[b, t, c] for b in order.
template <class D>
__global__ void __launch_bounds__(kThreads)
    embedding_wpe_backward_kernel(float* __restrict__ dwpe, const D* __restrict__ dout, int B, int T, int C) {
  const int64_t n = int64_t{T} * C;
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    float acc = dwpe[i];
    for (int b = 0; b < B; ++b) acc += to_f32(dout[int64_t{b} * n + i]);
    dwpe[i] = acc;
  }
}

}  // namespace

template <class Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B, int T, int C, int V,
                       int v0, int v1, cudaStream_t stream) {
  const char* op = "cuda::embedding_forward";
  const NvtxRange range(op);
  check_embedding(op, B, T, C, V, v0, v1);
  require_pointer(op, "out", out);
  require_pointer(op, "tokens", tokens);
  require_pointer(op, "wte", wte);
  embedding_forward_kernel<<<B * T, kThreads, 0, stream>>>(dptr(out), tokens, dptr(wte), dptr(wpe), T, C, v0, v1);
  check_launch();
}

template <class Real>
void embedding_backward(float* dwte, float* dwpe, const Real* dout, const int32_t* tokens, int B, int T, int C, int V,
                        int v0, int v1, cudaStream_t stream) {
  const char* op = "cuda::embedding_backward";
  const NvtxRange range(op);
  check_embedding(op, B, T, C, V, v0, v1);
  require_pointer(op, "dout", dout);
  require_pointer(op, "tokens", tokens);
  const int n = B * T;
  if (dwte) {
    // keys: tokens -> sorted; values: positions 0..n-1 -> positions in token order (stable).
    Scratch bufs(sizeof(int32_t) * 3 * static_cast<size_t>(n), stream);
    int32_t* sorted_tokens = bufs.as<int32_t>();
    int32_t* rows = sorted_tokens + n;
    int32_t* sorted_rows = rows + n;
    iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(rows, n);
    check_launch();
    size_t temp_bytes = 0;
    // All 32 bits: equal keys must be adjacent even for tokens outside [0, V) (they are skipped).
    TRIAX_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, tokens, sorted_tokens, rows, sorted_rows, n,
                                                     0, 32, stream));
    Scratch temp(temp_bytes, stream);
    TRIAX_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, tokens, sorted_tokens, rows,
                                                     sorted_rows, n, 0, 32, stream));
    embedding_wte_backward_kernel<<<n, kThreads, 0, stream>>>(dwte, dptr(dout), sorted_tokens, sorted_rows, n, C,
                                                              v0, v1);
    check_launch();
  }
  if (dwpe) {
    embedding_wpe_backward_kernel<<<grid_for(int64_t{T} * C), kThreads, 0, stream>>>(dwpe, dptr(dout), B, T, C);
    check_launch();
  }
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int, int, int, int,
                                       cudaStream_t);
template void embedding_forward<bf16>(bf16*, const int32_t*, const bf16*, const bf16*, int, int, int, int, int, int,
                                      cudaStream_t);
template void embedding_forward<f16>(f16*, const int32_t*, const f16*, const f16*, int, int, int, int, int, int,
                                     cudaStream_t);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int, int, int, int, int, int,
                                        cudaStream_t);
template void embedding_backward<bf16>(float*, float*, const bf16*, const int32_t*, int, int, int, int, int, int,
                                       cudaStream_t);
template void embedding_backward<f16>(float*, float*, const f16*, const int32_t*, int, int, int, int, int, int,
                                      cudaStream_t);

}  // namespace triax::cuda
