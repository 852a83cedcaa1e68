// ops/shared_math.h, the arithmetic the CPU ops and the CUDA kernels share: each function against
// an independent formula in double, the float functions bit for bit against the CPU ops that call
// them (baseline and AVX2 copies), and a host emulation of the kernels' vector/tail index split on
// odd sizes and misaligned data.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "triax/core/cpu_isa.h"
#include "triax/ops/adamw.h"
#include "triax/ops/gelu.h"
#include "triax/ops/shared_math.h"
#include "triax/ops/softmax_xent.h"
#include "triax/ops/vec_math.h"
#include "unit/ops_testing.h"

using namespace triax;
using namespace triax::test;
namespace math = triax::ops::math;

namespace {

// The ISAs this CPU can run the CPU ops' copies with.
std::vector<CpuIsa> isas() {
  std::vector<CpuIsa> v{CpuIsa::baseline};
  if (cpu_supports_avx2()) v.push_back(CpuIsa::avx2);
  return v;
}

// Index of the first element whose bits differ, or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return static_cast<int64_t>(i);
  return -1;
}

double rel_err(double got, double want) { return std::fabs(got - want) / std::max(1e-300, std::fabs(want)); }

}  // namespace

TEST_CASE("shared GELU in double matches the formula and its derivative") {
  const double c = std::sqrt(2.0 / M_PI);
  for (double x : random_vec(2000, -8.0, 8.0)) {
    const double u = c * (x + 0.044715 * x * x * x);
    const double want = 0.5 * x * (1.0 + std::tanh(u));
    const double sech2 = 1.0 / (std::cosh(u) * std::cosh(u));
    const double want_grad = 0.5 * (1.0 + std::tanh(u)) + 0.5 * x * sech2 * c * (1.0 + 3.0 * 0.044715 * x * x);
    const double t = std::tanh(math::gelu_tanh_arg(x));
    REQUIRE(std::fabs(math::gelu_from_tanh(x, t) - want) <= 1e-15 * (1.0 + std::fabs(want)));
    REQUIRE(std::fabs(math::gelu_grad_from_tanh(x, t) - want_grad) <= 1e-14 * (1.0 + std::fabs(want_grad)));
    // and the derivative is the derivative of the forward (central difference)
    const double h = 1e-5;
    auto f = [](double z) { return math::gelu_from_tanh(z, std::tanh(math::gelu_tanh_arg(z))); };
    REQUIRE(std::fabs((f(x + h) - f(x - h)) / (2 * h) - want_grad) <= 1e-8);
  }
}

TEST_CASE("shared GELU in float is the CPU op, bit for bit") {
  const size_t n = 4099;  // not a multiple of any SIMD width
  auto x = cast<float>(random_vec(n, -9.0, 9.0));
  auto dout = cast<float>(random_vec(n, -2.0, 2.0));
  std::vector<float> want(n), want_grad(n);
  for (size_t i = 0; i < n; ++i) {
    const float t = ops::vtanh(math::gelu_tanh_arg(x[i]));
    want[i] = math::gelu_from_tanh(x[i], t);
    want_grad[i] = math::gelu_grad_from_tanh(x[i], t) * dout[i];
  }
  const CpuIsa before = cpu_isa();
  for (CpuIsa isa : isas()) {
    set_cpu_isa(isa);
    std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN()), dx(n, std::numeric_limits<float>::quiet_NaN());
    ops::gelu_forward<float>(y.data(), x.data(), static_cast<int64_t>(n));
    ops::gelu_backward<float>(dx.data(), x.data(), dout.data(), static_cast<int64_t>(n));
    INFO("isa " << cpu_isa_name(isa));
    CHECK(first_bit_difference(y, want) == -1);
    CHECK(first_bit_difference(dx, want_grad) == -1);
  }
  set_cpu_isa(before);
}

TEST_CASE("shared AdamW element matches the update written out in double") {
  const AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  for (int64_t t : {int64_t{1}, int64_t{2}, int64_t{10}, int64_t{1000}}) {
    const float lr = 3e-4f, wd = 0.1f, gs = 0.5f;
    const auto k = math::adamw_coeffs<double>(cfg.beta1, cfg.beta2, cfg.eps, lr, wd, gs, t);
    const double b1 = cfg.beta1, b2 = cfg.beta2;
    REQUIRE(k.bc1 == 1.0 - std::pow(b1, static_cast<double>(t)));
    REQUIRE(k.bc2 == 1.0 - std::pow(b2, static_cast<double>(t)));
    const auto p = random_vec(200, -1.0, 1.0), g = random_vec(200, -3.0, 3.0), m0 = random_vec(200, -0.1, 0.1),
               v0 = random_vec(200, 0.001, 0.1);
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * gs;
      const double m = b1 * m0[i] + (1.0 - b1) * gi, v = b2 * v0[i] + (1.0 - b2) * gi * gi;
      const double mhat = m / (1.0 - std::pow(b1, double(t))), vhat = v / (1.0 - std::pow(b2, double(t)));
      const double want = p[i] - double(lr) * (mhat / (std::sqrt(vhat) + double(cfg.eps)) + double(wd) * p[i]);
      double mi = m0[i], vi = v0[i];
      const double got = math::adamw_element(p[i], g[i], mi, vi, k);
      REQUIRE(rel_err(mi, m) < 1e-14);
      REQUIRE(rel_err(vi, v) < 1e-14);
      REQUIRE(rel_err(got, want) < 1e-14);
    }
  }
}

TEST_CASE("shared AdamW element in float is the CPU adamw_update, bit for bit") {
  const size_t n = 1037;
  const AdamWConfig cfg{0.9f, 0.95f, 1e-8f, 0.1f};
  const auto p0 = cast<float>(random_vec(n, -1.0, 1.0)), g = cast<float>(random_vec(n, -3.0, 3.0));
  const CpuIsa before = cpu_isa();
  for (CpuIsa isa : isas()) {
    set_cpu_isa(isa);
    std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
    std::vector<float> wp = p0, wm(n, 0.0f), wv(n, 0.0f);
    for (int64_t t = 1; t <= 3; ++t) {
      const AdamWStep step{1e-3f * static_cast<float>(t), t, t == 2 ? 0.25f : 1.0f};
      const float wd = t == 3 ? 0.0f : cfg.weight_decay;
      adamw_update(std::span<float>(p), std::span<const float>(g), std::span<float>(m), std::span<float>(v), cfg, wd,
                   step);
      const auto k = math::adamw_coeffs<float>(cfg.beta1, cfg.beta2, cfg.eps, step.lr, wd, step.grad_scale, t);
      for (size_t i = 0; i < n; ++i) wp[i] = math::adamw_element(wp[i], g[i], wm[i], wv[i], k);
    }
    INFO("isa " << cpu_isa_name(isa));
    CHECK(first_bit_difference(p, wp) == -1);
    CHECK(first_bit_difference(m, wm) == -1);
    CHECK(first_bit_difference(v, wv) == -1);
  }
  set_cpu_isa(before);
}

TEST_CASE("shared cross-entropy pieces match softmax in double") {
  const int V = 300, target = 123;
  const auto x = random_vec(V, -10.0, 10.0);
  double mx = -INFINITY;
  for (double e : x) mx = std::max(mx, e);
  double se = 0;
  for (double e : x) se += std::exp(e - mx);
  // independent: log of the plain sum (no shift: the values are small enough)
  double plain = 0;
  for (double e : x) plain += std::exp(e);
  const double lse = math::xent_lse(mx, se);
  REQUIRE(rel_err(lse, std::log(plain)) < 1e-14);
  REQUIRE(rel_err(math::xent_loss(lse, x[target]), -std::log(std::exp(x[target]) / plain)) < 1e-12);
  const double dloss = 0.25;
  for (int j = 0; j < V; ++j) {
    const double softmax = std::exp(x[j]) / plain;
    const double want = dloss * (softmax - (j == target ? 1.0 : 0.0));
    const double got = math::xent_dlogit(std::exp(x[j] - lse), j == target, dloss);
    REQUIRE(std::fabs(got - want) <= 1e-15);
  }
  REQUIRE(math::xent_target_valid(0, 5));
  REQUIRE(math::xent_target_valid(4, 5));
  REQUIRE_FALSE(math::xent_target_valid(5, 5));
  REQUIRE_FALSE(math::xent_target_valid(-1, 5));
}

TEST_CASE("shared cross-entropy pieces in float are the CPU op's, bit for bit") {
  const int N = 7, V = 1001, valid = 997;  // padded columns past valid
  const auto logits = cast<float>(random_vec(size_t(N) * V, -8.0, 8.0));
  std::vector<int32_t> targets(N);
  for (int i = 0; i < N; ++i) targets[i] = (i * 331 + 5) % valid;
  const CpuIsa before = cpu_isa();
  for (CpuIsa isa : isas()) {
    set_cpu_isa(isa);
    INFO("isa " << cpu_isa_name(isa));
    // loss from the shard statistics
    std::vector<float> mx(N), se(N), tl(N), loss(N), lse(N);
    ops::xent_shard_max(mx.data(), logits.data(), N, V, 0, valid);
    ops::xent_shard_sumexp(se.data(), logits.data(), mx.data(), N, V, 0, valid);
    ops::xent_shard_target_logit(tl.data(), logits.data(), targets.data(), N, V, 0, valid);
    ops::xent_loss_from_stats(loss.data(), lse.data(), mx.data(), se.data(), tl.data(), N);
    std::vector<float> want_lse(N), want_loss(N);
    for (int i = 0; i < N; ++i) {
      want_lse[i] = math::xent_lse(mx[i], se[i]);
      want_loss[i] = math::xent_loss(want_lse[i], tl[i]);
    }
    CHECK(first_bit_difference(lse, want_lse) == -1);
    CHECK(first_bit_difference(loss, want_loss) == -1);
    // the gradient from the forward's lse: softmax part with vexp, one-hot part at the target
    std::vector<float> flse(N), floss(N), d(size_t(N) * V, std::numeric_limits<float>::quiet_NaN());
    ops::softmax_xent_forward(floss.data(), flse.data(), logits.data(), targets.data(), N, V, valid);
    const float dloss = 1.0f / N;
    ops::softmax_xent_backward(d.data(), logits.data(), flse.data(), targets.data(), dloss, N, V, valid);
    std::vector<float> want_d(d.size());
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < V; ++j)
        want_d[size_t(i) * V + j] =
            j < valid ? math::xent_dlogit(ops::vexp(logits[size_t(i) * V + j] - flse[i]), j == targets[i], dloss)
                      : 0.0f;
    CHECK(first_bit_difference(d, want_d) == -1);
  }
  set_cpu_isa(before);
}

namespace {

// Records which elements a split's loops touch, as the kernels' bodies would access them.
struct RecordingBody {
  int width;
  std::vector<int>* hits;
  int64_t* vector_calls;
  void vector(int64_t v) {
    ++*vector_calls;
    for (int k = 0; k < width; ++k) ++(*hits)[static_cast<size_t>(v * width + k)];
  }
  void scalar(int64_t i) { ++(*hits)[static_cast<size_t>(i)]; }
};

// The host emulation of an element-wise kernel: GELU over the split, vectors of `width`
// elements then the tail, threads 0..stride-1 each taking its grid-stride share.
struct GeluBody {
  int width;
  const float* x;
  float* y;
  void vector(int64_t v) {
    for (int k = 0; k < width; ++k) scalar(v * width + k);
  }
  void scalar(int64_t i) { y[i] = math::gelu_from_tanh(x[i], ops::vtanh(math::gelu_tanh_arg(x[i]))); }
};

}  // namespace

TEST_CASE("vector split: every element exactly once, vectors only when aligned, any thread count") {
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 255, 1023, 1025, 4099}) {
    for (int width : {4, 8}) {
      for (bool aligned : {true, false}) {
        const auto s = math::vec_split(n, width, aligned);
        INFO("n " << n << " width " << width << " aligned " << aligned);
        REQUIRE(s.tail_begin == s.nvec * width);
        REQUIRE(s.tail_begin <= n);
        REQUIRE(n - s.tail_begin < (aligned ? width : n + 1));
        if (!aligned) REQUIRE(s.nvec == 0);
        for (int64_t stride : {1, 3, 32, 256, 5000}) {
          std::vector<int> hits(static_cast<size_t>(n), 0);
          int64_t vector_calls = 0;
          for (int64_t first = 0; first < stride; ++first) {
            RecordingBody body{width, &hits, &vector_calls};
            math::for_each_split(s, n, first, stride, body);
          }
          INFO("stride " << stride);
          REQUIRE(vector_calls == s.nvec);
          for (int64_t i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)] == 1);
        }
      }
    }
  }
}

TEST_CASE("vector split: an emulated GELU kernel gives the CPU op's bits on odd sizes") {
  for (int64_t n : {1, 9, 17, 1001, 4103}) {
    const auto x = cast<float>(random_vec(static_cast<size_t>(n), -6.0, 6.0));
    std::vector<float> want(static_cast<size_t>(n));
    ops::gelu_forward<float>(want.data(), x.data(), n);
    for (bool aligned : {true, false}) {
      std::vector<float> y(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
      const auto s = math::vec_split(n, 4, aligned);  // 16-byte vectors of float
      for (int64_t first = 0; first < 96; ++first) {
        GeluBody body{4, x.data(), y.data()};
        math::for_each_split(s, n, first, 96, body);
      }
      INFO("n " << n << " aligned " << aligned);
      CHECK(first_bit_difference(y, want) == -1);
    }
  }
}
