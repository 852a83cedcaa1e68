// The context-parallel block decomposition as a test harness, shared by the CPU unit test
// (tests/unit/ops/test_attention_block.cpp) and the CUDA test (tests/cuda/test_attention_block.cpp):
// a sequence of T tokens cut into the zigzag chunks of cp ranks (CpZigzag), every causal pair of a
// rank's query chunks and a rank's key chunks run as Backend::attention_block_forward (from lse =
// -inf) and attention_block_backward (from the final out/lse), the results put back in the
// whole-sequence layouts, beside the whole-sequence ops::attention_forward/backward in fp64.
#pragma once
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/ops/attention.h"
#include "triax/parallel/context_parallel.h"
#include "unit/ops_testing.h"

namespace triax::test::cpblock {

// Host <-> backend in the element type R (float, double or bf16), values given as double.
template <class R>
Tensor up(Backend& be, const std::vector<double>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, dtype_of<R>());
  std::vector<R> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = R(static_cast<float>(v[i]));
  if constexpr (std::is_same_v<R, double>) r.assign(v.begin(), v.end());
  be.copy_from_host(t, r.data(), r.size() * sizeof(R));
  return t;
}
template <class R>
std::vector<double> down(Backend& be, const Tensor& t) {
  std::vector<R> r(static_cast<size_t>(t.numel()));
  be.copy_to_host(r.data(), t, r.size() * sizeof(R));
  std::vector<double> v(r.size());
  for (size_t i = 0; i < r.size(); ++i) v[i] = static_cast<double>(static_cast<float>(r[i]));
  if constexpr (std::is_same_v<R, double>) v.assign(r.begin(), r.end());
  return v;
}
// x rounded to R and back (the values a backend of type R holds).
template <class R>
std::vector<double> rounded(std::vector<double> v) {
  if constexpr (!std::is_same_v<R, double>)
    for (auto& x : v) x = static_cast<double>(static_cast<float>(R(static_cast<float>(x))));
  return v;
}

struct Case {
  int cp, B, T, NH, NKV, hs;
  int C() const { return NH * hs; }
  int kv() const { return NKV > 0 ? NKV : NH; }
  int W() const { return C() + 2 * kv() * hs; }
};

// The whole-sequence op in double precision: out (B,T,C), lse (B,NH,T), dqkv (B,T,W).
struct Whole {
  std::vector<double> out, lse, dqkv;
};
inline Whole whole(const Case& c, const std::vector<double>& qkv, const std::vector<double>& dout) {
  Whole w{std::vector<double>(size_t(c.B) * c.T * c.C()), std::vector<double>(size_t(c.B) * c.NH * c.T),
          std::vector<double>(qkv.size())};
  ops::attention_forward<double>(w.out.data(), w.lse.data(), qkv.data(), c.B, c.T, c.C(), c.NH, c.NKV);
  ops::attention_backward<double>(w.dqkv.data(), dout.data(), qkv.data(), w.lse.data(), c.B, c.T, c.C(), c.NH, c.NKV);
  return w;
}

// Rows of rank z.rank: (B, local, width) gathered from (B, T, width) at the zigzag positions; and
// the reverse (scatter into a full-size vector).
inline std::vector<double> gather(const CpZigzag& z, int B, int width, const std::vector<double>& full) {
  const auto pos = z.positions();
  std::vector<double> v(size_t(B) * pos.size() * width);
  for (int b = 0; b < B; ++b)
    for (size_t t = 0; t < pos.size(); ++t)
      for (int k = 0; k < width; ++k)
        v[(size_t(b) * pos.size() + t) * width + k] = full[(size_t(b) * z.seq + size_t(pos[t])) * width + k];
  return v;
}
inline void scatter(const CpZigzag& z, int B, int width, const std::vector<double>& local, std::vector<double>& full) {
  const auto pos = z.positions();
  for (int b = 0; b < B; ++b)
    for (size_t t = 0; t < pos.size(); ++t)
      for (int k = 0; k < width; ++k)
        full[(size_t(b) * z.seq + size_t(pos[t])) * width + k] = local[(size_t(b) * pos.size() + t) * width + k];
}
// lse (B, NH, T) rows: the same by (b, h) row.
inline void scatter_lse(const CpZigzag& z, int B, int NH, const std::vector<double>& local, std::vector<double>& full) {
  const auto pos = z.positions();
  for (int bh = 0; bh < B * NH; ++bh)
    for (size_t t = 0; t < pos.size(); ++t)
      full[size_t(bh) * z.seq + size_t(pos[t])] = local[size_t(bh) * pos.size() + t];
}

// Calls f(block) for each causal chunk pair of rank r's queries and rank s's keys, as
// ContextParallel does; packed: K/V in a (B, local, 2 kv hs) buffer, else read from qkv at column C.
template <class F>
void for_blocks(const Case& c, int r, int s, bool packed, F&& f) {
  const CpZigzag z{c.cp, r, c.T};
  const int tc = z.chunk(), Tl = z.local(), kvw = 2 * c.kv() * c.hs;
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      const int qc = z.chunk_of(r, qh), kc = z.chunk_of(s, kh);
      if (kc > qc) continue;
      f(ops::AttentionBlock{c.B, c.C(), c.NH, c.NKV, Tl, qh * tc, tc, Tl, kh * tc, tc, packed ? kvw : c.W(),
                            packed ? 0 : c.C(), int64_t{qc} * tc, int64_t{kc} * tc});
    }
}

// The decomposition on a backend of element type R (lse in L): returns out, lse and dqkv in the
// whole-sequence layouts.
template <class R, class L>
Whole blocks(Backend& be, const Case& c, bool packed, const std::vector<double>& qkv, const std::vector<double>& dout) {
  const int Tl = c.T / c.cp, kvw = 2 * c.kv() * c.hs;
  const int64_t rows = int64_t{c.B} * Tl;
  std::vector<Tensor> q(c.cp), kv(c.cp), dq(c.cp), dkv(c.cp), out(c.cp), lse(c.cp), dO(c.cp);
  for (int r = 0; r < c.cp; ++r) {
    const CpZigzag z{c.cp, r, c.T};
    q[r] = up<R>(be, gather(z, c.B, c.W(), qkv));
    dO[r] = up<R>(be, gather(z, c.B, c.C(), dout));
    kv[r] = packed ? be.empty(Shape{rows * kvw}, dtype_of<R>()) : q[r];
    if (packed) be.copy_columns(kv[r], q[r], rows, kvw, 0, c.W(), c.C(), kvw);
    out[r] = up<R>(be, std::vector<double>(size_t(rows) * c.C(), std::numeric_limits<double>::quiet_NaN()));
    lse[r] = be.empty(Shape{int64_t{c.B} * c.NH * Tl}, dtype_of<L>());
    be.fill(lse[r], -std::numeric_limits<double>::infinity());
    dq[r] = be.zeros(Shape{rows * c.W()}, dtype_of<R>());
    dkv[r] = be.zeros(Shape{rows * (packed ? kvw : c.W())}, dtype_of<R>());
  }
  for (int r = 0; r < c.cp; ++r)
    for (int s = 0; s < c.cp; ++s)
      for_blocks(c, r, s, packed, [&](const ops::AttentionBlock& a) { be.attention_block_forward(out[r], lse[r], q[r], kv[s], a); });
  for (int r = 0; r < c.cp; ++r)
    for (int s = 0; s < c.cp; ++s)
      for_blocks(c, r, s, packed, [&](const ops::AttentionBlock& a) {
        be.attention_block_backward(dq[r], dkv[s], dO[r], q[r], kv[s], out[r], lse[r], a);
      });
  Whole w{std::vector<double>(size_t(c.B) * c.T * c.C()), std::vector<double>(size_t(c.B) * c.NH * c.T),
          std::vector<double>(qkv.size())};
  for (int r = 0; r < c.cp; ++r) {
    const CpZigzag z{c.cp, r, c.T};
    // dK/dV back into the key columns of dq (the owner's rows), as ContextParallel does.
    be.copy_columns(dq[r], dkv[r], rows, c.W(), c.C(), packed ? kvw : c.W(), packed ? 0 : c.C(), kvw);
    scatter(z, c.B, c.C(), down<R>(be, out[r]), w.out);
    scatter_lse(z, c.B, c.NH, down<L>(be, lse[r]), w.lse);
    scatter(z, c.B, c.W(), down<R>(be, dq[r]), w.dqkv);
  }
  return w;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// out, lse and dqkv within rtol of the whole-sequence op (absolute part: rtol times the largest).
inline void compare(const Whole& got, const Whole& want, double rtol, const std::string& what) {
  require_close(got.out, want.out, rtol, rtol * max_abs(want.out), what + " out");
  require_close(got.lse, want.lse, rtol, rtol * max_abs(want.lse), what + " lse");
  require_close(got.dqkv, want.dqkv, rtol, rtol * max_abs(want.dqkv), what + " dqkv");
}

inline std::string name(const Case& c, bool packed) {
  return fmt::format("cp {} B {} T {} NH {} NKV {} hs {} {}", c.cp, c.B, c.T, c.NH, c.NKV, c.hs,
                     packed ? "packed K/V" : "K/V in qkv");
}

}  // namespace triax::test::cpblock
