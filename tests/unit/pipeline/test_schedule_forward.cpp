// The forward-only (evaluation) schedule: every (mb, chunk) forwarded once per stage with its
// activation messages, no backward or gradient message, and the checker still proving it.
#include <catch2/catch.hpp>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_check.h"

using namespace triax;

TEST_CASE("forward-only schedules hold forwards and activation messages only", "[schedule]") {
  for (auto [p, v, m] : {std::tuple{1, 1, 1}, {1, 1, 5}, {2, 1, 3}, {4, 1, 8}, {2, 2, 4}, {4, 2, 3}}) {
    CAPTURE(p, v, m);
    const Schedule s = make_forward_only(p, v, m);
    CHECK(s.forward_only);
    CHECK_THAT(s.label(), Catch::Matchers::StartsWith("forward-only"));
    for (int st = 0; st < p; ++st) {
      int forwards = 0, sends = 0, recvs = 0;
      for (const auto& in : s.lists[st]) {
        REQUIRE((in.op == PipeOp::forward || in.op == PipeOp::send_activation || in.op == PipeOp::recv_activation));
        forwards += in.op == PipeOp::forward;
        sends += in.op == PipeOp::send_activation;
        recvs += in.op == PipeOp::recv_activation;
      }
      CHECK(forwards == m * v);
      // Every virtual stage but the last sends each micro-batch on; every one but the first receives.
      int expect_sends = 0, expect_recvs = 0;
      for (int c = 0; c < v; ++c) {
        expect_sends += s.is_last_virtual(st, c) ? 0 : m;
        expect_recvs += s.is_first_virtual(st, c) ? 0 : m;
      }
      CHECK(sends == expect_sends);
      CHECK(recvs == expect_recvs);
    }
    CHECK_NOTHROW(check_schedule(s));
  }
  // A training checker rejects a forward-only list that is not marked as such.
  Schedule s = make_forward_only(2, 1, 2);
  s.forward_only = false;
  CHECK_THROWS_WITH(check_schedule(s), Catch::Matchers::Contains("no backward"));
  // And a forward-only schedule must not hold a backward.
  Schedule t = make_forward_only(1, 1, 1);
  t.lists[0].push_back({PipeOp::backward, 0, 0, -1});
  CHECK_THROWS_WITH(check_schedule(t), Catch::Matchers::Contains("forward-only"));
  CHECK_THROWS_AS(make_forward_only(1, 2, 2), ConfigError);
  CHECK_THROWS_AS(make_forward_only(2, 1, 0), ConfigError);
}
