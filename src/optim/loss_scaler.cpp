// DynamicLossScaler: growth after a run of clean steps, backoff on overflow with hysteresis.
#include "triax/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "triax/core/error.h"

namespace triax {

void validate(const LossScalerConfig& c) {
  auto finite_pos = [](double x) { return std::isfinite(x) && x > 0; };
  if (!finite_pos(c.init_scale)) TRIAX_THROW(ConfigError, "loss scaler: init_scale = {} must be finite and > 0", c.init_scale);
  if (!(std::isfinite(c.growth_factor) && c.growth_factor > 1.0))
    TRIAX_THROW(ConfigError, "loss scaler: growth_factor = {} must be finite and > 1", c.growth_factor);
  if (!(std::isfinite(c.backoff_factor) && c.backoff_factor > 0.0 && c.backoff_factor < 1.0))
    TRIAX_THROW(ConfigError, "loss scaler: backoff_factor = {} must lie in (0, 1)", c.backoff_factor);
  if (c.growth_interval < 1)
    TRIAX_THROW(ConfigError, "loss scaler: growth_interval = {} must be >= 1", c.growth_interval);
  if (c.hysteresis < 1) TRIAX_THROW(ConfigError, "loss scaler: hysteresis = {} must be >= 1", c.hysteresis);
  if (!finite_pos(c.min_scale)) TRIAX_THROW(ConfigError, "loss scaler: min_scale = {} must be finite and > 0", c.min_scale);
  if (!finite_pos(c.max_scale)) TRIAX_THROW(ConfigError, "loss scaler: max_scale = {} must be finite and > 0", c.max_scale);
  if (!(c.min_scale <= c.init_scale && c.init_scale <= c.max_scale))
    TRIAX_THROW(ConfigError, "loss scaler: init_scale = {} must lie in [min_scale, max_scale] = [{}, {}]", c.init_scale,
                c.min_scale, c.max_scale);
}

DynamicLossScaler::DynamicLossScaler(const LossScalerConfig& cfg) : cfg_(cfg) {
  validate(cfg_);
  state_.scale = cfg_.init_scale;
  state_.clean_steps = 0;
  state_.hysteresis_left = cfg_.hysteresis;
}

bool DynamicLossScaler::update(bool found_nonfinite) {
  if (found_nonfinite) {
    ++skipped_;
    state_.clean_steps = 0;
    state_.hysteresis_left = std::max(0, state_.hysteresis_left - 1);
    if (state_.hysteresis_left == 0) state_.scale = std::max(cfg_.min_scale, state_.scale * cfg_.backoff_factor);
    return false;
  }
  if (++state_.clean_steps == cfg_.growth_interval) {
    state_.clean_steps = 0;
    state_.hysteresis_left = cfg_.hysteresis;
    state_.scale = std::min(cfg_.max_scale, state_.scale * cfg_.growth_factor);
  }
  return true;
}

void DynamicLossScaler::restore(const State& s) {
  if (!(std::isfinite(s.scale) && s.scale >= cfg_.min_scale && s.scale <= cfg_.max_scale))
    TRIAX_THROW(ConfigError, "loss scaler restore: scale {} is outside [min_scale, max_scale] = [{}, {}]", s.scale,
                cfg_.min_scale, cfg_.max_scale);
  if (s.clean_steps < 0 || s.clean_steps >= cfg_.growth_interval)
    TRIAX_THROW(ConfigError, "loss scaler restore: clean_steps {} is outside [0, growth_interval = {})", s.clean_steps,
                cfg_.growth_interval);
  if (s.hysteresis_left < 0 || s.hysteresis_left > cfg_.hysteresis)
    TRIAX_THROW(ConfigError, "loss scaler restore: hysteresis_left {} is outside [0, hysteresis = {}]", s.hysteresis_left,
                cfg_.hysteresis);
  state_ = s;
}

}  // namespace triax
