// Layout search: enumerates every valid (tp, cp, pp, dp, vpp, micro-batch, schedule, recompute,
// sequence parallel, ZeRO level and HSDP shard size) for a GPU count, estimates each, and ranks those that fit in memory.
// The ones that lose are counted by the reason: invalid, memory, or the component that cost most.
#pragma once
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "triax/plan/cost_model.h"

namespace triax::plan {

// Candidate values per knob; an empty list means "every valid value". `base` supplies precision
// and the software options (overlap, dropout, attention kernel, ...).
struct SearchSpace {
  int gpus = 0;
  std::vector<int> tp, pp, dp, vpp, micro_batch;
  // Context-parallel sizes; empty: 1, 2, 4, 8, ... dividing the GPUs left after tp, wherever 2 cp
  // divides the sequence. base.cp_comm says how the K/V travel.
  std::vector<int> cp;
  std::vector<Schedule> schedules;  // empty: 1f1b, interleaved, zb-h1
  std::vector<Recompute> recompute;
  std::vector<bool> sequence_parallel;
  std::vector<bool> zero1;      // the old knob: false -> zero 0, true -> zero 1 (used when `zero` is empty)
  std::vector<int> zero;        // ZeRO levels; empty: 0..3 when dp > 1, else 0
  // HSDP shard group sizes tried with ZeRO-2/3 (0 = all of dp x cp); empty: 0, and the dp x cp ranks
  // of one node (gpus per node / tp) when that divides dp x cp and is smaller.
  std::vector<int> zero_shard;
  Layout base;
  LayoutRules rules;
  int top_k = 5;
};

// Why a fitting layout ranked below the best: the time component that grew most against it.
enum class LossReason { compute, bubble, tp_comm, cp_comm, pp_comm, dp_comm, optimizer };
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
  // Per ZeRO level (0..3): the layouts of that level that fit, and the one of them, fitting or not,
  // with the least memory per GPU; zero_explanation() reads them.
  std::array<long, 4> fitting_by_zero{};
  std::array<std::optional<Estimate>, 4> leanest_by_zero;
  // Layouts that fit without context parallelism (cp 1) and with it, and the cp-1 layout with the
  // least memory per GPU, fitting or not; cp_explanation() reads them.
  long fitting_without_cp = 0, fitting_with_cp = 0;
  std::optional<Estimate> leanest_without_cp;
};

// "only ZeRO-3 fits: the leanest layout below ZeRO-3 (...) needs 93.1 GiB per GPU of 80.0 GiB
// (parameters ..., gradients ..., optimizer ..., activations ...)" when the search found layouts
// that fit only at ZeRO-2 or -3 and looked at lower levels too; nullopt otherwise.
std::optional<std::string> zero_explanation(const SearchResult& r);
// "only CP fits: the leanest layout without context parallelism (...) needs 120.3 GiB per GPU of
// 80.0 GiB (parameters ..., activations ...)" when every layout that fits has cp > 1 and the search
// looked at cp 1 too; nullopt otherwise.
std::optional<std::string> cp_explanation(const SearchResult& r);

SearchResult search(const ModelShape& m, const CollectiveModel& net, const SearchSpace& space);

// Reason a fitting layout `e` lost against `best`.
LossReason loss_reason(const Estimate& e, const Estimate& best);

}  // namespace triax::plan
