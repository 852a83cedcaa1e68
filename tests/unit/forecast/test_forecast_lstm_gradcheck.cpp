// The forecaster's LSTM on the Backend ops (forecast/lstm.h): the forward equals a scalar
// transcription of torch.nn.LSTM's equations; every gradient of every weight equals a central
// finite difference of the loss in float64 (all elements of a small model, a sample of each tensor
// of the 64-unit one); float32 agrees with float64; the checking backend gives the plain backend's
// bits; training lowers the held-out loss and keeps the best epoch; the model file round-trips
// and refuses a wrong shape, a missing, extra or non-finite tensor naming it.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "triax/backend/backend.h"
#include "triax/backend/emulated_backend.h"
#include "triax/forecast/lstm.h"
#include "triax/io/safetensors.h"

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

double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// torch.nn.LSTM (one layer, batch_first) + nn.Linear, written out per scalar.
std::vector<double> reference(const LstmRegressor& m, std::span<const float> x, int B, int T) {
  const int I = m.shape().input, H = m.shape().hidden;
  const auto wih = m.get("lstm.weight_ih_l0"), whh = m.get("lstm.weight_hh_l0");
  const auto bih = m.get("lstm.bias_ih_l0"), bhh = m.get("lstm.bias_hh_l0");
  const auto dw = m.get("dense.weight"), db = m.get("dense.bias");
  std::vector<double> out(B);
  for (int b = 0; b < B; ++b) {
    std::vector<double> h(H, 0.0), c(H, 0.0), g(4 * H);
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < 4 * H; ++r) {
        double s = bih[r] + bhh[r];
        for (int i = 0; i < I; ++i) s += wih[r * I + i] * x[(static_cast<size_t>(b) * T + t) * I + i];
        for (int j = 0; j < H; ++j) s += whh[r * H + j] * h[j];
        g[r] = s;
      }
      for (int j = 0; j < H; ++j) {
        const double ig = sigm(g[j]), fg = sigm(g[H + j]), gg = std::tanh(g[2 * H + j]), og = sigm(g[3 * H + j]);
        c[j] = fg * c[j] + ig * gg;
        h[j] = og * std::tanh(c[j]);
      }
    }
    double s = db[0];
    for (int j = 0; j < H; ++j) s += dw[j] * h[j];
    out[b] = s;
  }
  return out;
}

double loss(LstmRegressor& m, std::span<const float> x, std::span<const float> y, int B, int T) {
  const auto p = m.forward(x, B, T);
  double s = 0;
  for (int b = 0; b < B; ++b) s += (p[b] - y[b]) * (p[b] - y[b]);
  return s / B;
}

// Central differences of the loss for the chosen elements of every parameter vs backward's gradient.
void gradcheck(LstmShape shape, int B, int T, int samples_per_tensor) {
  auto be = make_cpu_backend(DType::f64);
  LstmRegressor m(*be, shape);
  m.init(7);
  const auto x = rnd(static_cast<size_t>(B) * T * shape.input, 1, -2, 2);
  const auto y = rnd(static_cast<size_t>(B), 2);
  m.zero_grad();
  m.forward(x, B, T);
  m.backward_mse(y);
  std::mt19937 pick(3);
  for (const auto& p : m.params()) {
    auto w = m.get(p.name);
    std::vector<double> grad(w.size());
    be->copy_to_host(grad.data(), p.grad, grad.size() * sizeof(double));
    std::vector<size_t> idx;
    if (samples_per_tensor <= 0 || static_cast<size_t>(samples_per_tensor) >= w.size()) {
      for (size_t i = 0; i < w.size(); ++i) idx.push_back(i);
    } else {
      std::uniform_int_distribution<size_t> u(0, w.size() - 1);
      for (int k = 0; k < samples_per_tensor; ++k) idx.push_back(u(pick));
    }
    double worst = 0;
    for (size_t i : idx) {
      const double keep = w[i], eps = 1e-6 * std::max(1.0, std::fabs(keep));
      w[i] = keep + eps;
      m.set(p.name, w);
      const double lp = loss(m, x, y, B, T);
      w[i] = keep - eps;
      m.set(p.name, w);
      const double lm = loss(m, x, y, B, T);
      w[i] = keep;
      m.set(p.name, w);
      const double fd = (lp - lm) / (2 * eps);
      const double err = std::fabs(fd - grad[i]) / std::max(1e-4, std::fabs(fd) + std::fabs(grad[i]));
      worst = std::max(worst, err);
      INFO(p.name << "[" << i << "]: finite difference " << fd << ", backward " << grad[i]);
      REQUIRE(err < 1e-5);
    }
    INFO(p.name << ": " << idx.size() << " elements, worst relative error " << worst);
    CHECK(worst < 1e-5);
  }
}

}  // namespace

TEST_CASE("LSTM forward equals torch.nn.LSTM's equations written per scalar", "[forecast][lstm]") {
  auto be = make_cpu_backend(DType::f64);
  LstmRegressor m(*be);
  m.init(11);
  const int B = 3, T = 24;
  const auto x = rnd(static_cast<size_t>(B) * T * kFeatures, 5, -2, 2);
  const auto got = m.forward(x, B, T);
  const auto want = reference(m, x, B, T);
  for (int b = 0; b < B; ++b) CHECK(got[b] == Approx(want[b]).epsilon(1e-12).margin(1e-13));
}

TEST_CASE("LSTM gradcheck: every element of every weight of a small model (fp64)", "[forecast][lstm][gradcheck]") {
  gradcheck(LstmShape{4, 6}, 3, 5, 0);
}

TEST_CASE("LSTM gradcheck: sampled elements of every weight at 64 units, 24 steps (fp64)", "[forecast][lstm][gradcheck]") {
  gradcheck(LstmShape{4, 64}, 4, 24, 48);
}

TEST_CASE("LSTM gradcheck fails on a wrong gradient: the check can fail", "[forecast][lstm][gradcheck]") {
  // A gradient halved after backward no longer matches the finite difference.
  auto be = make_cpu_backend(DType::f64);
  LstmRegressor m(*be, LstmShape{4, 3});
  m.init(1);
  const auto x = rnd(2 * 4 * 4, 1, -2, 2);
  const auto y = rnd(2, 2);
  m.zero_grad();
  m.forward(x, 2, 4);
  m.backward_mse(y);
  auto& p = m.params()[1];  // lstm.weight_hh_l0
  be->scale(p.grad, 0.5);
  std::vector<double> g(static_cast<size_t>(p.grad.numel()));
  be->copy_to_host(g.data(), p.grad, g.size() * sizeof(double));
  auto w = m.get(p.name);
  const double keep = w[0], eps = 1e-6;
  w[0] = keep + eps;
  m.set(p.name, w);
  const double lp = loss(m, x, y, 2, 4);
  w[0] = keep - eps;
  m.set(p.name, w);
  const double lm = loss(m, x, y, 2, 4);
  const double fd = (lp - lm) / (2 * eps);
  REQUIRE(std::fabs(fd) > 1e-6);
  CHECK(std::fabs(fd - g[0]) / (std::fabs(fd) + std::fabs(g[0])) > 0.1);
}

TEST_CASE("LSTM float32 agrees with float64, the checking backend bit for bit, bf16 emulated roughly",
          "[forecast][lstm]") {
  const int B = 5, T = 24;
  const auto x = rnd(static_cast<size_t>(B) * T * kFeatures, 9, -2, 2);
  const auto y = rnd(B, 10);
  auto run = [&](Backend& be) {
    LstmRegressor m(be);
    m.init(3);
    m.zero_grad();
    auto p = m.forward(x, B, T);
    p.push_back(m.backward_mse(y));
    p.push_back(m.grad_norm());
    return p;
  };
  auto f64 = make_cpu_backend(DType::f64);
  auto f32 = make_cpu_backend(DType::f32);
  auto checked = make_checked_cpu_backend(DType::f32);
  const auto a = run(*f64), b = run(*f32), c = run(*checked);
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(b[i] == Approx(a[i]).epsilon(1e-5).margin(1e-6));
    CHECK(c[i] == b[i]);
  }
}

TEST_CASE("LSTM cell ops refuse short buffers and non-positive sizes, naming them", "[forecast][lstm]") {
  auto be = make_cpu_backend(DType::f32);
  Tensor h = be->zeros({2, 3}, DType::f32), c = be->zeros({2, 3}, DType::f32);
  Tensor g = be->zeros({2, 11}, DType::f32);
  REQUIRE_THROWS_WITH(be->lstm_cell_forward(h, c, g, c, 2, 3), Contains("lstm_cell_forward") && Contains("gates"));
  REQUIRE_THROWS_WITH(be->lstm_cell_forward(h, c, g, c, 0, 3), Contains("must be positive"));
  Tensor g2 = be->zeros({2, 12}, DType::f32), dh = be->zeros({2, 2}, DType::f32);
  REQUIRE_THROWS_WITH(be->lstm_cell_backward(g2, c, dh, g2, c, c, 2, 3), Contains("lstm_cell_backward") && Contains("dh"));
}

namespace {

// Windows of a noisy daily sine: 24 standardised hours -> the next.
Windows sine_windows(int n, uint32_t seed, int offset) {
  Windows w;
  std::mt19937 g(seed);
  std::normal_distribution<double> noise(0.0, 0.05);
  for (int k = 0; k < n; ++k) {
    for (int t = 0; t <= kWindowHours; ++t) {
      const double v = std::sin(2 * M_PI * (k + t + offset) / 24.0) + noise(g);
      if (t == kWindowHours) {
        w.y.push_back(static_cast<float>(v));
        w.target.push_back(v);
      } else {
        for (int f = 0; f < kFeatures; ++f) w.x.push_back(static_cast<float>(f == 0 ? v : 0.5 * v));
      }
    }
    ++w.count;
  }
  return w;
}

}  // namespace

TEST_CASE("train_lstm lowers the held-out loss, stops early and keeps its best epoch", "[forecast][lstm]") {
  auto be = make_cpu_backend(DType::f32);
  LstmRegressor m(*be);
  const auto train = sine_windows(96, 1, 0), holdout = sine_windows(24, 2, 96);
  TrainOptions o;
  o.max_epochs = 40;
  o.patience = 5;
  o.batch = 16;
  o.lr = 1e-2;
  double first = -1;
  const auto r = train_lstm(m, train, holdout, o, [&](const EpochStats& s) {
    if (first < 0) first = s.holdout_mse;
  });
  REQUIRE(r.epochs_run >= 1);
  CHECK(r.best_holdout_mse < 0.2 * first);
  CHECK(r.best_holdout_mse < 0.05);
  // The model was left at the best epoch: scoring it again gives that epoch's loss.
  Scaler unit;
  unit.std = {1, 1, 1, 1};
  const auto p = predict_utilisation(m, unit, holdout, 7);
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i) s += (p[i] - holdout.y[i]) * (p[i] - holdout.y[i]);
  CHECK(s / p.size() == Approx(r.best_holdout_mse).epsilon(1e-5));
  // Same seed, same result.
  LstmRegressor m2(*be);
  const auto r2 = train_lstm(m2, train, holdout, o);
  CHECK(r2.best_holdout_mse == r.best_holdout_mse);
  CHECK(r2.epochs_run == r.epochs_run);
  o.batch = 0;
  REQUIRE_THROWS_WITH(train_lstm(m2, train, holdout, o), Contains("--batch"));
}

TEST_CASE("the model file round-trips and refuses a wrong one naming the tensor", "[forecast][lstm]") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("triax_fc_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto be = make_cpu_backend(DType::f32);
  LstmRegressor m(*be);
  m.init(5);
  Scaler s;
  s.mean = {0.5, 0.4, 3e-5, 2e4};
  s.std = {0.2, 0.1, 1e-5, 5e3};
  const auto path = (dir / "m.safetensors").string();
  save_model(path, m, s, {{"source", "unit test"}});
  const auto loaded = load_model(path, *be);
  CHECK(loaded.metadata.at("source") == "unit test");
  CHECK(loaded.metadata.at("format") == "triax-forecast-lstm-v1");
  CHECK(loaded.scaler.std[3] == Approx(5e3));
  const auto x = rnd(3 * 24 * 4, 4);
  CHECK(loaded.model->forward(x, 3, 24) == m.forward(x, 3, 24));

  auto write_variant = [&](const std::string& name, auto&& edit) {
    io::SafetensorsWriter w;
    for (const auto& p : m.params()) {
      auto v = m.get(p.name);
      std::vector<float> f(v.begin(), v.end());
      auto shape = p.shape;
      if (!edit(p.name, shape, f)) continue;
      w.add(p.name, shape, f);
    }
    w.add("scaler.mean", {4}, std::vector<float>{0, 0, 0, 0});
    w.add("scaler.std", {4}, std::vector<float>{1, 1, 1, 1});
    const auto out = (dir / name).string();
    w.write(out);
    return out;
  };
  const auto wrong = write_variant("wrong.safetensors", [](const std::string& n, std::vector<int64_t>& shape,
                                                           std::vector<float>& f) {
    if (n == "lstm.weight_ih_l0") {
      shape = {128, 4};
      f.resize(128 * 4);
    }
    return true;
  });
  REQUIRE_THROWS_WITH(load_model(wrong, *be), Contains("lstm.weight_ih_l0") && Contains("[128, 4]") && Contains("[256, 4]"));
  REQUIRE_THROWS_AS(load_model(wrong, *be), IoError);  // a malformed weight file: exit 3 (docs/ERRORS.md)
  const auto missing = write_variant("missing.safetensors", [](const std::string& n, auto&, auto&) {
    return n != "dense.bias";
  });
  REQUIRE_THROWS_WITH(load_model(missing, *be), Contains("missing tensor 'dense.bias'"));
  const auto nan = write_variant("nan.safetensors", [](const std::string& n, auto&, std::vector<float>& f) {
    if (n == "lstm.bias_hh_l0") f[3] = std::nanf("");
    return true;
  });
  REQUIRE_THROWS_WITH(load_model(nan, *be), Contains("lstm.bias_hh_l0") && Contains("element 3"));
  {
    io::SafetensorsWriter w;
    for (const auto& p : m.params()) {
      auto v = m.get(p.name);
      w.add(p.name, p.shape, std::vector<float>(v.begin(), v.end()));
    }
    w.add("scaler.mean", {4}, std::vector<float>{0, 0, 0, 0});
    w.add("scaler.std", {4}, std::vector<float>{1, 1, 1, 1});
    w.add("extra", {1}, std::vector<float>{1});
    w.write((dir / "extra.safetensors").string());
  }
  REQUIRE_THROWS_WITH(load_model((dir / "extra.safetensors").string(), *be), Contains("unexpected tensor 'extra'"));
  // A failed save (the directory is a file) leaves the existing model as it was.
  const auto before = fs::file_size(path);
  REQUIRE_THROWS(save_model((dir / "m.safetensors" / "x").string(), m, s, {}));
  CHECK(fs::file_size(path) == before);
  fs::remove_all(dir);
}
