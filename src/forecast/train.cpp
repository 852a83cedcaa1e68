// Training the forecaster (forecast/lstm.h): seeded mini-batches over shuffled windows, Adam with
// the gradient norm clipped, the held-out windows scored after every epoch, early stop after
// `patience` epochs without a better held-out loss, and the best epoch's weights restored.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "triax/core/error.h"
#include "triax/forecast/lstm.h"

namespace triax::forecast {
namespace {

void validate(const TrainOptions& o, const Windows& train, const Windows& holdout) {
  if (o.max_epochs <= 0) TRIAX_THROW(ConfigError, "--epochs {} must be positive", o.max_epochs);
  if (o.batch <= 0) TRIAX_THROW(ConfigError, "--batch {} must be positive", o.batch);
  if (!(o.lr > 0 && std::isfinite(o.lr))) TRIAX_THROW(ConfigError, "--lr {} must be positive and finite", o.lr);
  if (o.patience <= 0) TRIAX_THROW(ConfigError, "--patience {} must be positive", o.patience);
  if (!(o.clip >= 0 && std::isfinite(o.clip))) TRIAX_THROW(ConfigError, "gradient clip {} must be >= 0", o.clip);
  if (train.count <= 0)
    TRIAX_THROW(ConfigError, "no training windows: every node needs more than {} hours before the held-out day",
                kWindowHours);
  if (holdout.count <= 0) TRIAX_THROW(ConfigError, "no held-out windows: the history has no final day to hold out");
}

// Windows [idx...] gathered into one batch: x (B, 24, 4) and y (B).
void gather(const Windows& w, std::span<const int64_t> idx, std::vector<float>& x, std::vector<float>& y) {
  const size_t per = static_cast<size_t>(kWindowHours) * kFeatures;
  x.resize(idx.size() * per);
  y.resize(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const auto i = static_cast<size_t>(idx[k]);
    std::copy_n(w.x.begin() + static_cast<std::ptrdiff_t>(i * per), per, x.begin() + static_cast<std::ptrdiff_t>(k * per));
    y[k] = w.y[i];
  }
}

// Mean squared error (standardised units) over every window, in batches.
double mse(LstmRegressor& model, const Windows& w, int batch) {
  const auto p = predict_standardised(model, w, batch);
  double sum = 0;
  for (size_t k = 0; k < p.size(); ++k) sum += (p[k] - w.y[k]) * (p[k] - w.y[k]);
  return sum / static_cast<double>(w.count);
}

// One pass over the shuffled training windows; returns the mean batch loss weighted by size.
double epoch(LstmRegressor& model, const Windows& w, const TrainOptions& o, std::mt19937_64& gen, int64_t& step) {
  std::vector<int64_t> order(static_cast<size_t>(w.count));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<float> x, y;
  double sum = 0;
  for (int64_t b0 = 0; b0 < w.count; b0 += o.batch) {
    const int64_t n = std::min<int64_t>(o.batch, w.count - b0);
    gather(w, std::span<const int64_t>(order).subspan(static_cast<size_t>(b0), static_cast<size_t>(n)), x, y);
    model.zero_grad();
    model.forward(x, static_cast<int>(n), kWindowHours);
    sum += model.backward_mse(y) * static_cast<double>(n);
    const double norm = model.grad_norm();
    if (!std::isfinite(norm)) TRIAX_THROW(ConfigError, "the gradient became {} at step {}: lower --lr", norm, step + 1);
    const double scale = o.clip > 0 && norm > o.clip ? o.clip / norm : 1.0;
    model.adam_step(o.lr, ++step, scale);
  }
  return sum / static_cast<double>(w.count);
}

}  // namespace

TrainResult train_lstm(LstmRegressor& model, const Windows& train, const Windows& holdout, const TrainOptions& opt,
                       const std::function<void(const EpochStats&)>& on_epoch) {
  validate(opt, train, holdout);
  model.init(opt.seed);
  std::mt19937_64 gen(opt.seed ^ 0x9e3779b97f4a7c15ULL);
  TrainResult r;
  r.best_holdout_mse = mse(model, holdout, 256);
  std::vector<std::vector<double>> best;
  for (const auto& p : model.params()) best.push_back(model.get(p.name));
  int64_t step = 0;
  for (int e = 1; e <= opt.max_epochs; ++e) {
    EpochStats s;
    s.epoch = e;
    s.train_mse = epoch(model, train, opt, gen, step);
    s.holdout_mse = mse(model, holdout, 256);
    r.epochs.push_back(s);
    r.epochs_run = e;
    if (on_epoch) on_epoch(s);
    if (s.holdout_mse < r.best_holdout_mse) {
      r.best_holdout_mse = s.holdout_mse;
      r.best_epoch = e;
      for (size_t i = 0; i < best.size(); ++i) best[i] = model.get(model.params()[i].name);
    } else if (e - r.best_epoch >= opt.patience) {
      break;
    }
  }
  for (size_t i = 0; i < best.size(); ++i) model.set(model.params()[i].name, best[i]);
  return r;
}

std::vector<double> predict_standardised(LstmRegressor& model, const Windows& w, int batch) {
  if (batch <= 0) TRIAX_THROW(ConfigError, "prediction batch {} must be positive", batch);
  std::vector<double> out;
  out.reserve(static_cast<size_t>(w.count));
  const size_t per = static_cast<size_t>(kWindowHours) * kFeatures;
  for (int64_t b0 = 0; b0 < w.count; b0 += batch) {
    const int64_t n = std::min<int64_t>(batch, w.count - b0);
    const auto p = model.forward(std::span<const float>(w.x).subspan(static_cast<size_t>(b0) * per, static_cast<size_t>(n) * per),
                                 static_cast<int>(n), kWindowHours);
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

std::vector<double> predict_utilisation(LstmRegressor& model, const Scaler& scaler, const Windows& w, int batch) {
  auto out = predict_standardised(model, w, batch);
  for (double& z : out) z = scaler.target_from_standard(z);
  return out;
}

}  // namespace triax::forecast
