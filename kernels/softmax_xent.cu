// Softmax + cross-entropy, one block per row. The fused forward keeps a running (max, sum) per
// thread (online softmax: one read of the logits), then combines the threads in a fixed tree.
// The shard pieces mirror ops/softmax_xent.h for vocab-parallel cross-entropy; the per-row
// arithmetic (logsumexp, loss, softmax-minus-onehot) is ops/shared_math.h's, as the CPU op's.
#include "common.cuh"
#include "triax/cuda/softmax_xent.h"

namespace triax::cuda {
namespace {
using namespace detail;
namespace math = ops::math;

// How many of the shard's Vs columns are real (not padding).
int real_columns(int Vs, int v0, int valid_vocab) { return std::clamp(valid_vocab - v0, 0, Vs); }

void check_shard(const char* op, int N, int Vs, int v0, int valid_vocab) {
  require_positive(op, "N", N);
  require_positive(op, "Vs", Vs);
  require_positive(op, "valid_vocab", valid_vocab);
  if (v0 < 0) TRIAX_THROW(ConfigError, "{}: negative shard start v0={}", op, v0);
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    softmax_xent_forward_kernel(float* __restrict__ losses, float* __restrict__ lse, const D* __restrict__ logits,
                                const int32_t* __restrict__ targets, int V, int valid_vocab) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * V;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < valid_vocab; j += blockDim.x) {
    const float v = to_f32(x[j]);
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // exp(-inf) = 0 on the first element
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  const float gm = block_max(m);
  // A thread that saw no column has m = -inf and s = 0: contributes 0 (guard the NaN of -inf - -inf).
  const float total = block_sum(m == -INFINITY ? 0.0f : s * expf(m - gm));
  if (threadIdx.x == 0) {
    const float l = math::xent_lse(gm, total);
    const int t = targets[row];
    lse[row] = l;
    losses[row] = math::xent_target_valid(t, valid_vocab) ? math::xent_loss(l, to_f32(x[t])) : NAN;
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_max_kernel(float* __restrict__ row_max, const D* __restrict__ logits, int Vs, int n_real) {
  const D* x = logits + int64_t{blockIdx.x} * Vs;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < n_real; j += blockDim.x) m = fmaxf(m, to_f32(x[j]));
  m = block_max(m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_sumexp_kernel(float* __restrict__ sumexp, const D* __restrict__ logits, const float* __restrict__ row_max,
                        int Vs, int n_real) {
  const D* x = logits + int64_t{blockIdx.x} * Vs;
  const float m = row_max[blockIdx.x];
  float s = 0.0f;
  for (int j = threadIdx.x; j < n_real; j += blockDim.x) s += expf(to_f32(x[j]) - m);
  s = block_sum(s);
  if (threadIdx.x == 0) sumexp[blockIdx.x] = s;
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_target_logit_kernel(float* __restrict__ target_logit, const D* __restrict__ logits,
                              const int32_t* __restrict__ targets, int N, int Vs, int v0, int valid_vocab) {
  for (int64_t i = global_index(); i < N; i += global_stride()) {
    const int t = targets[i];
    const int col = t - v0;
    float v = (col >= 0 && col < Vs) ? to_f32(logits[i * Vs + col]) : 0.0f;
    if (!math::xent_target_valid(t, valid_vocab)) v = NAN;
    target_logit[i] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    loss_from_stats_kernel(float* __restrict__ losses, float* __restrict__ lse, const float* __restrict__ row_max,
                           const float* __restrict__ sumexp, const float* __restrict__ target_logit, int N) {
  for (int64_t i = global_index(); i < N; i += global_stride()) {
    const float l = math::xent_lse(row_max[i], sumexp[i]);
    lse[i] = l;
    losses[i] = math::xent_loss(l, target_logit[i]);
  }
}

// Element-wise per row: each element is read, then written, by the same thread, so dlogits may
// be logits (in place) and __restrict__ stays correct.
template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_backward_kernel(D* __restrict__ dlogits, const D* __restrict__ logits, const float* __restrict__ lse,
                          const int32_t* __restrict__ targets, float dloss, int Vs, int v0, int n_real) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * Vs;
  D* d = dlogits + row * Vs;
  const float l = lse[row];
  const int target_col = targets[row] - v0;
  for (int j = threadIdx.x; j < Vs; j += blockDim.x) {
    const float g = j < n_real ? math::xent_dlogit(expf(to_f32(x[j]) - l), j == target_col, dloss) : 0.0f;
    d[j] = from_f32<D>(g);
  }
}

}  // namespace

template <class Real>
void softmax_xent_forward(float* losses, float* lse, const Real* logits, const int32_t* targets, int N, int V,
                          int valid_vocab, cudaStream_t stream) {
  const char* op = "cuda::softmax_xent_forward";
  const NvtxRange range(op);
  check_shard(op, N, V, 0, valid_vocab);
  if (valid_vocab > V) TRIAX_THROW(ConfigError, "{}: valid_vocab={} exceeds the {} logit columns", op, valid_vocab, V);
  require_pointer(op, "losses", losses);
  require_pointer(op, "lse", lse);
  require_pointer(op, "logits", logits);
  require_pointer(op, "targets", targets);
  softmax_xent_forward_kernel<<<N, kThreads, 0, stream>>>(losses, lse, dptr(logits), targets, V, valid_vocab);
  check_launch();
}

template <class Real>
void xent_shard_backward(Real* dlogits, const Real* logits, const float* lse, const int32_t* targets, float dloss,
                         int N, int Vs, int v0, int valid_vocab, cudaStream_t stream) {
  const char* op = "cuda::xent_shard_backward";
  const NvtxRange range(op);
  check_shard(op, N, Vs, v0, valid_vocab);
  require_pointer(op, "dlogits", dlogits);
  require_pointer(op, "logits", logits);
  require_pointer(op, "lse", lse);
  require_pointer(op, "targets", targets);
  shard_backward_kernel<<<N, kThreads, 0, stream>>>(dptr(dlogits), dptr(logits), lse, targets, dloss, Vs, v0,
                                                    real_columns(Vs, v0, valid_vocab));
  check_launch();
}

template <class Real>
void softmax_xent_backward(Real* dlogits, const Real* logits, const float* lse, const int32_t* targets, float dloss,
                           int N, int V, int valid_vocab, cudaStream_t stream) {
  if (valid_vocab > V)
    TRIAX_THROW(ConfigError, "cuda::softmax_xent_backward: valid_vocab={} exceeds the {} logit columns", valid_vocab,
                V);
  xent_shard_backward(dlogits, logits, lse, targets, dloss, N, V, 0, valid_vocab, stream);
}

template <class Real>
void xent_shard_max(float* row_max, const Real* logits, int N, int Vs, int v0, int valid_vocab, cudaStream_t stream) {
  const char* op = "cuda::xent_shard_max";
  const NvtxRange range(op);
  check_shard(op, N, Vs, v0, valid_vocab);
  require_pointer(op, "row_max", row_max);
  require_pointer(op, "logits", logits);
  shard_max_kernel<<<N, kThreads, 0, stream>>>(row_max, dptr(logits), Vs, real_columns(Vs, v0, valid_vocab));
  check_launch();
}

template <class Real>
void xent_shard_sumexp(float* sumexp, const Real* logits, const float* row_max, int N, int Vs, int v0,
                       int valid_vocab, cudaStream_t stream) {
  const char* op = "cuda::xent_shard_sumexp";
  const NvtxRange range(op);
  check_shard(op, N, Vs, v0, valid_vocab);
  require_pointer(op, "sumexp", sumexp);
  require_pointer(op, "logits", logits);
  require_pointer(op, "row_max", row_max);
  shard_sumexp_kernel<<<N, kThreads, 0, stream>>>(sumexp, dptr(logits), row_max, Vs,
                                                  real_columns(Vs, v0, valid_vocab));
  check_launch();
}

template <class Real>
void xent_shard_target_logit(float* target_logit, const Real* logits, const int32_t* targets, int N, int Vs, int v0,
                             int valid_vocab, cudaStream_t stream) {
  const char* op = "cuda::xent_shard_target_logit";
  const NvtxRange range(op);
  check_shard(op, N, Vs, v0, valid_vocab);
  require_pointer(op, "target_logit", target_logit);
  require_pointer(op, "logits", logits);
  require_pointer(op, "targets", targets);
  shard_target_logit_kernel<<<grid_for(N), kThreads, 0, stream>>>(target_logit, dptr(logits), targets, N, Vs, v0,
                                                                  valid_vocab);
  check_launch();
}

void xent_loss_from_stats(float* losses, float* lse, const float* row_max, const float* sumexp,
                          const float* target_logit, int N, cudaStream_t stream) {
  const char* op = "cuda::xent_loss_from_stats";
  const NvtxRange range(op);
  require_positive(op, "N", N);
  require_pointer(op, "losses", losses);
  require_pointer(op, "lse", lse);
  require_pointer(op, "row_max", row_max);
  require_pointer(op, "sumexp", sumexp);
  require_pointer(op, "target_logit", target_logit);
  loss_from_stats_kernel<<<grid_for(N), kThreads, 0, stream>>>(losses, lse, row_max, sumexp, target_logit, N);
  check_launch();
}

#define TRIAX_INSTANTIATE(Real)                                                                                       \
  template void softmax_xent_forward<Real>(float*, float*, const Real*, const int32_t*, int, int, int, cudaStream_t); \
  template void softmax_xent_backward<Real>(Real*, const Real*, const float*, const int32_t*, float, int, int, int,  \
                                            cudaStream_t);                                                            \
  template void xent_shard_max<Real>(float*, const Real*, int, int, int, int, cudaStream_t);                          \
  template void xent_shard_sumexp<Real>(float*, const Real*, const float*, int, int, int, int, cudaStream_t);        \
  template void xent_shard_target_logit<Real>(float*, const Real*, const int32_t*, int, int, int, int, cudaStream_t); \
  template void xent_shard_backward<Real>(Real*, const Real*, const float*, const int32_t*, float, int, int, int, int, \
                                          cudaStream_t);
TRIAX_INSTANTIATE(float)
TRIAX_INSTANTIATE(bf16)
#undef TRIAX_INSTANTIATE

}  // namespace triax::cuda
