// Exhaustive layout search over the knobs a SearchSpace leaves open.
#include "triax/plan/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "triax/core/error.h"

namespace triax::plan {

std::string_view to_string(LossReason r) {
  switch (r) {
    case LossReason::compute: return "compute";
    case LossReason::bubble: return "bubble";
    case LossReason::tp_comm: return "tp_comm";
    case LossReason::pp_comm: return "pp_comm";
    case LossReason::dp_comm: return "dp_comm";
    case LossReason::optimizer: return "optimizer";
  }
  return "?";
}

LossReason loss_reason(const Estimate& e, const Estimate& best) {
  const std::pair<LossReason, double> deltas[] = {
      {LossReason::compute, e.time.compute - best.time.compute},
      {LossReason::bubble, e.time.bubble - best.time.bubble},
      {LossReason::tp_comm, e.time.tp_comm - best.time.tp_comm},
      {LossReason::pp_comm, e.time.pp_comm - best.time.pp_comm},
      {LossReason::dp_comm, e.time.dp_comm - best.time.dp_comm},
      {LossReason::optimizer, e.time.optimizer - best.time.optimizer},
  };
  auto it = std::max_element(std::begin(deltas), std::end(deltas),
                             [](const auto& a, const auto& b) { return a.second < b.second; });
  return it->first;
}

namespace {

std::vector<int> divisors(long n) {
  std::vector<int> out;
  for (long k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(int(k));
  return out;
}

// "tp 3 does not divide heads 16" -> "tp N does not divide heads N": one bucket per rule.
std::string rule_of(const std::string& reason) {
  std::string out;
  bool in_number = false;
  for (char ch : reason) {
    if (std::isdigit(static_cast<unsigned char>(ch))) {
      if (!in_number) out += 'N';
      in_number = true;
    } else {
      in_number = false;
      out += ch;
    }
  }
  return out;
}

template <class T>
std::vector<T> or_default(const std::vector<T>& given, std::vector<T> all) {
  return given.empty() ? all : given;
}

// The schedules tried with pp stages: those asked for, else 1f1b, interleaved and ZB-H1.
std::vector<Schedule> schedules_for(const SearchSpace& sp, int pp) {
  std::vector<Schedule> schedules = sp.schedules;
  if (schedules.empty()) {
    schedules = {Schedule::one_f_one_b};
    // With one stage every schedule is the same computation; only rank 1f1b.
    if (pp > 1) schedules = {Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1};
  }
  return schedules;
}

// The chunk counts tried per stage: 1, or for the interleaved schedule those asked for, else every
// divisor > 1 of the layers per stage.
std::vector<int> vpps_for(const SearchSpace& sp, const ModelShape& m, int pp, Schedule sched) {
  std::vector<int> vpps = {1};
  if (sched == Schedule::interleaved) {
    vpps = sp.vpp;
    if (vpps.empty()) {
      for (int v : divisors(m.layers % pp == 0 ? m.layers / pp : 1))
        if (v > 1) vpps.push_back(v);
      if (vpps.empty()) vpps = {2};  // let layout_problem say why
    }
  }
  return vpps;
}

// Fastest first (equal time: less memory first): the best top_k layouts that fit, what the other
// fitting ones lost by, and the fastest layout that does not fit when it beats them all.
void rank_layouts(SearchResult& res, std::vector<Estimate>& fitting, std::vector<Estimate>& not_fitting, int top_k) {
  auto faster = [](const Estimate& a, const Estimate& b) {
    if (a.seconds_per_iteration != b.seconds_per_iteration) return a.seconds_per_iteration < b.seconds_per_iteration;
    return a.memory.total() < b.memory.total();  // equal time: less memory first
  };
  std::sort(fitting.begin(), fitting.end(), faster);
  std::sort(not_fitting.begin(), not_fitting.end(), faster);
  const size_t k = std::min<size_t>(top_k, fitting.size());
  res.best.assign(fitting.begin(), fitting.begin() + k);
  for (size_t i = k; i < fitting.size(); ++i) {
    const LossReason why = loss_reason(fitting[i], fitting[0]);
    if (res.lost_by[why]++ == 0) res.lost_example.emplace(why, fitting[i]);
  }
  if (!not_fitting.empty() && (fitting.empty() || faster(not_fitting[0], fitting[0])))
    res.fastest_no_fit.push_back(not_fitting[0]);
}

}  // namespace

SearchResult search(const ModelShape& m, const CollectiveModel& net, const SearchSpace& sp) {
  validate(m);
  if (sp.gpus < 1) TRIAX_THROW(ConfigError, "search needs a GPU count >= 1, got {}", sp.gpus);
  if (sp.top_k < 1) TRIAX_THROW(ConfigError, "search needs top_k >= 1, got {}", sp.top_k);
  const Cluster& c = net.cluster();
  if (sp.gpus > c.total_devices())
    TRIAX_THROW(ConfigError, "{} GPUs requested but cluster '{}' has {} ({} nodes x {})", sp.gpus, c.name,
                c.total_devices(), c.nodes, c.gpus_per_node);

  SearchResult res;
  std::vector<Estimate> fitting, not_fitting;
  auto reject = [&](const std::string& why) {
    ++res.enumerated;
    ++res.invalid;
    ++res.invalid_reasons[rule_of(why)];
  };

  for (int tp : or_default(sp.tp, divisors(sp.gpus))) {
    if (sp.gpus % tp != 0) {
      reject(fmt::format("tp {} does not divide the {} GPUs", tp, sp.gpus));
      continue;
    }
    for (int pp : or_default(sp.pp, divisors(sp.gpus / tp))) {
      if ((sp.gpus / tp) % pp != 0) {
        reject(fmt::format("tp*pp {} does not divide the {} GPUs", tp * pp, sp.gpus));
        continue;
      }
      const int dp = sp.gpus / (tp * pp);
      if (!sp.dp.empty() && std::find(sp.dp.begin(), sp.dp.end(), dp) == sp.dp.end()) continue;
      if (m.global_batch % dp != 0) {
        reject(fmt::format("dp {} does not divide global batch {}", dp, m.global_batch));
        continue;
      }
      const std::vector<Schedule> schedules = schedules_for(sp, pp);
      for (int mbs : or_default(sp.micro_batch, divisors(m.global_batch / dp))) {
        for (Schedule sched : schedules) {
          for (int v : vpps_for(sp, m, pp, sched)) {
            // A fused attention kernel stores no scores, so selective recomputation is the same
            // layout as none; rank it only when asked for.
            std::vector<Recompute> rcs = {Recompute::none, Recompute::full};
            if (sp.base.attention == AttentionKernel::unfused) rcs.insert(rcs.begin() + 1, Recompute::selective);
            for (Recompute rc : or_default(sp.recompute, rcs)) {
              for (bool seq_par : or_default(sp.sequence_parallel, tp > 1 ? std::vector<bool>{false, true}
                                                                         : std::vector<bool>{false})) {
                for (bool z : or_default(sp.zero1, dp > 1 ? std::vector<bool>{false, true}
                                                         : std::vector<bool>{false})) {
                  Layout l = sp.base;
                  l.tp = tp;
                  l.pp = pp;
                  l.dp = dp;
                  l.vpp = v;
                  l.micro_batch = mbs;
                  l.schedule = sched;
                  l.recompute = rc;
                  l.sequence_parallel = seq_par;
                  l.zero1 = z;
                  if (auto why = layout_problem(m, c, l, sp.rules)) {
                    reject(*why);
                    continue;
                  }
                  ++res.enumerated;
                  Estimate e = estimate(m, net, l, sp.rules);
                  if (e.memory.fits()) {
                    ++res.ranked;
                    fitting.push_back(std::move(e));
                  } else {
                    ++res.no_fit;
                    not_fitting.push_back(std::move(e));
                  }
                }
              }
            }
          }
        }
      }
    }
  }

  rank_layouts(res, fitting, not_fitting, sp.top_k);
  return res;
}

}  // namespace triax::plan
