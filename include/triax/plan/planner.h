// Layout search: enumerates every valid (tp, pp, dp, vpp, micro-batch, schedule, recompute,
// sequence parallel, ZeRO-1) for a GPU count, estimates each, and ranks those that fit in memory.
// The ones that lose are counted by the reason: invalid, memory, or the component that cost most.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "triax/plan/cost_model.h"

namespace triax::plan {

// Candidate values per knob; an empty list means "every valid value". `base` supplies precision
// and the software options (overlap, dropout, attention kernel, ...).
struct SearchSpace {
  int gpus = 0;
  std::vector<int> tp, pp, dp, vpp, micro_batch;
  std::vector<Schedule> schedules;  // empty: 1f1b, interleaved, zb-h1
  std::vector<Recompute> recompute;
  std::vector<bool> sequence_parallel;
  std::vector<bool> zero1;
  Layout base;
  LayoutRules rules;
  int top_k = 5;
};

// Why a fitting layout ranked below the best: the time component that grew most against it.
enum class LossReason { compute, bubble, tp_comm, pp_comm, dp_comm, optimizer };
std::string_view to_string(LossReason r);

struct SearchResult {
  std::vector<Estimate> best;  // fitting layouts, fastest first, at most top_k
  long enumerated = 0;         // combinations looked at
  long invalid = 0;            // rejected by layout_problem
  long no_fit = 0;             // valid but over the memory capacity
  long ranked = 0;             // valid and fitting
  std::map<std::string, long> invalid_reasons;  // rule -> count
  std::map<LossReason, long> lost_by;            // fitting layouts outside the top k
  std::map<LossReason, Estimate> lost_example;   // the fastest layout that lost for each reason
  // The fastest layout that does not fit, for the "what would it take" line (if any).
  std::vector<Estimate> fastest_no_fit;
};

SearchResult search(const ModelShape& m, const CollectiveModel& net, const SearchSpace& space);

// Reason a fitting layout `e` lost against `best`.
LossReason loss_reason(const Estimate& e, const Estimate& best);

}  // namespace triax::plan
