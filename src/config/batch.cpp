// Batch-size arithmetic and ramp-up, with errors that show the numbers.
#include "triax/config/batch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "triax/core/checked_math.h"
#include "triax/core/error.h"

namespace triax {

int64_t BatchPlan::micro_batches_of(int d) const {
  return shares.empty() ? num_micro_batches : shares.at(static_cast<size_t>(d));
}

int64_t BatchPlan::first_micro_batch_of(int d) const {
  if (shares.empty()) return static_cast<int64_t>(d) * num_micro_batches;
  int64_t first = 0;
  for (int j = 0; j < d; ++j) first += shares.at(static_cast<size_t>(j));
  return first;
}

std::string BatchPlan::describe() const {
  if (!shares.empty())
    return fmt::format("global batch {} = micro-batch {} x micro-batches [{}] over dp {}", global_batch, micro_batch,
                       fmt::join(shares, ", "), dp);
  return fmt::format("global batch {} = micro-batch {} x dp {} x micro-batches {}", global_batch, micro_batch, dp,
                     num_micro_batches);
}

BatchPlan resolve_batch(const BatchConfig& c, int dp) {
  if (dp < 1) TRIAX_THROW(ConfigError, "data-parallel size {} must be >= 1", dp);
  if (c.global_batch < 0) TRIAX_THROW(ConfigError, "global batch size {} must be >= 1 (or 0 to derive it)", c.global_batch);
  if (c.micro_batch < 0) TRIAX_THROW(ConfigError, "micro-batch size {} must be >= 1 (or 0 to derive it)", c.micro_batch);
  if (c.num_micro_batches < 0)
    TRIAX_THROW(ConfigError, "number of micro-batches {} must be >= 1 (or 0 to derive it)", c.num_micro_batches);
  const bool g = c.global_batch > 0, mb = c.micro_batch > 0, n = c.num_micro_batches > 0;
  const int64_t d = dp;
  BatchPlan p{c.global_batch, c.micro_batch, c.num_micro_batches, dp};
  if (g && mb && n) {
    const int64_t prod = checked_product("micro-batch x dp x micro-batches", {c.micro_batch, d, c.num_micro_batches});
    if (prod != c.global_batch)
      TRIAX_THROW(ConfigError, "global batch {} != micro-batch {} x dp {} x micro-batches {} = {}", c.global_batch,
                  c.micro_batch, dp, c.num_micro_batches, prod);
  } else if (g && mb) {
    const int64_t per = checked_product("micro-batch x dp", {c.micro_batch, d});
    if (c.global_batch % per != 0)
      TRIAX_THROW(ConfigError, "global batch {} is not divisible by micro-batch {} x dp {} = {} ({} = {} x {} + {})",
                  c.global_batch, c.micro_batch, dp, per, c.global_batch, c.global_batch / per, per,
                  c.global_batch % per);
    p.num_micro_batches = c.global_batch / per;
  } else if (g && n) {
    const int64_t per = checked_product("dp x micro-batches", {d, c.num_micro_batches});
    if (c.global_batch % per != 0)
      TRIAX_THROW(ConfigError, "global batch {} is not divisible by dp {} x micro-batches {} = {} ({} = {} x {} + {})",
                  c.global_batch, dp, c.num_micro_batches, per, c.global_batch, c.global_batch / per, per,
                  c.global_batch % per);
    p.micro_batch = c.global_batch / per;
  } else if (mb) {
    if (!n) p.num_micro_batches = 1;
    p.global_batch = checked_product("global batch: micro-batch x dp x micro-batches", {c.micro_batch, d, p.num_micro_batches});
  } else {
    TRIAX_THROW(ConfigError,
                "batch sizes: give the micro-batch size, or two of global batch, micro-batch size and number of "
                "micro-batches (got global batch {}, micro-batch {}, micro-batches {}; 0 = not given)",
                c.global_batch, c.micro_batch, c.num_micro_batches);
  }
  return p;
}

BatchPlan resolve_batch_shares(int64_t global_batch, int64_t micro_batch, const std::vector<int64_t>& shares, int dp) {
  if (static_cast<int>(shares.size()) != dp)
    TRIAX_THROW(ConfigError, "--dp-microbatches [{}] gives {} counts for dp {} replicas", fmt::join(shares, ", "),
                shares.size(), dp);
  int64_t sum = 0;
  for (int64_t s : shares) {
    if (s < 1) TRIAX_THROW(ConfigError, "--dp-microbatches [{}]: every replica runs >= 1 micro-batch (got {})",
                           fmt::join(shares, ", "), s);
    sum = checked_sum<int64_t>("--dp-microbatches (micro-batches per step)", sum, s);
  }
  BatchPlan p{global_batch, micro_batch, *std::max_element(shares.begin(), shares.end()), dp, shares};
  if (micro_batch == 0 && global_batch > 0) {
    if (global_batch % sum != 0)
      TRIAX_THROW(ConfigError, "global batch {} is not divisible by the {} micro-batches of --dp-microbatches [{}] "
                  "({} = {} x {} + {})", global_batch, sum, fmt::join(shares, ", "), global_batch, global_batch / sum,
                  sum, global_batch % sum);
    p.micro_batch = global_batch / sum;
  }
  if (p.micro_batch == 0) p.micro_batch = 4;
  const int64_t g = checked_product("global batch: micro-batch x micro-batches of --dp-microbatches", {p.micro_batch, sum});
  if (global_batch > 0 && global_batch != g)
    TRIAX_THROW(ConfigError, "global batch {} != micro-batch {} x the {} micro-batches of --dp-microbatches [{}] = {}",
                global_batch, p.micro_batch, sum, fmt::join(shares, ", "), g);
  p.global_batch = g;
  return p;
}

BatchSchedule::BatchSchedule(const BatchPlan& target, std::optional<BatchRampup> rampup)
    : target_(target), rampup_(rampup) {
  const int64_t per = target.micro_batch * target.dp;
  if (!target.shares.empty()) {
    if (rampup_)
      TRIAX_THROW(ConfigError, "a batch ramp-up (--rampup-batch-size) cannot be combined with uneven data-parallel "
                  "shares ({})", target.describe());
    if (target.micro_batch < 1 || target.global_batch != target.micro_batch * target.first_micro_batch_of(target.dp))
      TRIAX_THROW(ConfigError, "batch schedule: inconsistent target plan ({}); build it with resolve_batch_shares",
                  target.describe());
    return;
  }
  if (per < 1 || target.num_micro_batches < 1 || target.global_batch != per * target.num_micro_batches)
    TRIAX_THROW(ConfigError, "batch schedule: inconsistent target plan ({}); build it with resolve_batch",
                target.describe());
  if (!rampup_) return;
  const auto& r = *rampup_;
  if (r.start < 1 || r.start > target.global_batch)
    TRIAX_THROW(ConfigError, "batch ramp-up start {} must lie in [1, global batch {}]", r.start, target.global_batch);
  if (r.increment < 1) TRIAX_THROW(ConfigError, "batch ramp-up increment {} must be >= 1", r.increment);
  if (r.samples < 0) TRIAX_THROW(ConfigError, "batch ramp-up samples {} must be >= 0", r.samples);
  const int64_t diff = target.global_batch - r.start;
  if (diff % r.increment != 0)
    TRIAX_THROW(ConfigError,
                "batch ramp-up: global batch {} - start {} = {} is not a multiple of the increment {} ({} = {} x {} + {})",
                target.global_batch, r.start, diff, r.increment, diff, diff / r.increment, r.increment,
                diff % r.increment);
  increments_ = diff / r.increment;
  for (int64_t k = 0; k <= increments_; ++k) {
    const int64_t gb = r.start + k * r.increment;
    if (gb % per != 0)
      TRIAX_THROW(ConfigError,
                  "batch ramp-up step {} of {}: global batch {} (= start {} + {} x increment {}) is not divisible by "
                  "micro-batch {} x dp {} = {}",
                  k, increments_, gb, r.start, k, r.increment, target.micro_batch, target.dp, per);
  }
}

int64_t BatchSchedule::global_batch(int64_t consumed) const {
  if (consumed < 0) TRIAX_THROW(ConfigError, "consumed samples {} must be >= 0", consumed);
  if (!rampup_ || increments_ == 0 || consumed >= rampup_->samples) return target_.global_batch;
  // Increment k is reached after k x samples / increments consumed samples (integer arithmetic:
  // k = floor(consumed x increments / samples), exact, no floating-point boundary surprises).
  const int64_t k = static_cast<int64_t>((static_cast<__int128>(consumed) * increments_) / rampup_->samples);
  return rampup_->start + std::min(k, increments_) * rampup_->increment;
}

int64_t BatchSchedule::num_micro_batches(int64_t consumed) const {
  if (!target_.shares.empty()) return target_.num_micro_batches;  // no ramp-up with shares
  return global_batch(consumed) / (target_.micro_batch * target_.dp);
}

BatchPlan BatchSchedule::plan(int64_t consumed) const {
  BatchPlan p = target_;
  if (!p.shares.empty()) return p;
  p.global_batch = global_batch(consumed);
  p.num_micro_batches = p.global_batch / (p.micro_batch * p.dp);
  return p;
}

}  // namespace triax
