// Causal attention by query blocks. Forward, per (batch, head, query block): S = scale Q K^T
// against the keys the block may see (GEMM), a stable softmax per row (max subtracted, masked
// entries exactly 0, normalised after the next GEMM), O = P V (GEMM), and lse kept. Backward, per
// (batch, key/value head), the query heads of its group in order and for each its query blocks in
// order: P recomputed from lse, dP = dO V^T, dS = P (dP - rowsum(P dP)), dQ = scale dS K,
// dK += scale dS^T Q, dV += P^T dO. Tasks are independent and each sums in a fixed order, so the
// bits do not depend on the thread count or the schedule. Grouped-query attention only changes
// which key/value columns a query head reads; with NKV = NH every operation is the one of plain
// multi-head attention, in the same order (the same bits).
#include "triax/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <omp.h>

#include "ops_common.h"
#include "triax/core/cpu_isa.h"
#include "triax/ops/gemm.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {
namespace {

// Returns the key/value head count (NKV, or NH for 0).
int check_attention(const char* op, int B, int T, int C, int NH, int NKV) {
  detail::require_positive(op, "B", B);
  detail::require_positive(op, "T", T);
  detail::require_positive(op, "C", C);
  detail::require_positive(op, "NH", NH);
  if (C % NH != 0) TRIAX_THROW(ConfigError, "{}: {} heads do not divide C={}", op, NH, C);
  if (NKV < 0) TRIAX_THROW(ConfigError, "{}: NKV must be >= 0 (0 means NH), got {}", op, NKV);
  const int kv = NKV > 0 ? NKV : NH;
  if (NH % kv != 0)
    TRIAX_THROW(ConfigError, "{}: NKV={} key/value heads do not divide NH={} query heads", op, kv, NH);
  return kv;
}

// Row r of a block holds the scores of query i = i0 + r against keys [0, nk): keys j <= i are
// valid. Turns valid scores into probabilities exp(s - shift) and zeroes the rest.
// Element-wise, so its AVX2 copy (core/cpu_isa.h) gives the same bits.
template <class Real>
[[gnu::always_inline]] inline void exp_row_body(Real* s, int valid, int nk, Real shift) {
#pragma omp simd
  for (int j = 0; j < valid; ++j) s[j] = vexp(s[j] - shift);
  std::fill(s + valid, s + nk, Real(0));
}
TRIAX_TARGET_AVX2 void exp_row_avx2(float* s, int valid, int nk, float shift) { exp_row_body(s, valid, nk, shift); }
void exp_row(float* s, int valid, int nk, float shift) {
  if (cpu_isa() == CpuIsa::avx2)
    exp_row_avx2(s, valid, nk, shift);
  else
    exp_row_body(s, valid, nk, shift);
}
void exp_row(double* s, int valid, int nk, double shift) { exp_row_body(s, valid, nk, shift); }

}  // namespace

template <class Real>
void attention_forward(Real* out, Real* lse, const Real* qkv, int B, int T, int C, int NH, int NKV) {
  const char* op = "attention_forward";
  const int kv = check_attention(op, B, T, C, NH, NKV);
  detail::require_pointer(op, "out", out);
  detail::require_pointer(op, "lse", lse);
  detail::require_pointer(op, "qkv", qkv);
  const int hs = C / NH, group = NH / kv;
  const int64_t C3 = C + int64_t{2} * kv * hs;  // the qkv row width (3C without grouping)
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(hs));
  const int nqb = (T + kAttentionBlock - 1) / kAttentionBlock;
  const int64_t tasks = int64_t{B} * NH * nqb;
  const bool parallel = gemm_nests_in_openmp() && tasks > 1;
  // Scratch per thread, allocated here: nothing may throw inside the parallel region.
  const size_t block = static_cast<size_t>(kAttentionBlock) * T;
  const size_t per_thread = block + kAttentionBlock;
  std::vector<Real> scratch(per_thread * (parallel ? omp_get_max_threads() : 1));
#pragma omp parallel if (parallel)
  {
    Real* S = scratch.data() + per_thread * omp_get_thread_num();  // (bq, nk) scores, then exp(s - max)
    Real* inv_sum = S + block;                                      // (bq) 1 / row sum
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      // Last query blocks (the most keys) first, for a better dynamic balance.
      const int qb = nqb - 1 - static_cast<int>(task % nqb);
      const int h = static_cast<int>((task / nqb) % NH);
      const int b = static_cast<int>(task / (int64_t{nqb} * NH));
      const int i0 = qb * kAttentionBlock, i1 = std::min(T, i0 + kAttentionBlock);
      const int bq = i1 - i0, nk = i1;
      const Real* base = qkv + int64_t{b} * T * C3;
      const int g = h / group;                          // its key/value head
      const Real* q = base + i0 * C3 + h * hs;          // (bq, hs) row stride C3
      const Real* k = base + C + g * hs;                // (nk, hs) row stride C3
      const Real* v = base + C + int64_t{kv + g} * hs;  // (nk, hs) row stride C3
      gemm<Real>(Trans::no, Trans::yes, bq, nk, hs, scale, q, static_cast<int>(C3), k, static_cast<int>(C3), Real(0),
                 S, nk);
      Real* lse_bh = lse + (int64_t{b} * NH + h) * T;
      for (int r = 0; r < bq; ++r) {
        Real* s = S + int64_t{r} * nk;
        const int valid = i0 + r + 1;
        Real mx = -std::numeric_limits<Real>::infinity();
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < valid; ++j) mx = std::max(mx, s[j]);
        exp_row(s, valid, nk, mx);
        Real sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < valid; ++j) sum += s[j];
        inv_sum[r] = Real(1) / sum;
        lse_bh[i0 + r] = mx + std::log(sum);
      }
      // O = (unnormalised P) V, then each row scaled by 1/sum: a pass over (bq, hs), not (bq, nk).
      Real* o = out + (int64_t{b} * T + i0) * C + h * hs;
      gemm<Real>(Trans::no, Trans::no, bq, hs, nk, Real(1), S, nk, v, static_cast<int>(C3), Real(0), o, C);
      for (int r = 0; r < bq; ++r) {
        Real* orow = o + int64_t{r} * C;
#pragma omp simd
        for (int c = 0; c < hs; ++c) orow[c] *= inv_sum[r];
      }
    }
  }
}

template <class Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* lse, int B, int T, int C, int NH,
                        int NKV) {
  const char* op = "attention_backward";
  const int kv = check_attention(op, B, T, C, NH, NKV);
  detail::require_pointer(op, "dqkv", dqkv);
  detail::require_pointer(op, "dout", dout);
  detail::require_pointer(op, "qkv", qkv);
  detail::require_pointer(op, "lse", lse);
  const int hs = C / NH, group = NH / kv;
  const int64_t C3 = C + int64_t{2} * kv * hs;
  const int ld3 = static_cast<int>(C3);
  const Real scale = Real(1) / std::sqrt(static_cast<Real>(hs));
  const int nqb = (T + kAttentionBlock - 1) / kAttentionBlock;
  // One task per (batch, key/value head): its dK and dV sum over the query blocks of each query
  // head of its group, heads in order (one head, as before, without grouping).
  const int64_t tasks = int64_t{B} * kv;
  const bool parallel = gemm_nests_in_openmp() && tasks > 1;
  const size_t block = static_cast<size_t>(kAttentionBlock) * T;
  std::vector<Real> scratch(2 * block * (parallel ? omp_get_max_threads() : 1));
#pragma omp parallel if (parallel)
  {
    Real* P = scratch.data() + 2 * block * omp_get_thread_num();  // (bq, nk) probabilities
    Real* dS = P + block;                                          // (bq, nk) dP, then dS
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int g = static_cast<int>(task % kv);
      const int b = static_cast<int>(task / kv);
      const Real* base = qkv + int64_t{b} * T * C3;
      const Real* k = base + C + g * hs;
      const Real* v = base + C + int64_t{kv + g} * hs;
      Real* dbase = dqkv + int64_t{b} * T * C3;
      Real* dk = dbase + C + g * hs;
      Real* dv = dbase + C + int64_t{kv + g} * hs;
      for (int t = 0; t < T; ++t) {
        std::fill(dk + t * C3, dk + t * C3 + hs, Real(0));
        std::fill(dv + t * C3, dv + t * C3 + hs, Real(0));
      }
      for (int h = g * group; h < (g + 1) * group; ++h) {
        const Real* lse_bh = lse + (int64_t{b} * NH + h) * T;
        for (int qb = 0; qb < nqb; ++qb) {
          const int i0 = qb * kAttentionBlock, i1 = std::min(T, i0 + kAttentionBlock);
          const int bq = i1 - i0, nk = i1;
          const Real* q = base + i0 * C3 + h * hs;
          const Real* dO = dout + (int64_t{b} * T + i0) * C + h * hs;  // (bq, hs) row stride C
          gemm<Real>(Trans::no, Trans::yes, bq, nk, hs, scale, q, ld3, k, ld3, Real(0), P, nk);
          gemm<Real>(Trans::no, Trans::yes, bq, nk, hs, Real(1), dO, C, v, ld3, Real(0), dS, nk);
          for (int r = 0; r < bq; ++r) {
            Real* p = P + int64_t{r} * nk;
            Real* ds = dS + int64_t{r} * nk;
            const int valid = i0 + r + 1;
            exp_row(p, valid, nk, lse_bh[i0 + r]);
            Real dot = 0;
#pragma omp simd reduction(+ : dot)
            for (int j = 0; j < valid; ++j) dot += p[j] * ds[j];
#pragma omp simd
            for (int j = 0; j < valid; ++j) ds[j] = p[j] * (ds[j] - dot);
            std::fill(ds + valid, ds + nk, Real(0));
          }
          Real* dq = dbase + i0 * C3 + h * hs;
          gemm<Real>(Trans::no, Trans::no, bq, hs, nk, scale, dS, nk, k, ld3, Real(0), dq, ld3);
          gemm<Real>(Trans::yes, Trans::no, nk, hs, bq, scale, dS, nk, q, ld3, Real(1), dk, ld3);
          gemm<Real>(Trans::yes, Trans::no, nk, hs, bq, Real(1), P, nk, dO, C, Real(1), dv, ld3);
        }
      }
    }
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, int);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, int);
template void attention_backward<float>(float*, const float*, const float*, const float*, int, int, int, int, int);
template void attention_backward<double>(double*, const double*, const double*, const double*, int, int, int, int,
                                         int);

}  // namespace triax::ops
