// Learning-rate schedule: warm-up, then cosine / linear decay or constant.
#include "triax/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "triax/core/error.h"

namespace triax {

LrSchedule::LrSchedule(const LrScheduleConfig& c) : cfg_(c) {
  if (!(std::isfinite(c.max_lr) && std::isfinite(c.min_lr) && c.min_lr >= 0.0 && c.min_lr <= c.max_lr))
    TRIAX_THROW(ConfigError, "learning rates must satisfy 0 <= min_lr ({}) <= max_lr ({})", c.min_lr, c.max_lr);
  if (c.warmup_iters < 0) TRIAX_THROW(ConfigError, "warm-up iterations {} must be >= 0", c.warmup_iters);
  if (c.decay != LrDecay::constant && c.decay_iters < c.warmup_iters)
    TRIAX_THROW(ConfigError,
                "{} decay ends at iteration {} (decay_iters) before the warm-up ends at iteration {}: "
                "decay_iters must be >= warmup_iters",
                lr_decay_name(c.decay), c.decay_iters, c.warmup_iters);
}

double LrSchedule::lr(int64_t it) const {
  const auto& c = cfg_;
  if (it < 0) TRIAX_THROW(ConfigError, "learning rate asked for negative iteration {}", it);
  if (it < c.warmup_iters) return c.max_lr * static_cast<double>(it + 1) / static_cast<double>(c.warmup_iters);
  if (c.decay == LrDecay::constant) return c.max_lr;
  if (it >= c.decay_iters) return c.min_lr;
  const double ratio =
      static_cast<double>(it - c.warmup_iters) / static_cast<double>(c.decay_iters - c.warmup_iters);
  if (c.decay == LrDecay::linear) return c.max_lr - (c.max_lr - c.min_lr) * ratio;
  return c.min_lr + (c.max_lr - c.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * ratio));
}

}  // namespace triax
