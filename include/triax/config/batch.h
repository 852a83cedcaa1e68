// Batch knobs: global batch = micro-batch size x dp x number of micro-batches (the micro-batches
// are the gradient-accumulation steps of one DP rank; a pipeline streams them through its stages).
// Any two determine the third; a batch-size ramp-up grows the global batch with consumed samples.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "triax/core/error.h"

namespace triax {

// 0 means "derive it". Negative values are errors.
struct BatchConfig {
  int64_t global_batch = 0;       // samples per optimizer step, over all DP ranks
  int64_t micro_batch = 0;        // samples per forward/backward of one DP rank
  int64_t num_micro_batches = 0;  // gradient-accumulation steps per optimizer step
};

struct BatchPlan {
  int64_t global_batch = 0;
  int64_t micro_batch = 0;
  int64_t num_micro_batches = 0;
  int dp = 1;
  // "global batch 32 = micro-batch 4 x dp 2 x micro-batches 4"
  std::string describe() const;
};

// Resolves the three knobs for a DP size. Any two give the third; micro-batch alone means one
// micro-batch (global = micro x dp, Megatron's default). Throws ConfigError with the arithmetic:
//   all three given and inconsistent: "global batch 32 != micro-batch 4 x dp 2 x micro-batches 3 = 24"
//   not divisible: "global batch 30 is not divisible by micro-batch 4 x dp 2 = 8 (30 = 3 x 8 + 6)"
//   too few given, a value < 0, dp < 1.
BatchPlan resolve_batch(const BatchConfig& cfg, int dp);

// Megatron's --rampup-batch-size <start> <increment> <samples>: the global batch starts at
// `start` and grows by `increment` at evenly spaced consumed-sample counts, reaching the target
// global batch once `samples` samples have been consumed.
struct BatchRampup {
  int64_t start = 0;
  int64_t increment = 0;
  int64_t samples = 0;
};

class BatchSchedule {
 public:
  // Checks the ramp: start in [1, target], increment >= 1 dividing (target - start), samples >= 0,
  // and that every global batch the ramp visits (start + k x increment) is divisible by
  // micro-batch x dp; ConfigError naming the failing ramp step otherwise.
  explicit BatchSchedule(const BatchPlan& target, std::optional<BatchRampup> rampup = std::nullopt);

  // Global batch for the step that starts after `consumed_samples` samples.
  int64_t global_batch(int64_t consumed_samples) const;
  // Micro-batches per DP rank for that step: global_batch / (micro_batch x dp).
  int64_t num_micro_batches(int64_t consumed_samples) const;
  // The plan for that step.
  BatchPlan plan(int64_t consumed_samples) const;
  const BatchPlan& target() const { return target_; }
  bool has_rampup() const { return rampup_.has_value(); }
  // Number of increments of the ramp (0 without one).
  int64_t num_increments() const { return increments_; }

 private:
  BatchPlan target_;
  std::optional<BatchRampup> rampup_;
  int64_t increments_ = 0;
};

}  // namespace triax
