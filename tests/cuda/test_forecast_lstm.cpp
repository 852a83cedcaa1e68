// The forecaster's LSTM (forecast/lstm.h) on the CUDA backend: the same model, seed and batch give
// the CPU backend's outputs, loss and gradients (float32, to GEMM rounding), a short training run
// reaches the CPU run's held-out loss, and the cell kernels in bf16/f16 agree with the emulated
// backend (the CPU ops on rounded copies). Without a GPU only the [nogpu] argument checks run.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "triax/backend/backend.h"
#include "triax/backend/emulated_backend.h"
#include "triax/cuda/cuda_backend.h"
#include "triax/cuda/lstm.h"
#include "triax/forecast/lstm.h"

using namespace triax;
using namespace triax::forecast;
using Catch::Matchers::Contains;

namespace {

std::vector<float> rnd(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(u(g));
  return v;
}

struct Step {
  std::vector<double> pred;
  double loss = 0, norm = 0;
  std::vector<std::vector<double>> grads;
};

Step one_step(Backend& be, std::span<const float> x, std::span<const float> y, int B) {
  LstmRegressor m(be);
  m.init(21);
  m.zero_grad();
  Step s;
  s.pred = m.forward(x, B, kWindowHours);
  s.loss = m.backward_mse(y);
  s.norm = m.grad_norm();
  for (const auto& p : m.params()) {
    std::vector<float> g = to_host_f32(be, p.grad);
    s.grads.emplace_back(g.begin(), g.end());
  }
  return s;
}

}  // namespace

TEST_CASE("cuda LSTM: forward, loss and every gradient match the cpu backend", "[cuda][forecast]") {
  auto gpu = cuda::make_cuda_backend({.device = 0, .compute = DType::f32});
  auto cpu = make_cpu_backend(DType::f32);
  const int B = 33;
  const auto x = rnd(static_cast<size_t>(B) * kWindowHours * kFeatures, 1, -2, 2);
  const auto y = rnd(B, 2);
  const auto g = one_step(*gpu, x, y, B), c = one_step(*cpu, x, y, B);
  for (int b = 0; b < B; ++b) CHECK(g.pred[b] == Approx(c.pred[b]).epsilon(1e-4).margin(1e-5));
  CHECK(g.loss == Approx(c.loss).epsilon(1e-4));
  CHECK(g.norm == Approx(c.norm).epsilon(1e-4));
  for (size_t p = 0; p < c.grads.size(); ++p) {
    double err = 0;
    for (size_t i = 0; i < c.grads[p].size(); ++i) err = std::max(err, std::fabs(g.grads[p][i] - c.grads[p][i]));
    INFO("parameter " << p << ": max abs gradient difference " << err << " (cpu grad norm " << c.norm << ")");
    CHECK(err <= 1e-4 * std::max(1.0, c.norm));
  }
}

TEST_CASE("cuda LSTM: a short training run reaches the cpu run's held-out loss", "[cuda][forecast]") {
  Windows train, hold;
  for (int k = 0; k < 160; ++k) {
    Windows& w = k < 128 ? train : hold;
    for (int t = 0; t <= kWindowHours; ++t) {
      const float v = static_cast<float>(std::sin(2 * M_PI * (k + t) / 24.0));
      if (t == kWindowHours) w.y.push_back(v);
      else
        for (int f = 0; f < kFeatures; ++f) w.x.push_back(v);
    }
    ++w.count;
  }
  TrainOptions o;
  o.max_epochs = 15;
  o.batch = 16;
  o.lr = 1e-2;
  auto gpu = cuda::make_cuda_backend({.device = 0, .compute = DType::f32});
  auto cpu = make_cpu_backend(DType::f32);
  LstmRegressor mg(*gpu), mc(*cpu);
  const auto rg = train_lstm(mg, train, hold, o), rc = train_lstm(mc, train, hold, o);
  CHECK(rg.best_holdout_mse < 0.05);
  CHECK(rg.best_holdout_mse == Approx(rc.best_holdout_mse).epsilon(0.2).margin(2e-3));
}

TEMPLATE_TEST_CASE("cuda lstm cell in half types matches the emulated backend", "[cuda][forecast]", bf16, f16) {
  const DType dt = dtype_of<TestType>();
  auto gpu = cuda::make_cuda_backend({.device = 0, .compute = dt});
  auto emu = make_emulated_backend(dt);
  const int B = 7, H = 64;
  const auto pre = rnd(static_cast<size_t>(B) * 4 * H, 3, -3, 3), cp = rnd(static_cast<size_t>(B) * H, 4);
  const auto dh = rnd(static_cast<size_t>(B) * H, 5), dc = rnd(static_cast<size_t>(B) * H, 6);
  auto run = [&](Backend& be) {
    auto up = [&](const std::vector<float>& v, Shape s) {
      Tensor t = be.empty(s, dt);
      from_host_f32(be, t, v);
      return t;
    };
    Tensor gates = up(pre, {B, 4 * H}), c_prev = up(cp, {B, H}), d_h = up(dh, {B, H}), d_c = up(dc, {B, H});
    Tensor h = be.empty({B, H}, dt), c = be.empty({B, H}, dt), dg = be.empty({B, 4 * H}, dt);
    be.lstm_cell_forward(h, c, gates, c_prev, B, H);
    be.lstm_cell_backward(dg, d_c, d_h, gates, c, c_prev, B, H);
    std::vector<std::vector<float>> out{to_host_f32(be, h), to_host_f32(be, c), to_host_f32(be, gates),
                                        to_host_f32(be, dg), to_host_f32(be, d_c)};
    return out;
  };
  const auto a = run(*gpu), b = run(*emu);
  const double tol = dt == DType::bf16 ? 2e-2 : 4e-3;
  for (size_t k = 0; k < a.size(); ++k)
    for (size_t i = 0; i < a[k].size(); ++i) {
      INFO("output " << k << " element " << i);
      REQUIRE(a[k][i] == Approx(b[k][i]).epsilon(tol).margin(tol));
    }
}

TEST_CASE("cuda lstm launchers reject bad arguments before touching the device", "[nogpu][cuda][forecast]") {
  float* p = nullptr;
  CHECK_THROWS_WITH(cuda::lstm_cell_forward<float>(p, p, p, p, 0, 4, nullptr), Contains("B"));
  float one = 0;
  CHECK_THROWS_WITH(cuda::lstm_cell_forward<float>(&one, &one, nullptr, &one, 1, 4, nullptr), Contains("gates"));
  CHECK_THROWS_WITH(cuda::lstm_cell_backward<float>(&one, &one, &one, &one, &one, nullptr, 1, 1, nullptr),
                    Contains("c_prev"));
}
