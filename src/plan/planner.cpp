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
    case LossReason::cp_comm: return "cp_comm";
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
      {LossReason::cp_comm, e.time.cp_comm - best.time.cp_comm},
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

// The (ZeRO level, shard size) pairs tried: the levels asked for (or the old zero1 knob), else 0..3
// with dp > 1; ZeRO-2/3 also with shard groups of one node's dp ranks (HSDP) when those divide dp.
std::vector<std::pair<int, int>> zero_choices(const SearchSpace& sp, const Cluster& c, int tp, int dp) {
  std::vector<int> levels = sp.zero;
  if (levels.empty()) {
    for (bool z : sp.zero1) levels.push_back(z ? 1 : 0);
    if (sp.zero1.empty()) levels = dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0};
  }
  std::vector<int> shards = sp.zero_shard;
  const int node_dp = tp <= c.gpus_per_node ? c.gpus_per_node / tp : 1;
  if (shards.empty()) {
    shards = {0};
    if (node_dp > 1 && node_dp < dp && dp % node_dp == 0) shards.push_back(node_dp);
  }
  std::vector<std::pair<int, int>> out;
  for (int z : levels) {
    if (z < 2) out.emplace_back(z, 0);
    else
      for (int s : shards) out.emplace_back(z, s);
  }
  return out;
}

// Counts a layout under its ZeRO level and whether it uses CP, and keeps the leanest layouts.
void note_zero(SearchResult& res, const Estimate& e) {
  const bool cp = e.layout.cp > 1;
  if (e.memory.fits()) ++(cp ? res.fitting_with_cp : res.fitting_without_cp);
  auto& lean_cp1 = res.leanest_without_cp;
  if (!cp && (!lean_cp1 || e.memory.total() < lean_cp1->memory.total())) lean_cp1 = e;
  const int z = e.layout.zero;
  if (z < 0 || z > 3) return;
  if (e.memory.fits()) ++res.fitting_by_zero[z];
  auto& lean = res.leanest_by_zero[z];
  if (!lean || e.memory.total() < lean->memory.total()) lean = e;
}

// The context-parallel sizes tried with `n` GPUs per tp rank: those asked for, else the powers of
// two dividing n; only those where 2 cp divides the sequence (the zigzag chunks).
std::vector<int> cps_for(const SearchSpace& sp, const ModelShape& m, int n) {
  std::vector<int> cps = sp.cp;
  if (cps.empty())
    for (int cp = 1; cp <= n && n % cp == 0; cp *= 2)
      if (cp == 1 || m.seq % (2 * cp) == 0) cps.push_back(cp);
  return cps;
}

// Every (micro-batch, schedule, vpp, recompute, sequence parallel, ZeRO) choice of one (tp, cp,
// pp, dp) grid, handed to `consider`.
template <class Consider>
void for_each_setting(const SearchSpace& sp, const ModelShape& m, const Cluster& c, const Layout& grid,
                      Consider&& consider) {
  const int tp = grid.tp, pp = grid.pp, dp = grid.dp;
  const std::vector<Schedule> schedules = schedules_for(sp, pp);
  // A fused attention kernel stores no scores, so selective recomputation is the same layout as
  // none; rank it only when asked for.
  std::vector<Recompute> rcs = {Recompute::none, Recompute::full};
  if (sp.base.attention == AttentionKernel::unfused) rcs.insert(rcs.begin() + 1, Recompute::selective);
  const std::vector<bool> sps = tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (int mbs : or_default(sp.micro_batch, divisors(m.global_batch / dp)))
    for (Schedule sched : schedules)
      for (int v : vpps_for(sp, m, pp, sched))
        for (Recompute rc : or_default(sp.recompute, rcs))
          for (bool seq_par : or_default(sp.sequence_parallel, sps))
            for (const auto& [z, shard] : zero_choices(sp, c, tp, grid.grad_ranks())) {
              Layout l = sp.base;
              l.tp = tp;
              l.cp = grid.cp;
              l.pp = pp;
              l.dp = dp;
              l.vpp = v;
              l.micro_batch = mbs;
              l.schedule = sched;
              l.recompute = rc;
              l.sequence_parallel = seq_par;
              l.zero = z;
              l.zero_shard = shard;
              consider(l);
            }
}

}  // namespace

std::optional<std::string> zero_explanation(const SearchResult& r) {
  int need = 0;
  while (need < 4 && r.fitting_by_zero[need] == 0) ++need;
  if (need < 2 || need > 3) return std::nullopt;  // nothing fits, or a level below 2 does
  const Estimate* lean = nullptr;
  for (int z = 0; z < need; ++z) {
    const auto& e = r.leanest_by_zero[z];
    if (e && (!lean || e->memory.total() < lean->memory.total())) lean = &*e;
  }
  if (!lean) return std::nullopt;  // the search did not look below the level that fits
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const MemoryBreakdown& mem = lean->memory;
  const std::string levels = need == 3 ? "only ZeRO-3 fits"
                             : r.fitting_by_zero[3] > 0 ? "only ZeRO-2 and ZeRO-3 fit"
                                                        : "only ZeRO-2 fits";
  return fmt::format("{}: the leanest layout below ZeRO-{} ({}) needs {:.1f} GiB per GPU of {:.1f} GiB "
                     "(parameters {:.1f} GiB, gradients {:.1f} GiB, optimizer {:.1f} GiB, activations {:.1f} GiB)",
                     levels, need, describe(lean->layout), mem.total() / GiB, mem.capacity / GiB, mem.weights / GiB,
                     mem.gradients / GiB, mem.optimizer / GiB, mem.activations / GiB);
}

std::optional<std::string> cp_explanation(const SearchResult& r) {
  if (r.fitting_with_cp == 0 || r.fitting_without_cp > 0 || !r.leanest_without_cp) return std::nullopt;
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const MemoryBreakdown& mem = r.leanest_without_cp->memory;
  return fmt::format("only CP fits: the leanest layout without context parallelism ({}) needs {:.1f} GiB per GPU "
                     "of {:.1f} GiB (parameters {:.1f} GiB, gradients {:.1f} GiB, optimizer {:.1f} GiB, "
                     "activations {:.1f} GiB)",
                     describe(r.leanest_without_cp->layout), mem.total() / GiB, mem.capacity / GiB, mem.weights / GiB,
                     mem.gradients / GiB, mem.optimizer / GiB, mem.activations / GiB);
}

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
  auto consider = [&](const Layout& l) {
    if (auto why = layout_problem(m, c, l, sp.rules)) return reject(*why);
    ++res.enumerated;
    Estimate e = estimate(m, net, l, sp.rules);
    note_zero(res, e);
    if (e.memory.fits()) {
      ++res.ranked;
      fitting.push_back(std::move(e));
    } else {
      ++res.no_fit;
      not_fitting.push_back(std::move(e));
    }
  };

  for (int tp : or_default(sp.tp, divisors(sp.gpus))) {
    if (sp.gpus % tp != 0) {
      reject(fmt::format("tp {} does not divide the {} GPUs", tp, sp.gpus));
      continue;
    }
    for (int cp : cps_for(sp, m, sp.gpus / tp)) {
      if ((sp.gpus / tp) % cp != 0) {
        reject(fmt::format("tp*cp {} does not divide the {} GPUs", tp * cp, sp.gpus));
        continue;
      }
      const int rest = sp.gpus / (tp * cp);
      for (int pp : or_default(sp.pp, divisors(rest))) {
        if (rest % pp != 0) {
          reject(fmt::format("tp*cp*pp {} does not divide the {} GPUs", tp * cp * pp, sp.gpus));
          continue;
        }
        Layout grid;
        grid.tp = tp;
        grid.cp = cp;
        grid.pp = pp;
        grid.dp = rest / pp;
        if (!sp.dp.empty() && std::find(sp.dp.begin(), sp.dp.end(), grid.dp) == sp.dp.end()) continue;
        if (m.global_batch % grid.dp != 0) {
          reject(fmt::format("dp {} does not divide global batch {}", grid.dp, m.global_batch));
          continue;
        }
        for_each_setting(sp, m, c, grid, consider);
      }
    }
  }

  rank_layouts(res, fitting, not_fitting, sp.top_k);
  return res;
}

}  // namespace triax::plan
