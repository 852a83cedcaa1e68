// Learning-rate schedule values at known iterations, and refused configurations.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>

#include "triax/optim/lr_schedule.h"

using namespace triax;

TEST_CASE("cosine schedule: warm-up, decay and floor at known iterations") {
  LrSchedule s({/*max*/ 1e-3, /*min*/ 1e-4, /*warmup*/ 10, /*decay_iters*/ 110, LrDecay::cosine});
  CHECK(s.lr(0) == Approx(1e-4).epsilon(1e-12));   // (0+1)/10 of max
  CHECK(s.lr(4) == Approx(5e-4).epsilon(1e-12));
  CHECK(s.lr(9) == Approx(1e-3).epsilon(1e-12));   // last warm-up step reaches max
  CHECK(s.lr(10) == Approx(1e-3).epsilon(1e-12));  // decay starts at ratio 0
  CHECK(s.lr(60) == Approx(5.5e-4).epsilon(1e-12));  // half way: (max+min)/2
  CHECK(s.lr(35) == Approx(1e-4 + 9e-4 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25))).epsilon(1e-12));
  CHECK(s.lr(110) == Approx(1e-4).epsilon(1e-12));
  CHECK(s.lr(100000) == Approx(1e-4).epsilon(1e-12));
  // Monotone non-increasing after the warm-up.
  for (int64_t i = 10; i < 120; ++i) CHECK(s.lr(i + 1) <= s.lr(i));
}

TEST_CASE("linear and constant schedules") {
  LrSchedule lin({2.0, 0.0, 0, 4, LrDecay::linear});
  CHECK(lin.lr(0) == 2.0);
  CHECK(lin.lr(1) == 1.5);
  CHECK(lin.lr(2) == 1.0);
  CHECK(lin.lr(3) == 0.5);
  CHECK(lin.lr(4) == 0.0);
  LrSchedule c({3.0, 0.0, 3, 0, LrDecay::constant});
  CHECK(c.lr(0) == 1.0);
  CHECK(c.lr(1) == 2.0);
  CHECK(c.lr(2) == 3.0);
  CHECK(c.lr(1000) == 3.0);
  // warm-up equal to decay_iters: straight to min after the warm-up.
  LrSchedule w({1.0, 0.25, 2, 2, LrDecay::cosine});
  CHECK(w.lr(1) == 1.0);
  CHECK(w.lr(2) == 0.25);
}

TEST_CASE("schedule names and bad configurations") {
  CHECK(parse_lr_decay("cosine") == LrDecay::cosine);
  CHECK(parse_lr_decay("linear") == LrDecay::linear);
  CHECK(parse_lr_decay("constant") == LrDecay::constant);
  CHECK(lr_decay_name(LrDecay::linear) == "linear");
  CHECK_THROWS_WITH(parse_lr_decay("exp"), Catch::Contains("unknown learning-rate decay 'exp'"));
  CHECK_THROWS_WITH(LrSchedule({1e-4, 1e-3, 0, 10, LrDecay::cosine}), Catch::Contains("min_lr (0.001) <= max_lr (0.0001)"));
  CHECK_THROWS_AS(LrSchedule({1e-3, -1.0, 0, 10, LrDecay::cosine}), ConfigError);
  CHECK_THROWS_AS(LrSchedule({NAN, 0.0, 0, 10, LrDecay::cosine}), ConfigError);
  CHECK_THROWS_WITH(LrSchedule({1e-3, 0.0, -1, 10, LrDecay::cosine}), Catch::Contains("warm-up iterations -1"));
  CHECK_THROWS_WITH(LrSchedule({1e-3, 0.0, 20, 10, LrDecay::linear}), Catch::Contains("decay_iters must be >= warmup_iters"));
  CHECK_NOTHROW(LrSchedule({1e-3, 0.0, 20, 0, LrDecay::constant}));
  LrSchedule ok({1e-3, 0.0, 0, 10, LrDecay::cosine});
  CHECK_THROWS_AS(ok.lr(-1), ConfigError);
}
