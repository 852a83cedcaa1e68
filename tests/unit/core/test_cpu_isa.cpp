// The AVX2 copies of the dispatched loops (core/cpu_isa.h) against the baseline x86-64 copies:
// bit-identical outputs for AdamW, GELU, SwiGLU and RoPE forward/backward, attention (multi-head
// and grouped-query) and the cross-entropy backward, at sizes with vector remainders and above the threading thresholds. Skipped parts
// (reported) where the CPU has no AVX2; the override itself is always tested.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "triax/core/cpu_isa.h"
#include "triax/core/error.h"
#include "triax/ops/attention.h"
#include "triax/ops/gelu.h"
#include "triax/ops/rope.h"
#include "triax/ops/softmax_xent.h"
#include "triax/ops/swiglu.h"
#include "triax/ops/adamw.h"
#include "unit/ops_testing.h"

using namespace triax;
using namespace triax::test;

namespace {

std::vector<float> floats(size_t n, double lo, double hi) {
  auto d = random_vec(n, lo, hi);
  return std::vector<float>(d.begin(), d.end());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs f under the baseline copies, then under the AVX2 ones; restores the process's choice.
template <class F>
void both(F&& f) {
  const CpuIsa before = set_cpu_isa(CpuIsa::baseline);
  f(CpuIsa::baseline);
  set_cpu_isa(CpuIsa::avx2);
  f(CpuIsa::avx2);
  set_cpu_isa(before);
}

}  // namespace

TEST_CASE("set_cpu_isa switches the dispatched copies and refuses what the CPU lacks") {
  const CpuIsa before = cpu_isa();
  CHECK(set_cpu_isa(CpuIsa::baseline) == before);
  CHECK(cpu_isa() == CpuIsa::baseline);
  if (cpu_supports_avx2()) {
    CHECK(set_cpu_isa(CpuIsa::avx2) == CpuIsa::baseline);
    CHECK(cpu_isa() == CpuIsa::avx2);
  } else {
    CHECK_THROWS_AS(set_cpu_isa(CpuIsa::avx2), ConfigError);
  }
  set_cpu_isa(before);
  CHECK(cpu_isa_name(CpuIsa::avx2) == "avx2");
}

TEST_CASE("AVX2 and baseline copies give identical bits") {
  if (!cpu_supports_avx2()) {
    WARN("this CPU has no AVX2: only the baseline copies exist here");
    return;
  }
  SECTION("adamw_update") {
    for (size_t n : {size_t{1}, size_t{13}, size_t{1000}, (size_t{1} << 18) + 37}) {  // the last one threaded
      const auto p0 = floats(n, -1, 1), g = floats(n, -3, 3), m0 = floats(n, -0.1, 0.1), v0 = floats(n, 0, 0.01);
      std::vector<float> out[2][3];
      both([&](CpuIsa isa) {
        auto p = p0, m = m0, v = v0;
        for (int64_t t = 1; t <= 3; ++t)
          adamw_update(std::span<float>(p), std::span<const float>(g), std::span<float>(m), std::span<float>(v),
                       AdamWConfig{}, 0.1f, AdamWStep{1e-3f, t, 0.7f});
        out[int(isa)][0] = p, out[int(isa)][1] = m, out[int(isa)][2] = v;
      });
      INFO("n = " << n);
      for (int k = 0; k < 3; ++k) CHECK(same_bits(out[0][k], out[1][k]));
      CHECK_FALSE(same_bits(out[0][0], p0));  // the update did move the parameters
    }
  }
  SECTION("gelu forward and backward") {
    for (size_t n : {size_t{7}, size_t{1001}, size_t{100003}}) {  // the last one threaded
      const auto x = floats(n, -8, 8), d = floats(n, -1, 1);
      std::vector<float> y[2], dx[2];
      both([&](CpuIsa isa) {
        y[int(isa)].assign(n, 0.0f), dx[int(isa)].assign(n, 0.0f);
        ops::gelu_forward(y[int(isa)].data(), x.data(), int64_t(n));
        ops::gelu_backward(dx[int(isa)].data(), x.data(), d.data(), int64_t(n));
      });
      INFO("n = " << n);
      CHECK(same_bits(y[0], y[1]));
      CHECK(same_bits(dx[0], dx[1]));
    }
  }
  SECTION("attention forward and backward") {
    const int B = 2, T = 77, C = 24, NH = 3;  // rows of 1..77 keys: every vector remainder
    const auto qkv = floats(size_t(B) * T * 3 * C, -2, 2), dout = floats(size_t(B) * T * C, -1, 1);
    std::vector<float> out[2], lse[2], dqkv[2];
    both([&](CpuIsa isa) {
      const int i = int(isa);
      out[i].assign(size_t(B) * T * C, 0.0f), lse[i].assign(size_t(B) * NH * T, 0.0f);
      dqkv[i].assign(qkv.size(), 0.0f);
      ops::attention_forward(out[i].data(), lse[i].data(), qkv.data(), B, T, C, NH);
      ops::attention_backward(dqkv[i].data(), dout.data(), qkv.data(), lse[i].data(), B, T, C, NH);
    });
    CHECK(same_bits(out[0], out[1]));
    CHECK(same_bits(lse[0], lse[1]));
    CHECK(same_bits(dqkv[0], dqkv[1]));
  }
  SECTION("swiglu forward and backward") {
    for (auto [N, F] : {std::pair{3, 13}, std::pair{300, 301}}) {  // a vector remainder; the second threaded
      const auto h = floats(size_t(N) * 2 * F, -100, 100), d = floats(size_t(N) * F, -1, 1);
      std::vector<float> y[2], dh[2];
      both([&](CpuIsa isa) {
        y[int(isa)].assign(size_t(N) * F, 0.0f), dh[int(isa)].assign(h.size(), 0.0f);
        ops::swiglu_forward(y[int(isa)].data(), h.data(), N, F);
        ops::swiglu_backward(dh[int(isa)].data(), d.data(), h.data(), N, F);
      });
      INFO("N = " << N << " F = " << F);
      CHECK(same_bits(y[0], y[1]));
      CHECK(same_bits(dh[0], dh[1]));
    }
  }
  SECTION("rope forward and backward, grouped-query attention") {
    const int B = 2, T = 77, NH = 6, NKV = 2, HD = 10, C = NH * HD, W = C + 2 * NKV * HD;  // HD/2 = 5: remainders
    const auto qkv0 = floats(size_t(B) * T * W, -2, 2), dout = floats(size_t(B) * T * C, -1, 1);
    const auto ang = floats(size_t(T) * HD / 2, 0, 6.28);
    std::vector<float> cs(ang.size()), sn(ang.size());
    for (size_t i = 0; i < ang.size(); ++i) cs[i] = std::cos(ang[i]), sn[i] = std::sin(ang[i]);
    std::vector<float> q[2], out[2], lse[2], dqkv[2];
    both([&](CpuIsa isa) {
      const int i = int(isa);
      q[i] = qkv0, out[i].assign(size_t(B) * T * C, 0.0f), lse[i].assign(size_t(B) * NH * T, 0.0f);
      dqkv[i].assign(qkv0.size(), 0.0f);
      ops::rope_forward(q[i].data(), cs.data(), sn.data(), B, T, NH, NKV, HD);
      ops::attention_forward(out[i].data(), lse[i].data(), q[i].data(), B, T, C, NH, NKV);
      ops::attention_backward(dqkv[i].data(), dout.data(), q[i].data(), lse[i].data(), B, T, C, NH, NKV);
      ops::rope_backward(dqkv[i].data(), cs.data(), sn.data(), B, T, NH, NKV, HD);
    });
    CHECK(same_bits(q[0], q[1]));
    CHECK_FALSE(same_bits(q[0], qkv0));  // the rotation did move q and k
    CHECK(same_bits(out[0], out[1]));
    CHECK(same_bits(lse[0], lse[1]));
    CHECK(same_bits(dqkv[0], dqkv[1]));
  }
  SECTION("softmax cross-entropy backward") {
    const int N = 9, V = 203, valid = 197;  // padding columns and a vector remainder
    const auto logits = floats(size_t(N) * V, -5, 5);
    const auto targets = random_ints(N, 0, valid);
    std::vector<float> losses(N), lse(N), dl[2];
    ops::softmax_xent_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V, valid);
    both([&](CpuIsa isa) {
      dl[int(isa)].assign(logits.size(), 0.0f);
      ops::softmax_xent_backward(dl[int(isa)].data(), logits.data(), lse.data(), targets.data(), 1.0f / N, N, V, valid);
    });
    CHECK(same_bits(dl[0], dl[1]));
  }
}
