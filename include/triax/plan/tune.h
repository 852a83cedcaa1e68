// Recommendations from the current settings of a run: the planner prices the changes a performance
// engineer would try (micro-batch, gradient accumulation / global batch, recomputation, layout),
// each with step time, utilisation, cost and what limits it, and ranks them by tokens per second.
#pragma once
#include <string>
#include <vector>

#include "triax/plan/planner.h"

namespace triax::plan {

struct TuneOptions {
  double gpu_hour_price = 0;  // currency per GPU-hour; 0: cost shown in GPU-hours only
  LayoutRules rules;
};

struct TuneChoice {
  std::string change;   // what was changed, in words ("micro-batch 64 -> 16")
  Estimate estimate;
  std::string limit;    // what limits it: memory, bubble, exposed comm, optimizer or compute
  double speedup = 0;   // tokens/s against the current settings
  double gpu_hours_per_billion_tokens = 0;
  bool changes_batch = false;  // global batch differs: convergence changes too
};

struct TuneResult {
  TuneChoice current;
  std::vector<TuneChoice> options;  // fitting ones, best first; at most one per kind of change
  std::vector<TuneChoice> rejected;  // proposals that do not fit in memory
};

// The limiting factor of an estimate, in words with its share of the step.
std::string limiting_factor(const Estimate& e);

// `current` must be a valid layout of `m` (its memory may not fit: that is reported as the limit).
TuneResult tune(const ModelShape& m, const CollectiveModel& net, const Layout& current, const TuneOptions& opt = {});

std::string format_tune(const TuneResult& r, const TuneOptions& opt = {});
std::string tune_json(const TuneResult& r, int indent = 2);

}  // namespace triax::plan
