// Dynamic loss scaling for fp16 mixed precision: the loss gradient is multiplied by scale() so
// small fp16 gradients do not flush to zero; a step whose gradients hold inf/NaN is skipped and
// the scale backs off, and after growth_interval clean steps in a row the scale grows. Pure host
// logic (the device only reports the all-reduced inf/NaN flag), so it is tested on the CPU.
// bf16 training needs none of this (bf16 has fp32's exponent range).
#pragma once
#include <cstdint>

namespace triax {

struct LossScalerConfig {
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;    // > 1
  double backoff_factor = 0.5;   // in (0, 1)
  int64_t growth_interval = 1000;  // clean steps in a row before the scale grows (>= 1)
  // Overflows tolerated before the scale backs off. A budget starts at hysteresis; each overflow
  // spends one and the scale backs off when the budget is 0. Only a growth refills it, so between
  // two growths the first hysteresis - 1 overflows keep the scale and every later one backs it
  // off at once. 1 = back off on every overflow. Every overflowing step is skipped regardless.
  int hysteresis = 1;
  double min_scale = 1.0;        // backoff stops here (> 0)
  double max_scale = 16777216.0;  // growth stops here (2^24)
};

// ConfigError naming the field unless every value is finite and in range (see the comments above)
// and min_scale <= init_scale <= max_scale.
void validate(const LossScalerConfig& cfg);

class DynamicLossScaler {
 public:
  // What a checkpoint keeps: the scale, the clean steps in a row since the last overflow or
  // growth, and the hysteresis budget left.
  struct State {
    double scale = 0;
    int64_t clean_steps = 0;
    int hysteresis_left = 0;
  };

  explicit DynamicLossScaler(const LossScalerConfig& cfg = {});

  // Multiply the loss gradient (dloss) by this.
  double scale() const { return state_.scale; }
  // Multiply the gradients by this before clipping and the optimizer (fold it into grad_scale).
  double inv_scale() const { return 1.0 / state_.scale; }

  // After backward, with found_nonfinite already agreed by every rank (all-reduced MAX over the
  // model-parallel and DP groups). Returns true when the step must be applied, false when it must
  // be skipped (exactly when found_nonfinite). Updates the scale for the next step.
  bool update(bool found_nonfinite);

  int64_t skipped_steps() const { return skipped_; }
  const State& state() const { return state_; }
  // ConfigError unless the state is reachable under the config (scale in [min, max], clean_steps
  // in [0, growth_interval), hysteresis_left in [0, hysteresis]).
  void restore(const State& s);
  const LossScalerConfig& config() const { return cfg_; }

 private:
  LossScalerConfig cfg_;
  State state_;
  int64_t skipped_ = 0;
};

}  // namespace triax
