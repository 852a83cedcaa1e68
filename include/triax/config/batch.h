// Batch knobs: global batch = micro-batch size x dp x number of micro-batches (the micro-batches
// are the gradient-accumulation steps of one DP rank; a pipeline streams them through its stages).
// Any two determine the third; a batch-size ramp-up grows the global batch with consumed samples.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  int64_t num_micro_batches = 0;  // per DP replica; with uneven shares the most any replica runs
  int dp = 1;
  // Uneven data-parallel shares (--dp-microbatches, heterogeneous clusters): micro-batches of each
  // DP replica, dp entries summing to global_batch / micro_batch; empty: every replica runs
  // num_micro_batches.
  std::vector<int64_t> shares;
  // Micro-batches replica d runs, and the global index of its first micro-batch (replica d reads the
  // global batch's micro-batches [first, first + count), so the samples do not depend on the split).
  int64_t micro_batches_of(int d) const;
  int64_t first_micro_batch_of(int d) const;
  // Micro-batches of the whole global batch (global_batch / micro_batch).
  int64_t total_micro_batches() const { return micro_batch > 0 ? global_batch / micro_batch : 0; }
  // "global batch 32 = micro-batch 4 x dp 2 x micro-batches 4", or with shares
  // "global batch 32 = micro-batch 4 x micro-batches [6, 2] over dp 2"
  std::string describe() const;
};

// Uneven shares: global batch = micro-batch x the shares' sum. Throws ConfigError naming the
// shares when they are not dp counts >= 1, or when a given global batch or micro-batch size does
// not match (global 0 or micro 0 = derive it; both 0: micro-batch 4).
BatchPlan resolve_batch_shares(int64_t global_batch, int64_t micro_batch, const std::vector<int64_t>& shares, int dp);

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
