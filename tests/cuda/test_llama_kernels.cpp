// The Llama block's CUDA kernels (cuda/rmsnorm.h, cuda/swiglu.h, cuda/rope.h) and grouped-query
// attention (cuda/attention.h with NKV < NH) against naive references in double written here from
// the contracts of include/triax/backend/backend.h (not the CPU ops: these tests stand on their
// own), on the very values the GPU sees (half inputs rounded first), fresh random inputs (seed
// printed; TRIAX_TEST_SEED replays), every written output poisoned with NaN before the launch.
// Sizes cover the 16-byte vector paths and the scalar paths (odd widths). Each check prints
// "llama <kernel> <type> rel_err <e> tol <t> ok|FAIL", rel_err = max|gpu - ref| / max|ref| (NaN ->
// inf); tolerances by the stored type: fp32 1e-5, bf16 1e-2, fp16 2e-3; fp32 parameter gradients
// 1e-5 for every activation type. Every backward (and the rotations) runs twice: the bits must be
// equal (no atomics anywhere). Without a GPU only the [nogpu] argument checks run and the test
// reports "skipped" (exit 77, tests/support/cuda_main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "support/cuda_buffer.h"
#include "support/gpu_check.h"
#include "triax/core/cuda_check.h"
#include "triax/core/error.h"
#include "triax/cuda/attention.h"
#include "triax/cuda/rmsnorm.h"
#include "triax/cuda/rope.h"
#include "triax/cuda/swiglu.h"
#include "unit/ops_testing.h"

using namespace triax;
using triax::test::DeviceBuffer;

const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"llama", 56, 5};

namespace lt {

using namespace test::gpu;  // support/gpu_check.h

constexpr double kGradTol = 1e-5;  // fp32 parameter gradients, any activation type

// Bit-equality of a device buffer with an earlier download (the determinism checks).
template <class T>
void same_bits(const std::string& what, const DeviceBuffer<T>& b, const std::vector<T>& before, const Stream& s) {
  s.sync();
  const auto now = b.download();
  const bool same = std::memcmp(now.data(), before.data(), now.size() * sizeof(T)) == 0;
  fmt::print("llama {:<56} {:<5} second run {}\n", what, tname<T>(), same ? "bit-identical" : "DIFFERS");
  INFO(what << ": a second run changed the bits");
  CHECK(same);
}

// ---------------------------------------------------------------- references (double)

struct RmsRef {
  std::vector<double> out, rstd;
};
RmsRef rmsnorm_ref(const std::vector<double>& x, const std::vector<double>& w, int N, int C, double eps) {
  RmsRef r{std::vector<double>(x.size()), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double ss = 0;
    for (int c = 0; c < C; ++c) ss += x[size_t(n) * C + c] * x[size_t(n) * C + c];
    r.rstd[n] = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) r.out[size_t(n) * C + c] = w[c] * x[size_t(n) * C + c] * r.rstd[n];
  }
  return r;
}

// dinp (= or +=), dw (+=) by the chain rule of out = w x r, r = (mean(x^2) + eps)^(-1/2).
void rmsnorm_backward_ref(std::vector<double>& dinp, std::vector<double>& dw, const std::vector<double>& dout,
                          const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& rstd,
                          int N, int C, bool accumulate) {
  for (int n = 0; n < N; ++n) {
    const size_t o = size_t(n) * C;
    const double r = rstd[n];
    double sgx = 0;
    for (int c = 0; c < C; ++c) sgx += dout[o + c] * w[c] * x[o + c];
    for (int c = 0; c < C; ++c) {
      // d/dx_c of sum_k g_k x_k r = g_c r + sum_k g_k x_k dr/dx_c, dr/dx_c = -r^3 x_c / C
      const double d = dout[o + c] * w[c] * r - x[o + c] * r * r * r * sgx / C;
      dinp[o + c] = accumulate ? dinp[o + c] + d : d;
      dw[c] += dout[o + c] * x[o + c] * r;
    }
  }
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

// Positions' cos/sin tables (T, HD/2) as HF builds them (theta^(-2i/HD)), rounded to fp32: the
// values the GPU reads, in both forms.
struct Tables {
  std::vector<float> cos, sin;
};
Tables rope_tables(int T, int HD, double theta) {
  Tables tb;
  const int half = HD / 2;
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < half; ++i) {
      const double a = t * std::pow(theta, -2.0 * i / HD);
      tb.cos.push_back(static_cast<float>(std::cos(a)));
      tb.sin.push_back(static_cast<float>(std::sin(a)));
    }
  return tb;
}

// The rotation of the q and k heads of x (B, T, (NH + 2 NKV) HD); sign -1 is the inverse.
std::vector<double> rope_ref(std::vector<double> x, const Tables& tb, int B, int T, int NH, int NKV, int HD,
                             double sign) {
  const int half = HD / 2;
  const size_t row = size_t(NH + 2 * NKV) * HD;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH + NKV; ++h)
        for (int i = 0; i < half; ++i) {
          double* p = x.data() + (size_t(b) * T + t) * row + size_t(h) * HD + i;
          const double c = tb.cos[size_t(t) * half + i], s = sign * tb.sin[size_t(t) * half + i];
          const double a = p[0], z = p[half];
          p[0] = a * c - z * s;
          p[half] = z * c + a * s;
        }
  return x;
}

// Grouped-query causal attention: qkv (B, T, W), W = C + 2 NKV HS, token row [q heads | k heads |
// v heads]; query head h reads kv head h / (NH / NKV).
struct Gqa {
  int B, T, NH, NKV, HS;
  int C() const { return NH * HS; }
  size_t W() const { return size_t(NH + 2 * NKV) * HS; }
  size_t q(int b, int t, int h) const { return (size_t(b) * T + t) * W() + size_t(h) * HS; }
  size_t k(int b, int t, int g) const { return (size_t(b) * T + t) * W() + size_t(NH + g) * HS; }
  size_t v(int b, int t, int g) const { return (size_t(b) * T + t) * W() + size_t(NH + NKV + g) * HS; }
  int kv(int h) const { return h / (NH / NKV); }
};

double dot(const double* a, const double* b, int n) {
  double s = 0;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// The probabilities of query i of head h over keys 0..i (and lse).
std::vector<double> probs(const Gqa& s, const std::vector<double>& qkv, int b, int h, int i, double& lse) {
  const double scale = 1.0 / std::sqrt(double(s.HS));
  std::vector<double> p(i + 1);
  double m = -std::numeric_limits<double>::infinity();
  for (int j = 0; j <= i; ++j) {
    p[j] = scale * dot(&qkv[s.q(b, i, h)], &qkv[s.k(b, j, s.kv(h))], s.HS);
    m = std::max(m, p[j]);
  }
  double z = 0;
  for (int j = 0; j <= i; ++j) z += std::exp(p[j] - m);
  for (int j = 0; j <= i; ++j) p[j] = std::exp(p[j] - m) / z;
  lse = m + std::log(z);
  return p;
}

void gqa_forward_ref(const Gqa& s, const std::vector<double>& qkv, std::vector<double>& out, std::vector<double>& lse) {
  out.assign(size_t(s.B) * s.T * s.C(), 0.0);
  lse.assign(size_t(s.B) * s.NH * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const auto p = probs(s, qkv, b, h, i, lse[(size_t(b) * s.NH + h) * s.T + i]);
        double* o = &out[(size_t(b) * s.T + i) * s.C() + size_t(h) * s.HS];
        for (int j = 0; j <= i; ++j)
          for (int d = 0; d < s.HS; ++d) o[d] += p[j] * qkv[s.v(b, j, s.kv(h)) + d];
      }
}

void gqa_backward_ref(const Gqa& s, const std::vector<double>& qkv, const std::vector<double>& dout,
                      std::vector<double>& dqkv) {
  const double scale = 1.0 / std::sqrt(double(s.HS));
  dqkv.assign(qkv.size(), 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        double lse = 0;
        const auto p = probs(s, qkv, b, h, i, lse);
        const double* dO = &dout[(size_t(b) * s.T + i) * s.C() + size_t(h) * s.HS];
        const int g = s.kv(h);
        std::vector<double> dp(i + 1);
        double D = 0;
        for (int j = 0; j <= i; ++j) {
          dp[j] = dot(dO, &qkv[s.v(b, j, g)], s.HS);
          D += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - D);
          for (int d = 0; d < s.HS; ++d) {
            dqkv[s.q(b, i, h) + d] += scale * ds * qkv[s.k(b, j, g) + d];
            dqkv[s.k(b, j, g) + d] += scale * ds * qkv[s.q(b, i, h) + d];
            dqkv[s.v(b, j, g) + d] += p[j] * dO[d];
          }
        }
      }
}

// One part (q, k or v: channels [lo, hi) of every token row) of a (B*T, W) buffer.
std::vector<double> part(const std::vector<double>& x, size_t rows, size_t W, size_t lo, size_t hi) {
  std::vector<double> out;
  for (size_t r = 0; r < rows; ++r)
    for (size_t c = lo; c < hi; ++c) out.push_back(x[r * W + c]);
  return out;
}

}  // namespace lt

// ---------------------------------------------------------------- RMSNorm

TEMPLATE_TEST_CASE("cuda rmsnorm forward/backward match a double reference", "[cuda][llama][rmsnorm]", float, bf16,
                   f16) {
  using T = TestType;
  lt::Stream s;
  const double eps = 1e-5;
  // 768 and 64: vector rows; 100: vectors for fp32 only; 13: scalar.
  for (auto [N, C] : {std::pair{257, 768}, std::pair{33, 100}, std::pair{1100, 64}, std::pair{5, 13}}) {
    const std::string shape = fmt::format(" N={} C={}", N, C);
    const size_t nc = size_t(N) * C;
    auto x = lt::random_data<T>(nc, -2, 2), w = lt::random_data<T>(C, 0.5, 1.5), g = lt::random_data<T>(nc);
    DeviceBuffer<T> dx(x.dev), dw(w.dev), dg(g.dev), out(nc), dinp(nc);
    DeviceBuffer<float> rstd(N);
    const auto ref = lt::rmsnorm_ref(x.ref, w.ref, N, C, eps);
    lt::poison(out);
    lt::poison(rstd);
    cuda::rmsnorm_forward(out.data(), rstd.data(), dx.data(), dw.data(), N, C, static_cast<float>(eps), s);
    lt::check("rmsnorm_forward out" + shape, out, ref.out, s);
    lt::check("rmsnorm_forward rstd" + shape, rstd, ref.rstd, s, lt::kGradTol);  // fp32 statistics

    // Backward: overwrite with dweight accumulating onto old fp32 values, then accumulate.
    auto gw0 = lt::random_data<float>(C), dinp0 = lt::random_data<T>(nc);
    DeviceBuffer<float> gw(gw0.dev);
    std::vector<double> rdinp(nc), rgw = gw0.ref;
    lt::rmsnorm_backward_ref(rdinp, rgw, g.ref, x.ref, w.ref, ref.rstd, N, C, false);
    lt::poison(dinp);
    cuda::rmsnorm_backward(dinp.data(), gw.data(), dg.data(), dx.data(), dw.data(), rstd.data(), N, C,
                           ops::GradMode::overwrite, s);
    lt::check("rmsnorm_backward dinp" + shape, dinp, rdinp, s);
    lt::check("rmsnorm_backward dweight" + shape + " act=" + lt::tname<T>(), gw, rgw, s, lt::kGradTol);
    const auto dinp_bits = dinp.download();
    const auto gw_bits = gw.download();
    gw.upload(gw0.dev);
    cuda::rmsnorm_backward(dinp.data(), gw.data(), dg.data(), dx.data(), dw.data(), rstd.data(), N, C,
                           ops::GradMode::overwrite, s);
    lt::same_bits("rmsnorm_backward dinp" + shape, dinp, dinp_bits, s);
    lt::same_bits("rmsnorm_backward dweight" + shape, gw, gw_bits, s);
    std::vector<double> racc = dinp0.ref, unused(C);
    lt::rmsnorm_backward_ref(racc, unused, g.ref, x.ref, w.ref, ref.rstd, N, C, true);
    dinp.upload(dinp0.dev);
    cuda::rmsnorm_backward(dinp.data(), nullptr, dg.data(), dx.data(), dw.data(), rstd.data(), N, C,
                           ops::GradMode::accumulate, s);
    lt::check("rmsnorm_backward dinp accumulate" + shape, dinp, racc, s);
  }
}

// ---------------------------------------------------------------- SwiGLU

TEMPLATE_TEST_CASE("cuda swiglu forward/backward match a double reference", "[cuda][llama][swiglu]", float, bf16, f16) {
  using T = TestType;
  lt::Stream s;
  // F = 176, 64: vectors; 13, 6: scalar (6 is a vector width for nothing but 2-element types).
  for (auto [N, F] : {std::pair{67, 176}, std::pair{1000, 64}, std::pair{33, 13}, std::pair{3, 6}}) {
    const std::string shape = fmt::format(" N={} F={}", N, F);
    const size_t nf = size_t(N) * F;
    auto h = lt::random_data<T>(2 * nf, -6, 6), d = lt::random_data<T>(nf);
    DeviceBuffer<T> dh_in(h.dev), dd(d.dev), out(nf), dh(2 * nf);
    std::vector<double> rout(nf), rdh(2 * nf);
    for (int n = 0; n < N; ++n)
      for (int f = 0; f < F; ++f) {
        const double gate = h.ref[size_t(n) * 2 * F + f], up = h.ref[size_t(n) * 2 * F + F + f];
        const double dout = d.ref[size_t(n) * F + f];
        const double sg = 1.0 / (1.0 + std::exp(-gate));
        rout[size_t(n) * F + f] = lt::silu(gate) * up;
        rdh[size_t(n) * 2 * F + f] = dout * up * sg * (1.0 + gate * (1.0 - sg));
        rdh[size_t(n) * 2 * F + F + f] = dout * lt::silu(gate);
      }
    lt::poison(out);
    cuda::swiglu_forward(out.data(), dh_in.data(), N, F, s);
    lt::check("swiglu_forward out" + shape, out, rout, s);
    lt::poison(dh);
    cuda::swiglu_backward(dh.data(), dd.data(), dh_in.data(), N, F, s);
    const auto got = lt::fetch(dh, s);
    lt::report("swiglu_backward dgate" + shape, lt::tname<T>(),
               lt::rel_err(lt::part(got, N, 2 * F, 0, F), lt::part(rdh, N, 2 * F, 0, F)), lt::tol<T>());
    lt::report("swiglu_backward dup" + shape, lt::tname<T>(),
               lt::rel_err(lt::part(got, N, 2 * F, F, 2 * F), lt::part(rdh, N, 2 * F, F, 2 * F)), lt::tol<T>());
    const auto bits = dh.download();
    lt::poison(dh);
    cuda::swiglu_backward(dh.data(), dd.data(), dh_in.data(), N, F, s);
    lt::same_bits("swiglu_backward dh" + shape, dh, bits, s);
  }
}

// ---------------------------------------------------------------- RoPE

TEMPLATE_TEST_CASE("cuda rope forward/backward match a double reference, value heads untouched",
                   "[cuda][llama][rope]", float, bf16, f16) {
  using T = TestType;
  lt::Stream s;
  struct Shape {
    int B, T, NH, NKV, HD;
  };
  // HD 64 and 128: vectors of 4 pairs; HD 6 (3 pairs): scalar; NKV = NH: multi-head.
  for (const Shape sh : {Shape{2, 37, 8, 2, 64}, Shape{1, 70, 4, 1, 128}, Shape{3, 11, 3, 3, 6}, Shape{1, 5, 2, 2, 32}}) {
    const auto [B, Tn, NH, NKV, HD] = sh;
    const std::string what = fmt::format(" B={} T={} NH={} NKV={} HD={}", B, Tn, NH, NKV, HD);
    const size_t W = size_t(NH + 2 * NKV) * HD, n = size_t(B) * Tn * W;
    const auto tb = lt::rope_tables(Tn, HD, 500000.0);
    auto x = lt::random_data<T>(n, -2, 2);
    DeviceBuffer<T> dx(x.dev);
    DeviceBuffer<float> dc(tb.cos), ds(tb.sin);
    const auto want = lt::rope_ref(x.ref, tb, B, Tn, NH, NKV, HD, 1.0);
    cuda::rope_forward(dx.data(), dc.data(), ds.data(), B, Tn, NH, NKV, HD, s);
    const auto got = lt::fetch(dx, s);
    lt::report("rope_forward q,k" + what, lt::tname<T>(),
               lt::rel_err(lt::part(got, size_t(B) * Tn, W, 0, size_t(NH + NKV) * HD),
                           lt::part(want, size_t(B) * Tn, W, 0, size_t(NH + NKV) * HD)),
               lt::tol<T>());
    // The value heads are not touched: the exact input bits.
    const auto v_got = lt::part(got, size_t(B) * Tn, W, size_t(NH + NKV) * HD, W);
    const auto v_in = lt::part(x.ref, size_t(B) * Tn, W, size_t(NH + NKV) * HD, W);
    CHECK(std::memcmp(v_got.data(), v_in.data(), v_in.size() * sizeof(double)) == 0);
    // Backward on a fresh gradient: the inverse rotation.
    auto g = lt::random_data<T>(n);
    DeviceBuffer<T> dg(g.dev);
    const auto gwant = lt::rope_ref(g.ref, tb, B, Tn, NH, NKV, HD, -1.0);
    cuda::rope_backward(dg.data(), dc.data(), ds.data(), B, Tn, NH, NKV, HD, s);
    lt::check("rope_backward dqkv" + what, dg, gwant, s);
    // Deterministic, and in place means in place: the same input gives the same bits.
    dg.upload(g.dev);
    const auto bits1 = [&] {
      cuda::rope_backward(dg.data(), dc.data(), ds.data(), B, Tn, NH, NKV, HD, s);
      s.sync();
      return dg.download();
    }();
    dg.upload(g.dev);
    cuda::rope_backward(dg.data(), dc.data(), ds.data(), B, Tn, NH, NKV, HD, s);
    lt::same_bits("rope_backward dqkv" + what, dg, bits1, s);
  }
}

// ---------------------------------------------------------------- grouped-query attention

TEMPLATE_TEST_CASE("cuda grouped-query attention forward/backward match a double reference", "[cuda][llama][attention]",
                   float, bf16, f16) {
  using T = TestType;
  lt::Stream s;
  // Groups of 4 and 2, multi-query (NKV 1), and multi-head given as NKV = NH; T not a multiple of
  // the 64-query block or the 32-key tile.
  for (const lt::Gqa sh : {lt::Gqa{2, 70, 8, 2, 32}, lt::Gqa{1, 130, 4, 1, 64}, lt::Gqa{1, 67, 4, 2, 128},
                           lt::Gqa{2, 33, 2, 2, 64}}) {
    const int B = sh.B, Tn = sh.T, NH = sh.NH, NKV = sh.NKV, C = sh.C();
    const std::string what = fmt::format(" B={} T={} NH={} NKV={} hs={}", B, Tn, NH, NKV, sh.HS);
    const size_t W = sh.W(), rows = size_t(B) * Tn, nq = rows * W, n1 = rows * C, nl = size_t(B) * NH * Tn;
    auto qkv = lt::random_data<T>(nq, -2, 2), dout = lt::random_data<T>(n1);
    DeviceBuffer<T> dqkv_in(qkv.dev), ddout(dout.dev), out(n1), dqkv(nq);
    DeviceBuffer<float> lse(nl);
    std::vector<double> rout, rlse, rdqkv;
    lt::gqa_forward_ref(sh, qkv.ref, rout, rlse);
    lt::poison(out);
    lt::poison(lse);
    cuda::attention_forward(out.data(), lse.data(), dqkv_in.data(), B, Tn, C, NH, NKV, s);
    lt::check("gqa attention_forward out" + what, out, rout, s);
    lt::check("gqa attention_forward lse" + what, lse, rlse, s, lt::kGradTol);
    lt::gqa_backward_ref(sh, qkv.ref, dout.ref, rdqkv);
    lt::poison(dqkv);
    cuda::attention_backward(dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B, Tn, C, NH, NKV, s);
    const auto got = lt::fetch(dqkv, s);
    const size_t bounds[4] = {0, size_t(C), size_t(C) + size_t(NKV) * sh.HS, W};
    for (int p = 0; p < 3; ++p)  // each part on its own: a wrong dK would hide behind a large dQ
      lt::report(fmt::format("gqa attention_backward d{}{}", "qkv"[p], what), lt::tname<T>(),
                 lt::rel_err(lt::part(got, rows, W, bounds[p], bounds[p + 1]),
                             lt::part(rdqkv, rows, W, bounds[p], bounds[p + 1])),
                 lt::tol<T>());
    const auto bits = dqkv.download();
    lt::poison(dqkv);
    cuda::attention_backward(dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B, Tn, C, NH, NKV, s);
    lt::same_bits("gqa attention_backward dqkv" + what, dqkv, bits, s);
    if (NKV == NH) {  // NKV = 0 means multi-head: the same call
      cuda::attention_backward(dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B, Tn, C, NH, 0, s);
      lt::same_bits("attention_backward NKV=0 vs NKV=NH" + what, dqkv, bits, s);
    }
  }
}

// ---------------------------------------------------------------- no GPU needed

TEST_CASE("cuda llama launchers reject bad arguments before touching the device", "[nogpu][cuda][llama]") {
  float* f = reinterpret_cast<float*>(uintptr_t{256});
  cudaStream_t s = nullptr;
  CHECK_THROWS_AS(cuda::rmsnorm_forward<float>(f, f, f, f, 0, 8, 1e-5f, s), ConfigError);
  CHECK_THROWS_AS(cuda::rmsnorm_forward<float>(f, f, f, f, 4, 8, 0.0f, s), ConfigError);
  CHECK_THROWS_AS(cuda::rmsnorm_forward<float>(f, nullptr, f, f, 4, 8, 1e-5f, s), ConfigError);
  CHECK_THROWS_AS(cuda::rmsnorm_backward<float>(f, f, f, f, f, nullptr, 4, 8, ops::GradMode::overwrite, s), ConfigError);
  CHECK_THROWS_AS(cuda::rmsnorm_backward<float>(f, f, f, f, f, f, 4, -1, ops::GradMode::overwrite, s), ConfigError);
  CHECK_THROWS_AS(cuda::swiglu_forward<float>(f, f, 4, 0, s), ConfigError);
  CHECK_THROWS_AS(cuda::swiglu_forward<float>(f, nullptr, 4, 8, s), ConfigError);
  CHECK_THROWS_AS(cuda::swiglu_backward<float>(f, f, nullptr, 4, 8, s), ConfigError);
  CHECK_THROWS_AS(cuda::rope_forward<float>(f, f, f, 1, 4, 2, 1, 7, s), ConfigError);  // odd HD
  CHECK_THROWS_AS(cuda::rope_forward<float>(f, f, f, 1, 4, 2, 0, 8, s), ConfigError);  // no key heads
  CHECK_THROWS_AS(cuda::rope_backward<float>(f, nullptr, f, 1, 4, 2, 1, 8, s), ConfigError);
  // Grouped-query attention: NKV must divide NH (and not be negative).
  CHECK_THROWS_WITH((cuda::attention_forward<float>(f, f, f, 1, 8, 128, 4, 3, s)),
                    Catch::Matchers::Contains("NKV=3") && Catch::Matchers::Contains("NH=4"));
  CHECK_THROWS_AS((cuda::attention_backward<float>(f, f, f, f, f, 1, 8, 128, 4, -1, s)), ConfigError);
  CHECK_THROWS_AS((cuda::attention_backward<float>(f, f, f, f, f, 1, 8, 128, 2, 4, s)), ConfigError);  // NKV > NH
}
