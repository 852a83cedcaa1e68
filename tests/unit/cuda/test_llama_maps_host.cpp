// The SwiGLU and RoPE kernels' loops (kernels/swiglu.cu, kernels/rope.cu) as host emulations, in
// every build and without a GPU: the kernels' index arithmetic and fp32 element math
// (cuda/llama_maps.h) walked by the same vector/scalar split (ops/shared_math.h's for_each_split,
// a grid of a few "threads" striding), on odd sizes, vector widths 4 and 8, aligned and not. Each
// element of the output must be written exactly once (the value heads of qkv never), each vector
// must stay inside one row or half-head, and the values must match double references written
// from backend.h's contracts within fp32 rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "triax/cuda/llama_maps.h"
#include "triax/ops/shared_math.h"
#include "unit/ops_testing.h"

using namespace triax;
namespace lm = triax::cuda::llama_map;
namespace math = triax::ops::math;

namespace {

constexpr int64_t kThreads = 7;  // emulated grid: each "thread" strides by kThreads

template <class Body>
void emulate(const math::VecSplit& split, int64_t n, Body& body) {
  for (int64_t t = 0; t < kThreads; ++t) math::for_each_split(split, n, t, kThreads, body);
}

double max_rel(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return den > 0 ? num / den : num;
}

// The swiglu kernels' bodies on the host: forward writes out, backward writes dgate and dup.
struct SwigluHost {
  const std::vector<float>& h;
  const std::vector<float>& dout;
  std::vector<float>& out;
  std::vector<float>& dh;
  std::vector<int>& out_hits;
  std::vector<int>& dh_hits;
  int64_t F, W;
  void element(int64_t i, int64_t gi) {
    const float g = h[gi], u = h[gi + F], d = dout[i];
    const float s = lm::sigmoid_from_exp(std::exp(-g));
    out[i] = g * s * u;
    dh[gi] = d * u * lm::silu_grad_from_sigmoid(g, s);
    dh[gi + F] = d * (g * s);
    ++out_hits[i], ++dh_hits[gi], ++dh_hits[gi + F];
  }
  void vector(int64_t v) {
    const int64_t gv = lm::swiglu_gate_vector(v, W, F);
    for (int64_t k = 0; k < W; ++k) {
      const int64_t i = v * W + k;
      REQUIRE(i / F == (v * W) / F);  // a vector never crosses a row
      REQUIRE(gv * W + k == lm::swiglu_gate(i, F));
      element(i, gv * W + k);
    }
  }
  void scalar(int64_t i) { element(i, lm::swiglu_gate(i, F)); }
};

// The rope kernel's body on the host: vectors of 4 pairs, in place.
struct RopeHost {
  std::vector<float>& x;
  const std::vector<float>& cs;
  const std::vector<float>& sn;
  std::vector<int>& hits;
  lm::RopePairs r;
  float sign;
  static constexpr int64_t kPairs = 4;
  void pair(int64_t xo, int64_t to) {
    lm::rope_rotate(x[xo], x[xo + r.half], cs[to], sign * sn[to]);
    ++hits[xo], ++hits[xo + r.half];
  }
  void vector(int64_t v) {
    int64_t xo = 0, to = 0;
    lm::rope_pair(r, v * kPairs, xo, to);
    for (int64_t k = 0; k < kPairs; ++k) {
      int64_t xk = 0, tk = 0;
      lm::rope_pair(r, v * kPairs + k, xk, tk);
      REQUIRE(xk == xo + k);  // the kernel loads kPairs consecutive elements and table entries
      REQUIRE(tk == to + k);
      pair(xo + k, to + k);
    }
  }
  void scalar(int64_t p) {
    int64_t xo = 0, to = 0;
    lm::rope_pair(r, p, xo, to);
    pair(xo, to);
  }
};

}  // namespace

TEST_CASE("swiglu kernel loops, emulated on the host, write every element once with the contract's values",
          "[cuda][llama][host]") {
  struct Case {
    int64_t N, F, W;
    bool aligned;
  };
  for (const Case c : {Case{5, 16, 8, true}, Case{3, 13, 8, true}, Case{7, 12, 4, true}, Case{4, 24, 8, false},
                       Case{1, 1, 4, true}, Case{9, 40, 8, true}}) {
    INFO("N=" << c.N << " F=" << c.F << " W=" << c.W << " aligned=" << c.aligned);
    const int64_t n = c.N * c.F;
    const auto hd = test::random_vec(static_cast<size_t>(2 * n), -6, 6), dd = test::random_vec(static_cast<size_t>(n));
    std::vector<float> h(hd.begin(), hd.end()), dout(dd.begin(), dd.end()), out(n, NAN), dh(2 * n, NAN);
    std::vector<int> out_hits(n, 0), dh_hits(2 * n, 0);
    SwigluHost body{h, dout, out, dh, out_hits, dh_hits, c.F, c.W};
    emulate(math::vec_split(n, static_cast<int>(c.W), c.F % c.W == 0 && c.aligned), n, body);
    for (int k : out_hits) REQUIRE(k == 1);
    for (int k : dh_hits) REQUIRE(k == 1);
    std::vector<double> rout(n), rdh(2 * n);
    for (int64_t r = 0; r < c.N; ++r)
      for (int64_t f = 0; f < c.F; ++f) {
        const double g = h[r * 2 * c.F + f], u = h[r * 2 * c.F + c.F + f], d = dout[r * c.F + f];
        const double s = 1.0 / (1.0 + std::exp(-g));
        rout[r * c.F + f] = g * s * u;
        rdh[r * 2 * c.F + f] = d * u * s * (1.0 + g * (1.0 - s));
        rdh[r * 2 * c.F + c.F + f] = d * g * s;
      }
    CHECK(max_rel(out, rout) < 1e-6);
    CHECK(max_rel(dh, rdh) < 1e-6);
  }
}

TEST_CASE("rope kernel loop, emulated on the host, rotates each q/k pair once and leaves the value heads",
          "[cuda][llama][host]") {
  struct Case {
    int64_t B, T, NH, NKV, HD;
  };
  for (const Case c : {Case{2, 5, 4, 2, 16}, Case{1, 3, 3, 3, 6}, Case{2, 3, 4, 1, 8}, Case{1, 7, 2, 2, 128}}) {
    INFO("B=" << c.B << " T=" << c.T << " NH=" << c.NH << " NKV=" << c.NKV << " HD=" << c.HD);
    const int64_t half = c.HD / 2, heads = c.NH + c.NKV, row = (c.NH + 2 * c.NKV) * c.HD;
    const lm::RopePairs r{half, heads, c.T, row};
    std::vector<float> cs, sn;
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = t * std::pow(10000.0, -2.0 * i / c.HD);
        cs.push_back(static_cast<float>(std::cos(a))), sn.push_back(static_cast<float>(std::sin(a)));
      }
    const auto xd = test::random_vec(static_cast<size_t>(c.B * c.T * row), -2, 2);
    const std::vector<float> x0(xd.begin(), xd.end());
    const int64_t n = c.B * c.T * heads * half;
    for (const float sign : {1.0f, -1.0f}) {
      std::vector<float> x = x0;
      std::vector<int> hits(x.size(), 0);
      RopeHost body{x, cs, sn, hits, r, sign};
      emulate(math::vec_split(n, RopeHost::kPairs, half % RopeHost::kPairs == 0), n, body);
      std::vector<double> want(x0.begin(), x0.end());
      for (int64_t tok = 0; tok < c.B * c.T; ++tok)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const int64_t o = tok * row + h * c.HD + i, tb = (tok % c.T) * half + i;
            const double a = x0[o], z = x0[o + half], co = cs[tb], si = sign * sn[tb];
            want[o] = a * co - z * si;
            want[o + half] = z * co + a * si;
          }
      for (int64_t tok = 0; tok < c.B * c.T; ++tok)
        for (int64_t k = 0; k < row; ++k) {
          const int64_t o = tok * row + k;
          REQUIRE(hits[o] == (k < heads * c.HD ? 1 : 0));
          if (k >= heads * c.HD) REQUIRE(x[o] == x0[o]);  // value heads: the same bits
        }
      CHECK(max_rel(x, want) < 1e-6);
    }
  }
}
