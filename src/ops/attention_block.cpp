// One block of context-parallel attention (ops/attention.h AttentionBlock): the query rows of this
// rank against one key/value block, with the causal mask taken from the true positions of both.
// Forward, per (batch, head, query tile): S = scale Q K^T over the keys the tile may see, a stable
// softmax per row, O_b = P V, then the online-softmax merge into the running (out, lse). Backward,
// per (batch, key/value head), its query heads and their tiles in order: P = exp(S - lse) with the
// final lse, dP = dO V^T, dS = P (dP - D) with D = rowsum(dO * O), dQ += scale dS K, dK += scale
// dS^T Q, dV += P^T dO. Each task owns its output rows/columns, so the bits do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "ops_common.h"
#include "triax/ops/attention.h"
#include "triax/ops/gemm.h"
#include "triax/ops/vec_math.h"

namespace triax::ops {

int check_attention_block(const char* op, const AttentionBlock& a) {
  detail::require_positive(op, "B", a.B);
  detail::require_positive(op, "C", a.C);
  detail::require_positive(op, "NH", a.NH);
  if (a.C % a.NH != 0) TRIAX_THROW(ConfigError, "{}: {} heads do not divide C={}", op, a.NH, a.C);
  const int kv = a.NKV > 0 ? a.NKV : a.NH;
  if (a.NKV < 0 || a.NH % kv != 0)
    TRIAX_THROW(ConfigError, "{}: NKV={} key/value heads do not divide NH={} query heads", op, a.NKV, a.NH);
  const int hs = a.C / a.NH;
  if (a.nq < 0 || a.q_row0 < 0 || a.q_row0 + a.nq > a.q_T)
    TRIAX_THROW(ConfigError, "{}: query rows [{}, {}) outside the {} rows of a sequence", op, a.q_row0,
                a.q_row0 + a.nq, a.q_T);
  if (a.nk < 0 || a.kv_row0 < 0 || a.kv_row0 + a.nk > a.kv_T)
    TRIAX_THROW(ConfigError, "{}: key rows [{}, {}) outside the {} rows of a sequence", op, a.kv_row0,
                a.kv_row0 + a.nk, a.kv_T);
  if (a.kv_col0 < 0 || a.kv_col0 + 2 * kv * hs > a.kv_width)
    TRIAX_THROW(ConfigError, "{}: K/V columns [{}, {}) outside the key row width {}", op, a.kv_col0,
                a.kv_col0 + 2 * kv * hs, a.kv_width);
  return kv;
}

AttentionBlockSizes attention_block_sizes(const char* op, const AttentionBlock& a) {
  const int kv = check_attention_block(op, a);
  const int64_t B = a.B, qw = a.C + int64_t{2} * kv * (a.C / a.NH);
  return {B * a.q_T * qw, B * a.kv_T * a.kv_width, B * a.q_T * a.C, B * a.NH * a.q_T};
}

namespace {

struct Geometry {
  int kv, hs, group, qw;
  double scale;
  explicit Geometry(const AttentionBlock& a, int kvh)
      : kv(kvh), hs(a.C / a.NH), group(a.NH / kvh), qw(a.C + 2 * kvh * (a.C / a.NH)),
        scale(1.0 / std::sqrt(static_cast<double>(a.C / a.NH))) {}
};

// Keys of the block that query i (block-relative) sees: a prefix of the block.
int visible(const AttentionBlock& a, int i) {
  const int64_t v = a.q_pos0 + i - a.k_pos0 + 1;
  return static_cast<int>(std::clamp<int64_t>(v, 0, a.nk));
}

// Merges one row of a block (o_b unnormalised: P V with row sum `sum`, lse_b) into (out, lse).
template <class Real>
void merge_row(Real* out, Real& lse, const Real* ob, Real sum, Real lse_b, int hs) {
  if (lse == -std::numeric_limits<Real>::infinity()) {
    const Real inv = Real(1) / sum;
    for (int c = 0; c < hs; ++c) out[c] = ob[c] * inv;
    lse = lse_b;
    return;
  }
  const Real hi = std::max(lse, lse_b), lo = std::min(lse, lse_b);
  const Real merged = hi + std::log1p(std::exp(lo - hi));
  const Real keep = std::exp(lse - merged), add = std::exp(lse_b - merged) / sum;
  for (int c = 0; c < hs; ++c) out[c] = out[c] * keep + ob[c] * add;
  lse = merged;
}

}  // namespace

template <class Real>
void attention_block_forward(Real* out, Real* lse, const Real* q, const Real* kv, const AttentionBlock& a) {
  const char* op = "attention_block_forward";
  const Geometry g(a, check_attention_block(op, a));
  if (a.nq == 0 || a.nk == 0 || visible(a, a.nq - 1) == 0) return;
  const int nqb = (a.nq + kAttentionBlock - 1) / kAttentionBlock;
  const int64_t tasks = int64_t{a.B} * a.NH * nqb;
  const bool parallel = gemm_nests_in_openmp() && tasks > 1;
  const size_t per_thread = static_cast<size_t>(kAttentionBlock) * (a.nk + g.hs + 2);
  std::vector<Real> scratch(per_thread * (parallel ? omp_get_max_threads() : 1));
  const Real scale = static_cast<Real>(g.scale);
#pragma omp parallel if (parallel)
  {
    Real* S = scratch.data() + per_thread * omp_get_thread_num();  // (bq, nk) scores, then exp(s - max)
    Real* O = S + static_cast<size_t>(kAttentionBlock) * a.nk;      // (bq, hs) unnormalised block output
    Real* mx = O + static_cast<size_t>(kAttentionBlock) * g.hs;      // (bq) row max
    Real* sums = mx + kAttentionBlock;                               // (bq) row sum
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int qb = static_cast<int>(task % nqb);
      const int h = static_cast<int>((task / nqb) % a.NH);
      const int b = static_cast<int>(task / (int64_t{nqb} * a.NH));
      const int i0 = qb * kAttentionBlock, i1 = std::min(a.nq, i0 + kAttentionBlock), bq = i1 - i0;
      const int nk = visible(a, i1 - 1);
      if (nk == 0) continue;
      const int kh = h / g.group;
      const Real* qr = q + (int64_t{b} * a.q_T + a.q_row0 + i0) * g.qw + int64_t{h} * g.hs;
      const Real* kr = kv + (int64_t{b} * a.kv_T + a.kv_row0) * a.kv_width + a.kv_col0 + int64_t{kh} * g.hs;
      const Real* vr = kr + int64_t{g.kv} * g.hs;
      gemm<Real>(Trans::no, Trans::yes, bq, nk, g.hs, scale, qr, g.qw, kr, a.kv_width, Real(0), S, nk);
      for (int r = 0; r < bq; ++r) {
        Real* s = S + int64_t{r} * nk;
        const int valid = visible(a, i0 + r);
        Real m = -std::numeric_limits<Real>::infinity();
        for (int j = 0; j < valid; ++j) m = std::max(m, s[j]);
        Real sum = 0;
        for (int j = 0; j < valid; ++j) {
          s[j] = vexp(s[j] - m);
          sum += s[j];
        }
        std::fill(s + valid, s + nk, Real(0));
        mx[r] = m;
        sums[r] = sum;
      }
      gemm<Real>(Trans::no, Trans::no, bq, g.hs, nk, Real(1), S, nk, vr, a.kv_width, Real(0), O, g.hs);
      for (int r = 0; r < bq; ++r) {
        if (visible(a, i0 + r) == 0) continue;
        const int64_t row = int64_t{b} * a.q_T + a.q_row0 + i0 + r;
        Real& l = lse[(int64_t{b} * a.NH + h) * a.q_T + a.q_row0 + i0 + r];
        const Real lb = mx[r] + std::log(sums[r]);
        merge_row(out + row * a.C + int64_t{h} * g.hs, l, O + int64_t{r} * g.hs, sums[r], lb,
                  g.hs);
      }
    }
  }
}

template <class Real>
void attention_block_backward(Real* dq, Real* dkv, const Real* dout, const Real* q, const Real* kv, const Real* out,
                              const Real* lse, const AttentionBlock& a) {
  const char* op = "attention_block_backward";
  const Geometry g(a, check_attention_block(op, a));
  if (a.nq == 0 || a.nk == 0 || visible(a, a.nq - 1) == 0) return;
  const int nqb = (a.nq + kAttentionBlock - 1) / kAttentionBlock;
  const int64_t tasks = int64_t{a.B} * g.kv;
  const bool parallel = gemm_nests_in_openmp() && tasks > 1;
  const size_t block = static_cast<size_t>(kAttentionBlock) * a.nk;
  std::vector<Real> scratch((2 * block + kAttentionBlock) * (parallel ? omp_get_max_threads() : 1));
  const Real scale = static_cast<Real>(g.scale);
#pragma omp parallel if (parallel)
  {
    Real* P = scratch.data() + (2 * block + kAttentionBlock) * omp_get_thread_num();
    Real* dS = P + block;
    Real* D = dS + block;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int kh = static_cast<int>(task % g.kv);
      const int b = static_cast<int>(task / g.kv);
      const int64_t kv_off = (int64_t{b} * a.kv_T + a.kv_row0) * a.kv_width + a.kv_col0 + int64_t{kh} * g.hs;
      const Real* kr = kv + kv_off;
      const Real* vr = kr + int64_t{g.kv} * g.hs;
      Real* dk = dkv + kv_off;
      Real* dv = dk + int64_t{g.kv} * g.hs;
      for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
        const Real* lse_bh = lse + (int64_t{b} * a.NH + h) * a.q_T + a.q_row0;
        for (int qb = 0; qb < nqb; ++qb) {
          const int i0 = qb * kAttentionBlock, i1 = std::min(a.nq, i0 + kAttentionBlock), bq = i1 - i0;
          const int nk = visible(a, i1 - 1);
          if (nk == 0) continue;
          const int64_t row0 = int64_t{b} * a.q_T + a.q_row0 + i0;
          const Real* qr = q + row0 * g.qw + int64_t{h} * g.hs;
          const Real* dO = dout + row0 * a.C + int64_t{h} * g.hs;
          const Real* O = out + row0 * a.C + int64_t{h} * g.hs;
          for (int r = 0; r < bq; ++r) {
            Real d = 0;
            for (int c = 0; c < g.hs; ++c) d += dO[int64_t{r} * a.C + c] * O[int64_t{r} * a.C + c];
            D[r] = d;
          }
          gemm<Real>(Trans::no, Trans::yes, bq, nk, g.hs, scale, qr, g.qw, kr, a.kv_width, Real(0), P, nk);
          gemm<Real>(Trans::no, Trans::yes, bq, nk, g.hs, Real(1), dO, a.C, vr, a.kv_width, Real(0), dS, nk);
          for (int r = 0; r < bq; ++r) {
            Real* p = P + int64_t{r} * nk;
            Real* ds = dS + int64_t{r} * nk;
            const int valid = visible(a, i0 + r);
            for (int j = 0; j < valid; ++j) {
              p[j] = vexp(p[j] - lse_bh[i0 + r]);
              ds[j] = p[j] * (ds[j] - D[r]);
            }
            std::fill(p + valid, p + nk, Real(0));
            std::fill(ds + valid, ds + nk, Real(0));
          }
          Real* dqr = dq + row0 * g.qw + int64_t{h} * g.hs;
          gemm<Real>(Trans::no, Trans::no, bq, g.hs, nk, scale, dS, nk, kr, a.kv_width, Real(1), dqr, g.qw);
          gemm<Real>(Trans::yes, Trans::no, nk, g.hs, bq, scale, dS, nk, qr, g.qw, Real(1), dk, a.kv_width);
          gemm<Real>(Trans::yes, Trans::no, nk, g.hs, bq, Real(1), P, nk, dO, a.C, Real(1), dv, a.kv_width);
        }
      }
    }
  }
}

void copy_columns(void* dst, const void* src, int elem_bytes, int64_t rows, int dst_width, int dst_col0, int src_width,
                  int src_col0, int ncols) {
  const char* op = "copy_columns";
  detail::require_positive(op, "elem_bytes", elem_bytes);
  if (ncols < 0 || dst_col0 < 0 || src_col0 < 0 || dst_col0 + ncols > dst_width || src_col0 + ncols > src_width)
    TRIAX_THROW(ConfigError, "{}: columns [{}, +{}) of rows {} wide into [{}, +{}) of rows {} wide", op, src_col0,
                ncols, src_width, dst_col0, ncols, dst_width);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t eb = static_cast<size_t>(elem_bytes), n = static_cast<size_t>(ncols) * eb;
#pragma omp parallel for if (rows * ncols >= detail::kParallelMinWork)
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(d + (static_cast<size_t>(r) * static_cast<size_t>(dst_width) + static_cast<size_t>(dst_col0)) * eb,
                s + (static_cast<size_t>(r) * static_cast<size_t>(src_width) + static_cast<size_t>(src_col0)) * eb, n);
}

template void attention_block_forward<float>(float*, float*, const float*, const float*, const AttentionBlock&);
template void attention_block_forward<double>(double*, double*, const double*, const double*, const AttentionBlock&);
template void attention_block_backward<float>(float*, float*, const float*, const float*, const float*, const float*,
                                              const float*, const AttentionBlock&);
template void attention_block_backward<double>(double*, double*, const double*, const double*, const double*,
                                               const double*, const double*, const AttentionBlock&);

}  // namespace triax::ops
