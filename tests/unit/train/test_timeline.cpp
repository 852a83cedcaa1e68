// The timeline's bubble (train/timeline.h): the window bubble of a uniform-cost 1F1B/GPipe
// schedule is (p-1)/(2m); spans taken from a simulation give back that simulation's bubble; a
// stretched stage shows as more idle on the others.
#include <catch2/catch.hpp>

#include "triax/pipeline/schedule_sim.h"
#include "triax/train/timeline.h"

using namespace triax;

namespace {
std::vector<ComputeSpan> spans_of_sim(const Schedule& s, const SimResult& r) {
  std::vector<ComputeSpan> out;
  for (int st = 0; st < s.stages; ++st)
    for (const auto& t : r.timeline[static_cast<size_t>(st)])
      out.push_back({st, t.instr.mb, t.instr.chunk, t.instr.op, t.start * 1000, (t.end - t.start) * 1000});
  return out;
}
}  // namespace

TEST_CASE("window bubble of uniform 1F1B and GPipe is (p-1)/(2m)", "[train][timeline]") {
  for (auto kind : {ScheduleKind::one_f_one_b, ScheduleKind::gpipe})
    for (int p : {2, 4})
      for (int m : {4, 8}) {
        const Schedule s = make_schedule(kind, p, 1, m);
        const auto b = step_bubble(s, spans_of_sim(s, simulate_schedule(s)), 1);
        CHECK(b.measured == Approx(double(p - 1) / (2 * m)));
        CHECK(b.simulated == Approx(b.measured));
        CHECK(b.theory == Approx(b.measured));
      }
}

TEST_CASE("a slow last stage: measured spans and their simulation agree", "[train][timeline]") {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 4, 1, 8);
  const ComputeCostFn cost = [](int stage, const PipeInstr& in) {
    return (in.op == PipeOp::forward ? 1.0 : 2.0) * (stage == 3 ? 1.5 : 1.0);
  };
  const auto spans = spans_of_sim(s, simulate_schedule(s, cost, 0.0));
  const auto b = step_bubble(s, spans, 2);
  CHECK(b.step == 2);
  CHECK(b.simulated == Approx(b.measured));
  CHECK(b.measured > b.theory);  // the other stages wait for the slow one
  CHECK_THROWS_AS(window_bubble({{5, 0, 0, PipeOp::forward, 0, 1}}, 4), ConfigError);
}
