// The forecaster's model: LSTM(hidden) -> Dense(1) on the Backend ops (the input projection of all
// steps as one GEMM, the recurrent GEMM and the fused cell per step, backpropagation through time
// in reverse), trained with Adam on the mean squared error. Parameters carry PyTorch's names and
// layouts (nn.LSTM gate order i, f, g, o; nn.Linear), so the saved file loads into
// torch.nn.LSTM + torch.nn.Linear. docs/CLUSTER.md "Predictive scheduling".
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/forecast/history.h"

namespace triax::forecast {

struct LstmShape {
  int input = kFeatures;
  int hidden = 64;
};

class LstmRegressor {
 public:
  struct Param {
    std::string name;  // lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0, dense.weight, dense.bias
    std::vector<int64_t> shape;
    Tensor value, grad, m, v;
  };

  // Parameters in the backend's compute type (f32, or f64 for the gradient check); ConfigError
  // for another type or a non-positive size. Weights start at zero until init() or set().
  LstmRegressor(Backend& be, LstmShape shape = {});
  ~LstmRegressor();
  LstmRegressor(const LstmRegressor&) = delete;
  LstmRegressor& operator=(const LstmRegressor&) = delete;

  const LstmShape& shape() const { return shape_; }
  // PyTorch's initialisation: every LSTM weight and bias uniform in [-1/sqrt(H), 1/sqrt(H)], and
  // nn.Linear's weight and bias in [-1/sqrt(H), 1/sqrt(H)], from a seeded generator.
  void init(uint64_t seed);
  std::vector<Param>& params() { return params_; }
  const std::vector<Param>& params() const { return params_; }
  // Host copies by name (ConfigError for an unknown name or a wrong size).
  std::vector<double> get(const std::string& name) const;
  void set(const std::string& name, std::span<const double> values);

  // x: (B, T, input) on the host, window by window; returns the B outputs (standardised units)
  // and keeps what backward() needs.
  std::vector<double> forward(std::span<const float> x, int B, int T);
  // Mean squared error of the last forward() against y (B) and its gradient, accumulated into the
  // parameter gradients (+=) by backpropagation through time.
  double backward_mse(std::span<const float> y);
  void zero_grad();
  // The L2 norm of all parameter gradients.
  double grad_norm();
  // One Adam step (no weight decay), gradients multiplied by grad_scale first (clipping).
  void adam_step(double lr, int64_t t, double grad_scale, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8);

 private:
  Param& param(const std::string& name);
  const Param& param(const std::string& name) const;
  Backend& be_;
  LstmShape shape_;
  std::vector<Param> params_;
  struct Saved;  // activations of the last forward
  std::unique_ptr<Saved> saved_;
};

struct TrainOptions {
  int max_epochs = 300;
  int batch = 32;
  double lr = 3e-3;
  int patience = 30;      // epochs without a better held-out loss before stopping
  double clip = 1.0;      // gradient norm clip (0: none)
  uint64_t seed = 1;      // initialisation and the order of the mini-batches
};

struct EpochStats {
  int epoch = 0;
  double train_mse = 0;    // mean over the epoch's windows (standardised units)
  double holdout_mse = 0;  // on the held-out windows after the epoch
};

struct TrainResult {
  int epochs_run = 0;
  int best_epoch = 0;
  double best_holdout_mse = 0;
  std::vector<EpochStats> epochs;
};

// Trains on `train`, stops early on `holdout` (patience), and leaves the model at its best
// epoch. ConfigError for empty windows or bad options. on_epoch (optional) sees each epoch.
TrainResult train_lstm(LstmRegressor& model, const Windows& train, const Windows& holdout, const TrainOptions& opt,
                       const std::function<void(const EpochStats&)>& on_epoch = {});

// The model's outputs for every window (standardised units), in batches of `batch`.
std::vector<double> predict_standardised(LstmRegressor& model, const Windows& w, int batch = 256);
// The same as compute utilisation (scaler.target_from_standard of each output).
std::vector<double> predict_utilisation(LstmRegressor& model, const Scaler& scaler, const Windows& w, int batch = 256);

// The scaler as the model file keeps it (float32): train with this one, and the saved model
// scores exactly as it did in training.
Scaler as_stored(const Scaler& s);

// The model file: safetensors with the parameters under PyTorch's names (f32), scaler.mean and
// scaler.std (4), and metadata (format, features, target, window, whatever `metadata` adds).
// Written atomically: a failure leaves an existing file as it was.
void save_model(const std::string& path, const LstmRegressor& model, const Scaler& scaler,
                const std::map<std::string, std::string>& metadata);

struct LoadedModel {
  std::unique_ptr<LstmRegressor> model;
  Scaler scaler;
  std::map<std::string, std::string> metadata;
};
// IoError (a malformed weight file, docs/ERRORS.md) naming the file and the tensor for a missing
// or extra tensor, a wrong shape (TensorFile::check_shape: with the expected one), a non-finite
// value or a scaler std <= 0, or features other than this build's; and for an unreadable file.
LoadedModel load_model(const std::string& path, Backend& be);

}  // namespace triax::forecast
