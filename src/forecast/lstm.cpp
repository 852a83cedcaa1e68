// The forecaster's LSTM on the Backend ops (forecast/lstm.h). Forward: the input projection of
// every step in one GEMM (X W_ih^T + b_ih over T*B rows), then per step the recurrent GEMM
// (h W_hh^T + b_hh) added to its rows and the fused cell; the dense head reads the last h.
// Backward walks the steps in reverse: the cell's backward gives the pre-activation gradients and
// the recurrent GEMM's backward dh of the step before; at the end one GEMM over all steps each
// accumulates dW_hh, db_hh and dW_ih, db_ih. Every buffer lives on the backend; the host
// sees only the inputs, targets and the B outputs.
#include "triax/forecast/lstm.h"

#include <cmath>
#include <random>

#include "triax/core/error.h"

namespace triax::forecast {

struct LstmRegressor::Saved {
  int B = 0, T = 0;
  Tensor x;      // (T*B, I) time-major
  Tensor gates;  // (T*B, 4H) activated
  Tensor h;      // ((T+1)*B, H): block 0 is h_0 = 0
  Tensor c;      // ((T+1)*B, H): block 0 is c_0 = 0
  Tensor tmp;    // (B, 4H) the recurrent GEMM's output
  Tensor pred;   // (B, 1)
  // The backward's buffers, made with the forward's for the same (B, T).
  Tensor dpred;   // (B, 1)
  Tensor dh, dc;  // (B, H)
  Tensor dgates;  // (T*B, 4H)
  Tensor acc;     // (1) f64: the sum of squared errors
};

namespace {

std::vector<double> read_back(Backend& be, const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::f64) {
    be.copy_to_host(out.data(), t, out.size() * sizeof(double));
  } else {
    const auto f = to_host_f32(be, t);
    for (size_t i = 0; i < f.size(); ++i) out[i] = f[i];
  }
  return out;
}

void upload(Backend& be, const Tensor& t, std::span<const double> v) {
  if (t.dtype() == DType::f64) {
    be.copy_from_host(t, v.data(), v.size() * sizeof(double));
  } else {
    std::vector<float> f(v.begin(), v.end());
    from_host_f32(be, t, f);
  }
}

}  // namespace

LstmRegressor::LstmRegressor(Backend& be, LstmShape shape) : be_(be), shape_(shape), saved_(std::make_unique<Saved>()) {
  const DType dt = be.compute_dtype();
  if (dt != DType::f32 && dt != DType::f64)
    TRIAX_THROW(ConfigError, "the forecaster's LSTM computes in float32 or float64, not {} (backend {})",
                dtype_name(dt), be.name());
  if (shape.input <= 0 || shape.hidden <= 0)
    TRIAX_THROW(ConfigError, "LSTM input {} and hidden {} must be positive", shape.input, shape.hidden);
  const int64_t I = shape.input, H = shape.hidden;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> specs{
      {"lstm.weight_ih_l0", {4 * H, I}}, {"lstm.weight_hh_l0", {4 * H, H}}, {"lstm.bias_ih_l0", {4 * H}},
      {"lstm.bias_hh_l0", {4 * H}},      {"dense.weight", {1, H}},          {"dense.bias", {1}}};
  for (const auto& [name, dims] : specs) {
    const Shape s{std::span<const int64_t>(dims)};
    params_.push_back({name, dims, be.zeros(s, dt), be.zeros(s, dt), be.zeros(s, dt), be.zeros(s, dt)});
  }
}

LstmRegressor::~LstmRegressor() = default;

void LstmRegressor::init(uint64_t seed) {
  std::mt19937_64 gen(seed);
  const double k = 1.0 / std::sqrt(static_cast<double>(shape_.hidden));
  std::uniform_real_distribution<double> u(-k, k);
  for (auto& p : params_) {
    std::vector<double> v(static_cast<size_t>(p.value.numel()));
    for (auto& e : v) e = u(gen);
    upload(be_, p.value, v);
    be_.fill(p.m, 0.0);
    be_.fill(p.v, 0.0);
  }
}

LstmRegressor::Param& LstmRegressor::param(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  TRIAX_THROW(ConfigError, "the LSTM has no parameter '{}'", name);
}
const LstmRegressor::Param& LstmRegressor::param(const std::string& name) const {
  return const_cast<LstmRegressor*>(this)->param(name);
}

std::vector<double> LstmRegressor::get(const std::string& name) const { return read_back(be_, param(name).value); }

void LstmRegressor::set(const std::string& name, std::span<const double> values) {
  auto& p = param(name);
  if (static_cast<int64_t>(values.size()) != p.value.numel())
    TRIAX_THROW(ConfigError, "{}: {} values for {} elements", name, values.size(), p.value.numel());
  upload(be_, p.value, values);
}

std::vector<double> LstmRegressor::forward(std::span<const float> x, int B, int T) {
  const int I = shape_.input, H = shape_.hidden;
  if (B <= 0 || T <= 0) TRIAX_THROW(ConfigError, "LSTM forward: B={} and T={} must be positive", B, T);
  if (x.size() != static_cast<size_t>(B) * T * I)
    TRIAX_THROW(ConfigError, "LSTM forward: {} inputs for B={} x T={} x {} features", x.size(), B, T, I);
  auto& s = *saved_;
  const DType dt = be_.compute_dtype();
  if (s.B != B || s.T != T) {
    s.x = be_.empty({int64_t{T} * B, I}, dt);
    s.gates = be_.empty({int64_t{T} * B, 4 * int64_t{H}}, dt);
    s.h = be_.zeros({int64_t{T + 1} * B, H}, dt);
    s.c = be_.zeros({int64_t{T + 1} * B, H}, dt);
    s.tmp = be_.empty({B, 4 * int64_t{H}}, dt);
    s.pred = be_.empty({B, 1}, dt);
    s.dpred = be_.empty({B, 1}, dt);
    s.dh = be_.empty({B, H}, dt);
    s.dc = be_.empty({B, H}, dt);
    s.dgates = be_.empty({int64_t{T} * B, 4 * int64_t{H}}, dt);
    s.acc = be_.empty({1}, DType::f64);
    s.B = B;
    s.T = T;
  }
  // Window-major (B, T, I) on the host to time-major (T, B, I): one step's rows are contiguous.
  std::vector<double> xt(x.size());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < I; ++i)
        xt[(static_cast<size_t>(t) * B + b) * I + i] = x[(static_cast<size_t>(b) * T + t) * I + i];
  upload(be_, s.x, xt);
  const auto& w_ih = param("lstm.weight_ih_l0").value;
  const auto& w_hh = param("lstm.weight_hh_l0").value;
  be_.linear_forward(s.gates, s.x, w_ih, param("lstm.bias_ih_l0").value, T * B, I, 4 * H);
  const auto& b_hh = param("lstm.bias_hh_l0").value;
  for (int t = 0; t < T; ++t) {
    const Tensor g = s.gates.slice(int64_t{t} * B, int64_t{t + 1} * B);
    be_.linear_forward(s.tmp, s.h.slice(int64_t{t} * B, int64_t{t + 1} * B), w_hh, b_hh, B, H, 4 * H);
    be_.residual(g, g, s.tmp);
    be_.lstm_cell_forward(s.h.slice(int64_t{t + 1} * B, int64_t{t + 2} * B),
                          s.c.slice(int64_t{t + 1} * B, int64_t{t + 2} * B), g,
                          s.c.slice(int64_t{t} * B, int64_t{t + 1} * B), B, H);
  }
  be_.linear_forward(s.pred, s.h.slice(int64_t{T} * B, int64_t{T + 1} * B), param("dense.weight").value,
                     param("dense.bias").value, B, H, 1);
  return read_back(be_, s.pred);
}

double LstmRegressor::backward_mse(std::span<const float> y) {
  auto& s = *saved_;
  const int B = s.B, T = s.T, I = shape_.input, H = shape_.hidden;
  if (B == 0) TRIAX_THROW(ConfigError, "LSTM backward before a forward");
  if (y.size() != static_cast<size_t>(B))
    TRIAX_THROW(ConfigError, "LSTM backward: {} targets for a batch of {}", y.size(), B);
  // dpred = 2 (pred - y) / B; loss = sum (pred - y)^2 / B.
  const Tensor &dpred = s.dpred, &dh = s.dh, &dc = s.dc, &dgates = s.dgates;
  upload(be_, dpred, std::vector<double>(y.begin(), y.end()));
  be_.scale(dpred, -1.0);
  be_.axpy(dpred, 1.0, s.pred);
  be_.fill(s.acc, 0.0);
  be_.sum_squares_into(s.acc, 0, dpred);
  double sq = 0;
  be_.copy_to_host(&sq, s.acc, sizeof sq);
  be_.scale(dpred, 2.0 / B);
  be_.fill(dc, 0.0);  // nothing flows into c_T from after the last step
  be_.linear_backward(dh, param("dense.weight").grad, param("dense.bias").grad, dpred,
                      s.h.slice(int64_t{T} * B, int64_t{T + 1} * B), param("dense.weight").value, B, H, 1);
  auto& whh = param("lstm.weight_hh_l0");
  for (int t = T - 1; t >= 0; --t) {
    const Tensor dg = dgates.slice(int64_t{t} * B, int64_t{t + 1} * B);
    be_.lstm_cell_backward(dg, dc, dh, s.gates.slice(int64_t{t} * B, int64_t{t + 1} * B),
                           s.c.slice(int64_t{t + 1} * B, int64_t{t + 2} * B),
                           s.c.slice(int64_t{t} * B, int64_t{t + 1} * B), B, H);
    // dh of step t-1 (overwritten); h_0 is the constant zero state, its gradient unused.
    if (t > 0)
      be_.linear_backward(dh, Tensor(), Tensor(), dg, s.h.slice(int64_t{t} * B, int64_t{t + 1} * B), whh.value, B, H,
                          4 * H);
  }
  // The weight gradients of all steps at once (cuDNN does the same): dW_hh += dG^T [h_0 .. h_{T-1}],
  // dW_ih += dG^T X, the biases the column sums of dG.
  be_.linear_backward(Tensor(), whh.grad, param("lstm.bias_hh_l0").grad, dgates, s.h.slice(0, int64_t{T} * B),
                      whh.value, T * B, H, 4 * H);
  auto& wih = param("lstm.weight_ih_l0");
  be_.linear_backward(Tensor(), wih.grad, param("lstm.bias_ih_l0").grad, dgates, s.x, wih.value, T * B, I, 4 * H);
  return sq / B;
}

void LstmRegressor::zero_grad() {
  for (auto& p : params_) be_.fill(p.grad, 0.0);
}

double LstmRegressor::grad_norm() {
  Tensor acc = be_.zeros({static_cast<int64_t>(params_.size())}, DType::f64);
  for (size_t i = 0; i < params_.size(); ++i) be_.sum_squares_into(acc, static_cast<int64_t>(i), params_[i].grad);
  std::vector<double> parts(params_.size());
  be_.copy_to_host(parts.data(), acc, parts.size() * sizeof(double));
  double total = 0;
  for (double p : parts) total += p;
  return std::sqrt(total);
}

void LstmRegressor::adam_step(double lr, int64_t t, double grad_scale, double beta1, double beta2, double eps) {
  AdamWConfig cfg;
  cfg.beta1 = static_cast<float>(beta1);
  cfg.beta2 = static_cast<float>(beta2);
  cfg.eps = static_cast<float>(eps);
  cfg.weight_decay = 0.0f;
  AdamWStep step;
  step.lr = static_cast<float>(lr);
  step.t = t;
  step.grad_scale = static_cast<float>(grad_scale);
  for (auto& p : params_) be_.adamw(p.value, p.grad, p.m, p.v, cfg, 0.0f, step);
}

}  // namespace triax::forecast
