// The simulator: uniform costs and zero latency give exactly the closed-form bubbles (GPipe,
// 1F1B (p-1)/m; interleaved (p-1)/(v m); ZB-H1 (p-1)(F+B-W)/(m(F+B+W))), and random costs and
// latencies give the same time line as a slow recursive reference.
#include <catch2/catch.hpp>

#include <functional>
#include <map>
#include <random>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_sim.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
constexpr double kExact = 1e-12;

void require_uniform_bubble(const Schedule& s, const SimCosts& c, double per_stage_idle, double ratio) {
  const auto r = simulate_schedule(s, c);
  for (int st = 0; st < s.stages; ++st) {
    INFO("stage " << st);
    REQUIRE(r.bubble.idle[st] == Approx(per_stage_idle).margin(kExact));
    REQUIRE(r.bubble.ratio(st) == Approx(ratio).epsilon(kExact).margin(kExact));
  }
  REQUIRE(r.bubble.ratio() == Approx(ratio).epsilon(kExact).margin(kExact));
}
}  // namespace

TEST_CASE("GPipe and 1F1B: bubble (p-1)/m of the compute, (p-1)/(m+p-1) of the makespan", "[schedule][sim]") {
  for (auto [f, bw] : {std::pair{1.0, 2.0}, {1.0, 1.0}, {2.0, 3.0}, {0.75, 1.5}}) {
    SimCosts c;
    c.forward = f;
    c.backward = bw;
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 16; ++m) {
        INFO("p=" << p << " m=" << m << " F=" << f << " BW=" << bw);
        for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b}) {
          const Schedule s = make_schedule(kind, p, 1, m);
          const double theory = theoretical_bubble(kind, p, 1, m, c);
          REQUIRE(theory == Approx(static_cast<double>(p - 1) / m).epsilon(kExact));
          require_uniform_bubble(s, c, (p - 1) * (f + bw), theory);
          const auto r = simulate_schedule(s, c);
          REQUIRE(r.bubble.makespan == Approx((m + p - 1) * (f + bw)).epsilon(kExact));
          REQUIRE(r.bubble.of_makespan() == Approx(static_cast<double>(p - 1) / (m + p - 1)).epsilon(kExact));
        }
      }
    }
  }
}

TEST_CASE("interleaved and chunked GPipe: bubble (p-1)/(v m)", "[schedule][sim]") {
  int checked = 0;
  for (auto [f, bw] : {std::pair{1.0, 2.0}, {1.0, 1.0}, {2.0, 3.0}}) {
    SimCosts c;  // per-chunk costs
    c.forward = f;
    c.backward = bw;
    for (int p = 2; p <= 8; ++p) {
      for (int v = 2; v <= 4; ++v) {
        for (int m = 1; m <= 16; ++m) {
          INFO("p=" << p << " v=" << v << " m=" << m << " F=" << f << " BW=" << bw);
          const double theory = static_cast<double>(p - 1) / (v * m);
          if (m % p == 0) {
            REQUIRE(theoretical_bubble(ScheduleKind::interleaved, p, v, m, c) == Approx(theory).epsilon(kExact));
            require_uniform_bubble(make_interleaved_1f1b(p, v, m), c, (p - 1) * (f + bw), theory);
            ++checked;
          }
          if (m >= p) {
            REQUIRE(theoretical_bubble(ScheduleKind::gpipe, p, v, m, c) == Approx(theory).epsilon(kExact));
            require_uniform_bubble(make_gpipe(p, m, v), c, (p - 1) * (f + bw), theory);
            ++checked;
          } else {
            // Chunk passes stall on the wrap-around: more bubble than the formula, and no formula.
            CHECK_THROWS_WITH(theoretical_bubble(ScheduleKind::gpipe, p, v, m, c), Contains("no closed-form"));
            CHECK(simulate_schedule(make_gpipe(p, m, v), c).bubble.ratio() > theory);
          }
        }
      }
    }
  }
  CHECK(checked > 500);
}

TEST_CASE("ZB-H1: bubble (p-1)(F+B-W)/(m(F+B+W)), a third of 1F1B's at equal costs", "[schedule][sim]") {
  for (auto [f, b, w] : {std::tuple{1.0, 1.0, 1.0}, {1.0, 2.0, 1.0}, {2.0, 2.0, 1.0}, {2.0, 3.0, 1.0},
                         {1.5, 1.0, 0.5}}) {
    SimCosts c;
    c.forward = f;
    c.backward_input = b;
    c.backward_weight = w;
    c.backward = b + w;
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 16; ++m) {
        INFO("p=" << p << " m=" << m << " F=" << f << " B=" << b << " W=" << w);
        const double theory = (p - 1) * (f + b - w) / (m * (f + b + w));
        REQUIRE(theoretical_bubble(ScheduleKind::zb_h1, p, 1, m, c) == Approx(theory).epsilon(kExact).margin(kExact));
        require_uniform_bubble(make_zb_h1(p, m), c, (p - 1) * (f + b - w), theory);
        if (f == b && b == w) {
          const double one_f_one_b = simulate_schedule(make_1f1b(p, m), c).bubble.ratio();
          REQUIRE(3 * simulate_schedule(make_zb_h1(p, m), c).bubble.ratio() == Approx(one_f_one_b).margin(kExact));
        }
      }
    }
  }
  SimCosts heavy_w;
  heavy_w.backward_weight = 2.0;
  CHECK_THROWS_WITH(theoretical_bubble(ScheduleKind::zb_h1, 4, 1, 8, heavy_w), Contains("assumes W <= F, W <= B"));
  CHECK_THROWS_WITH(theoretical_bubble(ScheduleKind::zb_h1, 4, 1, 2), Contains("m=2 pp=4"));
  CHECK_THROWS_AS(theoretical_bubble(ScheduleKind::interleaved, 4, 2, 6), ConfigError);
}

TEST_CASE("message latency: a 2-stage, 1-micro-batch step pays two hops", "[schedule][sim]") {
  SimCosts c;
  c.forward = 1.0;
  c.backward = 2.0;
  c.comm = 0.25;
  const auto r = simulate_schedule(make_1f1b(2, 1), c);
  // F0 on 0 [0,1]; arrives 1.25; F0 on 1 [1.25,2.25], BW0 [2.25,4.25]; arrives 4.5; BW0 on 0 [4.5,6.5].
  CHECK(r.bubble.makespan == Approx(6.5).epsilon(kExact));
  REQUIRE(r.timeline[1].size() == 2);
  CHECK(r.timeline[1][0].start == Approx(1.25).epsilon(kExact));
  CHECK(r.timeline[0][1].start == Approx(4.5).epsilon(kExact));
  CHECK(r.timeline[0][1].index == 3);  // F0 SA0 RG0 BW0: the list position is kept
}

namespace {
// Slow reference: start(s, i) = max(end of the previous compute of s, arrival of the message it
// consumes); a message is issued at the end of the last compute before the send in the sender's
// list and arrives comm later. Memoised recursion over (stage, index).
struct Reference {
  const Schedule& s;
  const ComputeCostFn& cost;
  double comm;
  std::map<std::pair<int, int>, double> end_memo;

  double issue_time(int st, int i) {  // end of the last compute at or before i
    for (int j = i; j >= 0; --j)
      if (is_compute(s.lists[st][j].op)) return end(st, j);
    return 0.0;
  }
  int find(int st, PipeOp op, int mb, int chunk) {
    for (int j = 0; j < static_cast<int>(s.lists[st].size()); ++j)
      if (s.lists[st][j].op == op && s.lists[st][j].mb == mb && s.lists[st][j].chunk == chunk) return j;
    FAIL("reference: instruction not found");
    return -1;
  }
  double end(int st, int i) {
    if (auto it = end_memo.find({st, i}); it != end_memo.end()) return it->second;
    const auto& in = s.lists[st][i];
    double ready = issue_time(st, i - 1);
    if (in.op == PipeOp::forward && !s.is_first_virtual(st, in.chunk)) {
      const auto pv = prev_virtual(s, st, in.chunk);
      ready = std::max(ready, issue_time(pv.stage, find(pv.stage, PipeOp::send_activation, in.mb, pv.chunk)) + comm);
    }
    if ((in.op == PipeOp::backward || in.op == PipeOp::backward_input) && !s.is_last_virtual(st, in.chunk)) {
      const auto nv = next_virtual(s, st, in.chunk);
      ready = std::max(ready, issue_time(nv.stage, find(nv.stage, PipeOp::send_grad, in.mb, nv.chunk)) + comm);
    }
    return end_memo[{st, i}] = ready + cost(st, in);
  }
};
}  // namespace

TEST_CASE("random costs per instruction and random latency match a recursive reference", "[schedule][sim]") {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (auto [kind, p, v, m] : {std::tuple{ScheduleKind::gpipe, 3, 1, 5}, {ScheduleKind::gpipe, 3, 2, 4},
                               {ScheduleKind::one_f_one_b, 4, 1, 7}, {ScheduleKind::interleaved, 3, 3, 6},
                               {ScheduleKind::interleaved, 2, 2, 4}, {ScheduleKind::zb_h1, 5, 1, 9}}) {
    const Schedule s = make_schedule(kind, p, v, m);
    std::map<std::tuple<int, int, int, int>, double> costs;  // (stage, op, mb, chunk) -> cost
    for (int st = 0; st < p; ++st)
      for (const auto& in : s.lists[st])
        if (is_compute(in.op)) costs[{st, static_cast<int>(in.op), in.mb, in.chunk}] = u(rng);
    const ComputeCostFn cost = [&](int st, const PipeInstr& in) {
      return costs.at({st, static_cast<int>(in.op), in.mb, in.chunk});
    };
    const double comm = u(rng) / 2;
    INFO(s.label() << " comm " << comm);
    const auto r = simulate_schedule(s, cost, comm);
    Reference ref{s, cost, comm, {}};
    double makespan = 0;
    for (int st = 0; st < p; ++st) {
      double busy = 0;
      for (const auto& t : r.timeline[st]) {
        REQUIRE(s.lists[st][t.index] == t.instr);
        REQUIRE(t.end == Approx(ref.end(st, t.index)).epsilon(1e-12));
        REQUIRE(t.end - t.start == Approx(cost(st, t.instr)).epsilon(1e-12));
        busy += t.end - t.start;
        makespan = std::max(makespan, t.end);
      }
      REQUIRE(r.bubble.busy[st] == Approx(busy).epsilon(1e-12));
    }
    REQUIRE(r.bubble.makespan == Approx(makespan).epsilon(1e-12));
    for (int st = 0; st < p; ++st) REQUIRE(r.bubble.idle[st] == Approx(makespan - r.bubble.busy[st]).epsilon(1e-12));
  }
}

TEST_CASE("the simulator refuses bad costs and broken schedules", "[schedule][sim]") {
  const Schedule s = make_1f1b(2, 2);
  SimCosts c;
  c.comm = -1;
  CHECK_THROWS_WITH(simulate_schedule(s, c), Contains("message latency must be >= 0, got -1"));
  c.comm = 0;
  c.backward = -2;
  CHECK_THROWS_WITH(simulate_schedule(s, c), Contains("the cost of stage") && Contains("backward(mb=0, chunk=0) is -2"));
  Schedule broken = s;
  broken.lists[1].erase(broken.lists[1].begin());  // stage 1's first receive
  CHECK_THROWS_WITH(simulate_schedule(broken), Contains("its input was never received"));
}
