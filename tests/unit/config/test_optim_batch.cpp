// Batch knobs: any two of global batch, micro-batch and micro-batch count give the third; the
// errors show the arithmetic; the ramp-up visits the right global batches.
#include <catch2/catch.hpp>

#include "triax/config/batch.h"
#include "triax/core/error.h"

using namespace triax;

TEST_CASE("resolve_batch derives the third knob from any two") {
  auto p = resolve_batch({32, 4, 0}, 2);
  CHECK(p.num_micro_batches == 4);
  CHECK(p.describe() == "global batch 32 = micro-batch 4 x dp 2 x micro-batches 4");
  p = resolve_batch({48, 0, 3}, 4);
  CHECK(p.micro_batch == 4);
  CHECK(p.global_batch == 48);
  p = resolve_batch({0, 2, 5}, 3);
  CHECK(p.global_batch == 30);
  p = resolve_batch({24, 3, 2}, 4);
  CHECK(p.global_batch == 24);
  // Micro-batch alone: one micro-batch per step.
  p = resolve_batch({0, 8, 0}, 2);
  CHECK(p.global_batch == 16);
  CHECK(p.num_micro_batches == 1);
}

TEST_CASE("resolve_batch errors show the arithmetic") {
  CHECK_THROWS_WITH(resolve_batch({32, 4, 3}, 2),
                    "global batch 32 != micro-batch 4 x dp 2 x micro-batches 3 = 24");
  CHECK_THROWS_WITH(resolve_batch({30, 4, 0}, 2),
                    "global batch 30 is not divisible by micro-batch 4 x dp 2 = 8 (30 = 3 x 8 + 6)");
  CHECK_THROWS_WITH(resolve_batch({30, 0, 4}, 2),
                    "global batch 30 is not divisible by dp 2 x micro-batches 4 = 8 (30 = 3 x 8 + 6)");
  CHECK_THROWS_WITH(resolve_batch({32, 0, 0}, 2), Catch::Contains("give the micro-batch size, or two of"));
  CHECK_THROWS_WITH(resolve_batch({0, 0, 4}, 2), Catch::Contains("micro-batches 4"));
  CHECK_THROWS_WITH(resolve_batch({-8, 4, 0}, 2), Catch::Contains("global batch size -8"));
  CHECK_THROWS_WITH(resolve_batch({8, -4, 0}, 2), Catch::Contains("micro-batch size -4"));
  CHECK_THROWS_WITH(resolve_batch({8, 4, -1}, 2), Catch::Contains("number of micro-batches -1"));
  CHECK_THROWS_WITH(resolve_batch({8, 4, 0}, 0), Catch::Contains("data-parallel size 0"));
}

TEST_CASE("batch schedule without ramp-up is constant") {
  BatchSchedule s(resolve_batch({32, 4, 0}, 2));
  CHECK(s.global_batch(0) == 32);
  CHECK(s.global_batch(1'000'000) == 32);
  CHECK(s.num_micro_batches(5) == 4);
  CHECK_FALSE(s.has_rampup());
  CHECK_THROWS_AS(s.global_batch(-1), ConfigError);
}

TEST_CASE("batch ramp-up: start, evenly spaced increments, target after the ramp samples") {
  // micro 2 x dp 2 = 4 divides every visited batch: 8, 12, 16, 20, 24, 28, 32.
  BatchSchedule s(resolve_batch({32, 2, 0}, 2), BatchRampup{8, 4, 600});
  CHECK(s.num_increments() == 6);
  CHECK(s.global_batch(0) == 8);
  CHECK(s.global_batch(99) == 8);
  CHECK(s.global_batch(100) == 12);
  CHECK(s.global_batch(250) == 16);
  CHECK(s.global_batch(599) == 28);
  CHECK(s.global_batch(600) == 32);
  CHECK(s.global_batch(10'000) == 32);
  CHECK(s.num_micro_batches(100) == 3);
  CHECK(s.plan(250).describe() == "global batch 16 = micro-batch 2 x dp 2 x micro-batches 4");
  // A training loop: consumed samples advance by the batch of each step.
  int64_t consumed = 0, steps = 0;
  while (s.global_batch(consumed) < 32) {
    consumed += s.global_batch(consumed);
    ++steps;
  }
  CHECK(consumed >= 600);
  CHECK(steps > 6);
  // Degenerate ramps: start == target; zero ramp samples.
  CHECK(BatchSchedule(resolve_batch({32, 2, 0}, 2), BatchRampup{32, 4, 100}).global_batch(0) == 32);
  CHECK(BatchSchedule(resolve_batch({32, 2, 0}, 2), BatchRampup{8, 4, 0}).global_batch(0) == 32);
}

TEST_CASE("batch ramp-up errors name the failing step") {
  const auto target = resolve_batch({32, 4, 0}, 2);  // micro 4 x dp 2 = 8
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{8, 4, 100}),
                    "batch ramp-up step 1 of 6: global batch 12 (= start 8 + 1 x increment 4) is not divisible by "
                    "micro-batch 4 x dp 2 = 8");
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{4, 4, 100}), Catch::Contains("step 0 of 7: global batch 4"));
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{8, 5, 100}),
                    Catch::Contains("global batch 32 - start 8 = 24 is not a multiple of the increment 5"));
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{40, 8, 100}), Catch::Contains("start 40 must lie in [1, global batch 32]"));
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{8, 0, 100}), Catch::Contains("increment 0"));
  CHECK_THROWS_WITH(BatchSchedule(target, BatchRampup{8, 8, -1}), Catch::Contains("samples -1"));
  BatchPlan bad = target;
  bad.global_batch = 30;
  CHECK_THROWS_WITH(BatchSchedule(bad), Catch::Contains("inconsistent target plan"));
}
