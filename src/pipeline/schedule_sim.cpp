// Discrete-event simulation of a checked schedule, and the closed-form bubbles it is tested against.
#include "triax/pipeline/schedule_sim.h"

#include <algorithm>
#include <numeric>

#include "schedule_index.h"
#include "triax/core/error.h"
#include "triax/pipeline/schedule_check.h"

namespace triax {

double SimCosts::cost(PipeOp op) const {
  switch (op) {
    case PipeOp::forward: return forward;
    case PipeOp::backward: return backward;
    case PipeOp::backward_input: return backward_input;
    case PipeOp::backward_weight: return backward_weight;
    default: return 0.0;
  }
}

double BubbleStats::ratio(int stage) const {
  const double b = busy.at(static_cast<size_t>(stage));
  return b > 0 ? idle.at(static_cast<size_t>(stage)) / b : 0.0;
}
double BubbleStats::of_makespan(int stage) const {
  return makespan > 0 ? idle.at(static_cast<size_t>(stage)) / makespan : 0.0;
}
double BubbleStats::ratio() const {
  const double b = std::accumulate(busy.begin(), busy.end(), 0.0);
  return b > 0 ? std::accumulate(idle.begin(), idle.end(), 0.0) / b : 0.0;
}
double BubbleStats::of_makespan() const {
  return makespan > 0 && !idle.empty()
             ? std::accumulate(idle.begin(), idle.end(), 0.0) / (makespan * static_cast<double>(idle.size()))
             : 0.0;
}

SimResult simulate_schedule(const Schedule& s, const SimCosts& costs) {
  return simulate_schedule(s, [&costs](int, const PipeInstr& in) { return costs.cost(in.op); }, costs.comm);
}

SimResult simulate_schedule(const Schedule& s, const ComputeCostFn& cost, double comm) {
  CheckOptions only_structure;
  only_structure.models = {P2pModel::eager};
  only_structure.fifo_channels = false;
  only_structure.check_bounds = false;
  check_schedule(s, only_structure);
  if (!(comm >= 0)) TRIAX_THROW(ConfigError, "{}: simulated message latency must be >= 0, got {}", s.label(), comm);
  const auto ix = detail::index_schedule(s);
  const int p = s.stages;
  constexpr double kUnknown = -1.0;
  std::vector<std::vector<double>> arrival(p);  // per receive: when its message is there
  for (int st = 0; st < p; ++st) arrival[st].assign(s.lists[st].size(), kUnknown);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  SimResult r;
  r.timeline.resize(p);
  for (bool moved = true; moved;) {
    moved = false;
    for (int st = 0; st < p; ++st) {
      for (; pc[st] < s.lists[st].size(); ++pc[st], moved = true) {
        const size_t i = pc[st];
        const auto& in = s.lists[st][i];
        if (is_send(in.op)) {
          const auto [ms, mi] = ix.match[st][i];
          arrival[ms][static_cast<size_t>(mi)] = clock[st] + comm;
          continue;
        }
        if (is_recv(in.op)) continue;
        double ready = 0.0;
        if (const int rv = ix.consumes[st][i]; rv >= 0) {
          ready = arrival[st][static_cast<size_t>(rv)];
          if (ready == kUnknown) break;  // its message has not been sent yet
        }
        const double dur = cost(st, in);
        if (!(dur >= 0))
          TRIAX_THROW(ConfigError, "{}: the cost of stage {} instruction {} {} is {}, expected >= 0", s.label(), st, i,
                      describe(in), dur);
        const double t0 = std::max(clock[st], ready);
        clock[st] = t0 + dur;
        r.timeline[st].push_back({static_cast<int>(i), in, t0, clock[st]});
      }
    }
  }
  // check_schedule proved the eager walk completes, so every stage is at its end here.
  r.bubble.makespan = p > 0 ? *std::max_element(clock.begin(), clock.end()) : 0.0;
  for (int st = 0; st < p; ++st) {
    double busy = 0;
    for (const auto& t : r.timeline[st]) busy += t.end - t.start;
    r.bubble.busy.push_back(busy);
    r.bubble.idle.push_back(r.bubble.makespan - busy);
  }
  return r;
}

double theoretical_bubble(ScheduleKind kind, int p, int v, int m, const SimCosts& c) {
  validate_schedule_config(kind, p, v, m);
  switch (kind) {
    case ScheduleKind::gpipe:
      if (v > 1 && m < p)
        TRIAX_THROW(ConfigError, "gpipe with vpp={} has no closed-form bubble when m={} < pp={} (chunk passes stall "
                    "waiting for the wrap-around)", v, m, p);
      return static_cast<double>(p - 1) / (static_cast<double>(v) * m);
    case ScheduleKind::one_f_one_b: return static_cast<double>(p - 1) / m;
    case ScheduleKind::interleaved: return static_cast<double>(p - 1) / (static_cast<double>(v) * m);
    case ScheduleKind::zb_h1:
      if (c.backward_weight > c.forward || c.backward_weight > c.backward_input || m < p)
        TRIAX_THROW(ConfigError, "zb-h1's closed-form bubble (p-1)(F+B-W)/(m(F+B+W)) assumes W <= F, W <= B and "
                    "m >= pp; got F={} B={} W={} m={} pp={}", c.forward, c.backward_input, c.backward_weight, m, p);
      return (p - 1) * (c.forward + c.backward_input - c.backward_weight) /
             (m * (c.forward + c.backward_input + c.backward_weight));
  }
  return 0.0;
}

}  // namespace triax
