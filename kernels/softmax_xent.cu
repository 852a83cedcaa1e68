// Softmax + cross-entropy, one block per row, the row loops on 16-byte vectors where the rows
// allow. The fused forward keeps a running (max, sum) per thread (online softmax: one read of the
// logits), then combines the threads in a fixed tree.
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

// The row loops read 16-byte vectors when the row length is a multiple of the vector width and
// the pointers are aligned (ops/shared_math.h's split, walked by the block's threads): RowReader
// gives each of a row's first n values, in fp32, to op.add.
template <class D, class Op>
struct RowReader {
  const D* __restrict__ x;
  Op op;
  __device__ void vector(int64_t v) {
    const Pack<D> p = load_pack(x, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) op.add(to_f32(p.e[k]));
  }
  __device__ void scalar(int64_t j) { op.add(to_f32(x[j])); }
};

struct OnlineSoftmax {  // running max m and sum s of exp(x - m)
  float m = -INFINITY, s = 0.0f;
  __device__ void add(float v) {
    if (v > m) {
      s = s * expf(m - v) + 1.0f;  // exp(-inf) = 0 on the first element
      m = v;
    } else {
      s += expf(v - m);
    }
  }
};
struct RowMax {
  float m = -INFINITY;
  __device__ void add(float v) { m = fmaxf(m, v); }
};
struct RowSumExp {
  float m;
  float s = 0.0f;
  __device__ void add(float v) { s += expf(v - m); }
};

template <class D, class Op>
__device__ __forceinline__ Op read_row(const D* x, int n, const math::VecSplit& split, Op op) {
  RowReader<D, Op> reader{x, op};
  math::for_each_split(split, n, threadIdx.x, blockDim.x, reader);
  return reader.op;
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    softmax_xent_forward_kernel(float* __restrict__ losses, float* __restrict__ lse, const D* __restrict__ logits,
                                const int32_t* __restrict__ targets, int V, int valid_vocab, math::VecSplit split) {
  const int64_t row = blockIdx.x;
  const D* x = logits + row * V;
  const auto [m, s] = read_row(x, valid_vocab, split, OnlineSoftmax{});
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
__global__ void __launch_bounds__(kThreads) shard_max_kernel(float* __restrict__ row_max, const D* __restrict__ logits,
                                                             int Vs, int n_real, math::VecSplit split) {
  const D* x = logits + int64_t{blockIdx.x} * Vs;
  const float m = block_max(read_row(x, n_real, split, RowMax{}).m);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_sumexp_kernel(float* __restrict__ sumexp, const D* __restrict__ logits, const float* __restrict__ row_max,
                        int Vs, int n_real, math::VecSplit split) {
  const D* x = logits + int64_t{blockIdx.x} * Vs;
  const float s = block_sum(read_row(x, n_real, split, RowSumExp{row_max[blockIdx.x]}).s);
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
// be logits (in place) and __restrict__ stays correct. Columns n_real.. (padding) get 0.
template <class D>
struct RowBackward {
  D* __restrict__ d;
  const D* __restrict__ x;
  float l, dloss;
  int target_col, n_real;
  __device__ D at(int64_t j, D xe) const {
    return from_f32<D>(j < n_real ? math::xent_dlogit(expf(to_f32(xe) - l), j == target_col, dloss) : 0.0f);
  }
  __device__ void vector(int64_t v) {
    Pack<D> p = load_pack(x, v);
#pragma unroll
    for (int k = 0; k < kVecWidth<D>; ++k) p.e[k] = at(v * kVecWidth<D> + k, p.e[k]);
    store_pack(d, v, p);
  }
  __device__ void scalar(int64_t j) { d[j] = at(j, x[j]); }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    shard_backward_kernel(D* __restrict__ dlogits, const D* __restrict__ logits, const float* __restrict__ lse,
                          const int32_t* __restrict__ targets, float dloss, int Vs, int v0, int n_real,
                          math::VecSplit split) {
  const int64_t row = blockIdx.x;
  RowBackward<D> body{dlogits + row * Vs, logits + row * Vs, lse[row], dloss, targets[row] - v0, n_real};
  math::for_each_split(split, Vs, threadIdx.x, blockDim.x, body);
}

// The split of a row loop over n of a row's Vs columns.
template <class Real>
math::VecSplit row_split(int n, int Vs, bool pointers_aligned) {
  return split_for<Real>(n, Vs % kVecWidth<Real> == 0 && pointers_aligned);
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
  softmax_xent_forward_kernel<<<N, kThreads, 0, stream>>>(losses, lse, dptr(logits), targets, V, valid_vocab,
                                                          row_split<Real>(valid_vocab, V, aligned16(logits)));
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
                                                    real_columns(Vs, v0, valid_vocab),
                                                    row_split<Real>(Vs, Vs, aligned16(dlogits, logits)));
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
  const int n_real = real_columns(Vs, v0, valid_vocab);
  shard_max_kernel<<<N, kThreads, 0, stream>>>(row_max, dptr(logits), Vs, n_real,
                                               row_split<Real>(n_real, Vs, aligned16(logits)));
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
  const int n_real = real_columns(Vs, v0, valid_vocab);
  shard_sumexp_kernel<<<N, kThreads, 0, stream>>>(sumexp, dptr(logits), row_max, Vs, n_real,
                                                  row_split<Real>(n_real, Vs, aligned16(logits)));
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
TRIAX_INSTANTIATE(f16)
#undef TRIAX_INSTANTIATE

}  // namespace triax::cuda
