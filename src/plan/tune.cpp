// The changes --tune tries, each priced by the cost model and ranked by throughput.
#include "triax/plan/tune.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "triax/core/error.h"

namespace triax::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TuneChoice make_choice(std::string change, const Estimate& e, const Estimate* base) {
  TuneChoice c;
  c.change = std::move(change);
  c.estimate = e;
  c.limit = limiting_factor(e);
  c.speedup = base ? e.tokens_per_second / base->tokens_per_second : 1;
  c.gpu_hours_per_billion_tokens = e.layout.gpus() * e.seconds_per_iteration / 3600 /
                                   (double(e.model.global_batch) * e.model.seq / 1e9);
  c.changes_batch = base && e.model.global_batch != base->model.global_batch;
  return c;
}

long accumulation(const Estimate& e) { return e.micro_batches; }

}  // namespace

std::string limiting_factor(const Estimate& e) {
  const double T = e.seconds_per_iteration;
  const auto& m = e.memory;
  if (!m.fits())
    return fmt::format("memory: needs {:.1f} GiB of {:.1f} (activations {:.1f})", m.total() / kGiB, m.capacity / kGiB,
                       m.activations / kGiB);
  const std::pair<const char*, double> parts[] = {{"pipeline bubble", e.time.bubble},
                                                  {"exposed tp comm", e.time.tp_comm},
                                                  {"exposed cp comm", e.time.cp_comm},
                                                  {"exposed pp comm", e.time.pp_comm},
                                                  {"exposed dp comm", e.time.dp_comm},
                                                  {"optimizer", e.time.optimizer}};
  const auto* worst = std::max_element(std::begin(parts), std::end(parts),
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
  std::string out;
  if (worst->second < 0.1 * T) out = fmt::format("compute ({:.0f}% of the step in kernels)", 100 * e.time.compute / T);
  else out = fmt::format("{} ({:.0f}% of the step)", worst->first, 100 * worst->second / T);
  if (m.total() > 0.9 * m.capacity)
    out += fmt::format("; memory nearly full ({:.1f} of {:.1f} GiB)", m.total() / kGiB, m.capacity / kGiB);
  return out;
}

TuneResult tune(const ModelShape& m, const CollectiveModel& net, const Layout& cur, const TuneOptions& opt) {
  TuneResult res;
  const Estimate base = estimate(m, net, cur, opt.rules);
  res.current = make_choice("current settings", base, nullptr);
  auto consider = [&](std::vector<TuneChoice>& best_of_kind, std::string change, const ModelShape& mm,
                      const Layout& l) {
    if (layout_problem(mm, net.cluster(), l, opt.rules)) return;
    const Estimate e = estimate(mm, net, l, opt.rules);
    TuneChoice c = make_choice(std::move(change), e, &base);
    if (!e.memory.fits()) {
      res.rejected.push_back(std::move(c));
      return;
    }
    best_of_kind.push_back(std::move(c));
  };
  auto keep_best = [&](std::vector<TuneChoice>& kind) {
    if (kind.empty()) return;
    auto it = std::max_element(kind.begin(), kind.end(),
                               [](const TuneChoice& a, const TuneChoice& b) { return a.speedup < b.speedup; });
    res.options.push_back(*it);
  };
  const long per_replica = m.global_batch / cur.dp;

  // Micro-batch size at the same global batch (gradient accumulation follows).
  std::vector<TuneChoice> kind;
  for (long b = 1; b <= per_replica; ++b) {
    if (per_replica % b != 0 || b == cur.micro_batch) continue;
    Layout l = cur;
    l.micro_batch = int(b);
    consider(kind, fmt::format("micro-batch {} -> {} (accumulation {} -> {})", cur.micro_batch, b,
                               accumulation(base), per_replica / b),
             m, l);
  }
  keep_best(kind);

  // Gradient accumulation at the same micro-batch: the global batch grows or shrinks.
  kind.clear();
  for (double f : {0.25, 0.5, 2.0, 4.0}) {
    const long acc = long(accumulation(base) * f);
    if (acc < 1 || double(acc) != accumulation(base) * f) continue;
    ModelShape mm = m;
    mm.global_batch = acc * cur.micro_batch * cur.dp;
    consider(kind, fmt::format("accumulation {} -> {} (global batch {} -> {})", accumulation(base), acc,
                               m.global_batch, mm.global_batch),
             mm, cur);
  }
  keep_best(kind);

  // Recomputation (and sequence parallelism with tp).
  kind.clear();
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
    for (bool sp : {false, true}) {
      if ((rc == cur.recompute && sp == cur.sequence_parallel) || (sp && cur.tp == 1)) continue;
      // A fused attention kernel stores no scores: selective is the same layout as none.
      if (rc == Recompute::selective && cur.attention == AttentionKernel::fused) continue;
      Layout l = cur;
      l.recompute = rc;
      l.sequence_parallel = sp;
      std::string what = rc != cur.recompute ? fmt::format("recompute {} -> {}", to_string(cur.recompute), to_string(rc))
                                             : fmt::format("recompute {}", to_string(rc));
      if (sp != cur.sequence_parallel) what += sp ? ", sequence parallel on" : ", sequence parallel off";
      consider(kind, what, m, l);
    }
  }
  keep_best(kind);

  // ZeRO level (dp x cp > 1): sharding gradients (2) and parameters (3) trades DP traffic for memory.
  kind.clear();
  for (int z = 0; z <= 3 && cur.grad_ranks() > 1; ++z) {
    if (z == cur.zero) continue;
    Layout l = cur;
    l.zero = z;
    if (z < 2) l.zero_shard = 0;
    consider(kind, fmt::format("ZeRO {} -> {}", cur.zero, z), m, l);
  }
  keep_best(kind);

  // Layout: every (tp, pp, dp, vpp, micro-batch, schedule, recompute, ...) at the same global batch.
  {
    SearchSpace sp;
    sp.gpus = cur.gpus();
    sp.base = cur;
    sp.rules = opt.rules;
    sp.top_k = 1;
    const SearchResult r = search(m, net, sp);
    if (!r.best.empty()) res.options.push_back(make_choice("layout: " + describe(r.best.front().layout), r.best.front(), &base));
  }
  std::sort(res.options.begin(), res.options.end(),
            [](const TuneChoice& a, const TuneChoice& b) { return a.speedup > b.speedup; });
  std::sort(res.rejected.begin(), res.rejected.end(),
            [](const TuneChoice& a, const TuneChoice& b) { return a.speedup > b.speedup; });
  if (res.rejected.size() > 3) res.rejected.resize(3);
  return res;
}

std::string format_tune(const TuneResult& r, const TuneOptions& opt) {
  auto line = [&](const TuneChoice& c) {
    const Estimate& e = c.estimate;
    std::string cost = fmt::format("{:.0f} GPU-h/Btok", c.gpu_hours_per_billion_tokens);
    if (opt.gpu_hour_price > 0) cost += fmt::format(" ({:.0f}/Btok)", c.gpu_hours_per_billion_tokens * opt.gpu_hour_price);
    return fmt::format("  {:<58} {:>9.3f} s {:>11.0f} tok/s {:>5.1f}% MFU {:>6.1f} GiB  x{:<5.2f} {}{}\n    limit: {}\n",
                       c.change, e.seconds_per_iteration, e.tokens_per_second, 100 * e.mfu, e.memory.total() / kGiB,
                       c.speedup, cost, c.changes_batch ? "  [global batch changes: check convergence]" : "", c.limit);
  };
  const Estimate& cur = r.current.estimate;
  std::string out = fmt::format("current: {} on {} GPUs, global batch {}, {} micro-batches per step\n",
                                describe(cur.layout), cur.layout.gpus(), cur.model.global_batch, cur.micro_batches);
  out += line(r.current);
  out += "proposed changes, best first (step time, tokens/s, MFU, memory, speedup, cost):\n";
  for (const auto& c : r.options) out += line(c);
  if (!r.rejected.empty()) {
    out += "faster but over memory:\n";
    for (const auto& c : r.rejected) out += line(c);
  }
  if (!r.options.empty() && r.options.front().speedup > 1.0)
    out += fmt::format("recommendation: {} ({:.2f}x tokens/s)\n", r.options.front().change, r.options.front().speedup);
  else
    out += "recommendation: keep the current settings (no change priced here is faster)\n";
  return out;
}

std::string tune_json(const TuneResult& r, int indent) {
  auto one = [](const TuneChoice& c) {
    const Estimate& e = c.estimate;
    return nlohmann::json{{"change", c.change},
                          {"layout", describe(e.layout)},
                          {"global_batch", e.model.global_batch},
                          {"micro_batches", e.micro_batches},
                          {"seconds_per_iteration", e.seconds_per_iteration},
                          {"tokens_per_second", e.tokens_per_second},
                          {"mfu", e.mfu},
                          {"memory_gib", e.memory.total() / kGiB},
                          {"fits", e.memory.fits()},
                          {"speedup", c.speedup},
                          {"gpu_hours_per_billion_tokens", c.gpu_hours_per_billion_tokens},
                          {"changes_batch", c.changes_batch},
                          {"limit", c.limit}};
  };
  nlohmann::json j;
  j["current"] = one(r.current);
  j["options"] = nlohmann::json::array();
  for (const auto& c : r.options) j["options"].push_back(one(c));
  j["rejected"] = nlohmann::json::array();
  for (const auto& c : r.rejected) j["rejected"].push_back(one(c));
  return j.dump(indent);
}

}  // namespace triax::plan
