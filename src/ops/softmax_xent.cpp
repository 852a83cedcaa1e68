// Softmax + cross-entropy, row-parallel. Each row: max over the real columns, sum of exp(x - max)
// accumulated in double (a 50k-term float sum would lose digits of the loss), target lookup.
// The full-vocabulary functions are the shard functions with one shard [0, V). The per-row
// arithmetic (logsumexp, loss, softmax-minus-onehot) is ops/shared_math.h's, which
// kernels/softmax_xent.cu calls too.
#include "triax/ops/softmax_xent.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"
#include "triax/ops/shared_math.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {

void check_shard(const char* op, int N, int Vs, int v0, int valid_vocab) {
  detail::require_positive(op, "N", N);
  detail::require_positive(op, "Vs", Vs);
  detail::require_positive(op, "valid_vocab", valid_vocab);
  if (v0 < 0) TRIAX_THROW(ConfigError, "{}: negative shard start v0={}", op, v0);
}

void check_targets(const char* op, const int32_t* targets, int N, int valid_vocab) {
  detail::require_pointer(op, "targets", targets);
  for (int i = 0; i < N; ++i)
    if (!math::xent_target_valid(targets[i], valid_vocab))
      TRIAX_THROW(ConfigError, "{}: target {} of row {} is outside the vocabulary [0, {})", op, targets[i], i,
                  valid_vocab);
}

// How many of the shard's Vs columns are real (not padding).
int real_columns(int Vs, int v0, int valid_vocab) { return std::clamp(valid_vocab - v0, 0, Vs); }

template <class Real>
Real row_max(const Real* x, int n) {
  Real m = -std::numeric_limits<Real>::infinity();
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

template <class Real>
double row_sumexp(const Real* x, int n, Real shift) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int j = 0; j < n; ++j) s += static_cast<double>(vexp(x[j] - shift));
  return s;
}

// Element-wise, so its AVX2 copy (core/cpu_isa.h) gives the same bits.
template <class Real>
[[gnu::always_inline]] inline void row_backward_body(Real* d, const Real* x, int n, int ncols, Real shift,
                                                     int target_col, Real dloss) {
#pragma omp simd
  for (int j = 0; j < n; ++j) d[j] = math::xent_dlogit_softmax(vexp(x[j] - shift), dloss);
  std::fill(d + n, d + ncols, Real(0));
  if (target_col >= 0 && target_col < n) d[target_col] = math::xent_dlogit_target(d[target_col], dloss);
}
TRIAX_TARGET_AVX2 void row_backward_avx2(float* d, const float* x, int n, int ncols, float shift, int target_col,
                                         float dloss) {
  row_backward_body(d, x, n, ncols, shift, target_col, dloss);
}
void row_backward(float* d, const float* x, int n, int ncols, float shift, int target_col, float dloss) {
  if (cpu_isa() == CpuIsa::avx2)
    row_backward_avx2(d, x, n, ncols, shift, target_col, dloss);
  else
    row_backward_body(d, x, n, ncols, shift, target_col, dloss);
}
void row_backward(double* d, const double* x, int n, int ncols, double shift, int target_col, double dloss) {
  row_backward_body(d, x, n, ncols, shift, target_col, dloss);
}

}  // namespace

template <class Real>
void xent_shard_max(Real* out_max, const Real* logits, int N, int Vs, int v0, int valid_vocab) {
  const char* op = "xent_shard_max";
  check_shard(op, N, Vs, v0, valid_vocab);
  detail::require_pointer(op, "row_max", out_max);
  detail::require_pointer(op, "logits", logits);
  const int n = real_columns(Vs, v0, valid_vocab);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= detail::kParallelMinWork)
  for (int i = 0; i < N; ++i) out_max[i] = row_max(logits + int64_t{i} * Vs, n);
}

template <class Real>
void xent_shard_sumexp(Real* sumexp, const Real* logits, const Real* gmax, int N, int Vs, int v0, int valid_vocab) {
  const char* op = "xent_shard_sumexp";
  check_shard(op, N, Vs, v0, valid_vocab);
  detail::require_pointer(op, "sumexp", sumexp);
  detail::require_pointer(op, "logits", logits);
  detail::require_pointer(op, "row_max", gmax);
  const int n = real_columns(Vs, v0, valid_vocab);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= detail::kParallelMinWork)
  for (int i = 0; i < N; ++i) sumexp[i] = static_cast<Real>(row_sumexp(logits + int64_t{i} * Vs, n, gmax[i]));
}

template <class Real>
void xent_shard_target_logit(Real* target_logit, const Real* logits, const int32_t* targets, int N, int Vs, int v0,
                             int valid_vocab) {
  const char* op = "xent_shard_target_logit";
  check_shard(op, N, Vs, v0, valid_vocab);
  detail::require_pointer(op, "target_logit", target_logit);
  detail::require_pointer(op, "logits", logits);
  check_targets(op, targets, N, valid_vocab);
  for (int i = 0; i < N; ++i) {
    const int col = targets[i] - v0;
    target_logit[i] = (col >= 0 && col < Vs) ? logits[int64_t{i} * Vs + col] : Real(0);
  }
}

template <class Real>
void xent_loss_from_stats(Real* losses, Real* lse, const Real* gmax, const Real* sumexp, const Real* target_logit,
                          int N) {
  const char* op = "xent_loss_from_stats";
  detail::require_positive(op, "N", N);
  for (auto [name, p] : {std::pair<const char*, const void*>{"losses", losses}, {"lse", lse}, {"row_max", gmax},
                         {"sumexp", sumexp}, {"target_logit", target_logit}})
    detail::require_pointer(op, name, p);
  for (int i = 0; i < N; ++i) {
    lse[i] = math::xent_lse(gmax[i], sumexp[i]);
    losses[i] = math::xent_loss(lse[i], target_logit[i]);
  }
}

template <class Real>
void xent_shard_backward(Real* dlogits, const Real* logits, const Real* lse, const int32_t* targets, Real dloss, int N,
                         int Vs, int v0, int valid_vocab) {
  const char* op = "xent_shard_backward";
  check_shard(op, N, Vs, v0, valid_vocab);
  detail::require_pointer(op, "dlogits", dlogits);
  detail::require_pointer(op, "logits", logits);
  detail::require_pointer(op, "lse", lse);
  check_targets(op, targets, N, valid_vocab);
  const int n = real_columns(Vs, v0, valid_vocab);
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= detail::kParallelMinWork)
  for (int i = 0; i < N; ++i)
    row_backward(dlogits + int64_t{i} * Vs, logits + int64_t{i} * Vs, n, Vs, lse[i], targets[i] - v0, dloss);
}

template <class Real>
void softmax_xent_forward(Real* losses, Real* lse, const Real* logits, const int32_t* targets, int N, int V,
                          int valid_vocab) {
  const char* op = "softmax_xent_forward";
  check_shard(op, N, V, 0, valid_vocab);
  if (valid_vocab > V) TRIAX_THROW(ConfigError, "{}: valid_vocab={} exceeds the {} logit columns", op, valid_vocab, V);
  detail::require_pointer(op, "losses", losses);
  detail::require_pointer(op, "lse", lse);
  detail::require_pointer(op, "logits", logits);
  check_targets(op, targets, N, valid_vocab);
#pragma omp parallel for schedule(static) if (int64_t{N} * V >= detail::kParallelMinWork)
  for (int i = 0; i < N; ++i) {
    const Real* x = logits + int64_t{i} * V;
    const Real m = row_max(x, valid_vocab);
    lse[i] = math::xent_lse(m, row_sumexp(x, valid_vocab, m));  // the log of the double sum
    losses[i] = math::xent_loss(lse[i], x[targets[i]]);
  }
}

template <class Real>
void softmax_xent_backward(Real* dlogits, const Real* logits, const Real* lse, const int32_t* targets, Real dloss, int N,
                           int V, int valid_vocab) {
  if (valid_vocab > V)
    TRIAX_THROW(ConfigError, "softmax_xent_backward: valid_vocab={} exceeds the {} logit columns", valid_vocab, V);
  xent_shard_backward(dlogits, logits, lse, targets, dloss, N, V, 0, valid_vocab);
}

#define TRIAX_INSTANTIATE(Real)                                                                                      \
  template void softmax_xent_forward<Real>(Real*, Real*, const Real*, const int32_t*, int, int, int);                \
  template void softmax_xent_backward<Real>(Real*, const Real*, const Real*, const int32_t*, Real, int, int, int);   \
  template void xent_shard_max<Real>(Real*, const Real*, int, int, int, int);                                        \
  template void xent_shard_sumexp<Real>(Real*, const Real*, const Real*, int, int, int, int);                        \
  template void xent_shard_target_logit<Real>(Real*, const Real*, const int32_t*, int, int, int, int);               \
  template void xent_loss_from_stats<Real>(Real*, Real*, const Real*, const Real*, const Real*, int);                \
  template void xent_shard_backward<Real>(Real*, const Real*, const Real*, const int32_t*, Real, int, int, int, int);
TRIAX_INSTANTIATE(float)
TRIAX_INSTANTIATE(double)
#undef TRIAX_INSTANTIATE

}  // namespace triax::ops
