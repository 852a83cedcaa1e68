// Learning-rate schedule by iteration: linear warm-up from 0 to max_lr, then a cosine or linear
// decay to min_lr that ends at decay_iters (constant at min_lr afterwards), or a constant max_lr.
#pragma once
#include <cstdint>
#include <string_view>

#include "triax/core/enum_names.h"
#include "triax/core/error.h"

namespace triax {

enum class LrDecay { constant, linear, cosine };
template <>
struct EnumNames<LrDecay> {
  static constexpr std::string_view what = "learning-rate decay";
  static constexpr std::array<EnumName<LrDecay>, 3> table{
      {{"cosine", LrDecay::cosine}, {"linear", LrDecay::linear}, {"constant", LrDecay::constant}}};
};

// "cosine" | "linear" | "constant"; ConfigError listing the choices otherwise.
inline LrDecay parse_lr_decay(std::string_view s) { return parse_enum<LrDecay>(s); }
inline std::string_view lr_decay_name(LrDecay d) { return enum_name(d); }

struct LrScheduleConfig {
  double max_lr = 3e-4;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  // Iteration at which the decay reaches min_lr, counted from 0 like warmup_iters (so the decay
  // phase is [warmup_iters, decay_iters)). Unused by LrDecay::constant.
  int64_t decay_iters = 0;
  LrDecay decay = LrDecay::cosine;
};

class LrSchedule {
 public:
  // Throws ConfigError unless 0 <= min_lr <= max_lr (finite), warmup_iters >= 0 and, for a
  // decaying schedule, decay_iters >= warmup_iters.
  explicit LrSchedule(const LrScheduleConfig& cfg);

  // Learning rate of the step with 0-based index `iteration`:
  //   iteration < warmup:        max_lr * (iteration + 1) / warmup   (the first step is not wasted at 0)
  //   warmup <= it < decay_iters: ratio = (it - warmup) / (decay_iters - warmup)
  //       cosine: min + (max - min) * 0.5 * (1 + cos(pi * ratio));  linear: max - (max - min) * ratio
  //   it >= decay_iters:         min_lr
  //   constant: max_lr after the warm-up.
  double lr(int64_t iteration) const;
  const LrScheduleConfig& config() const { return cfg_; }

 private:
  LrScheduleConfig cfg_;
};

}  // namespace triax
