// Injected faults inside the library (TRIAX_FAULT) at np 4: a NaN gradient on rank 1 skips the
// step everywhere with the parameters bit-identical and names rank 1, training continues;
// --max-skipped-iterations ends the run; TRIAX_DEBUG_COLLECTIVES names both ranks of a mismatch.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "support/multirank.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
TrainConfig tiny() {
  TrainConfig c;
  c.model = "nano";
  c.layers = 2;
  c.seq = 8;
  c.train_iters = 3;
  return c;
}
struct FaultEnv {
  explicit FaultEnv(const char* spec) { setenv("TRIAX_FAULT", spec, 1); }
  ~FaultEnv() { unsetenv("TRIAX_FAULT"); }
};
}  // namespace

TEST_CASE("nan on rank 1 at iteration 2: skipped everywhere, parameters untouched, rank 1 named", "[faults]") {
  auto w = test::world_ptr();
  REQUIRE(w->size() == 4);
  FaultEnv env("1:2:nan");
  Trainer t(w, tiny());
  const auto m1 = t.step();
  REQUIRE_FALSE(m1.step_skipped);
  const auto p = t.store().flat_params();
  const std::vector<float> before(p.begin(), p.end());
  const auto m2 = t.step();
  CHECK(m2.step_skipped);
  CHECK(m2.skipped == 1);
  CHECK(m2.nonfinite_rank == 1);
  CHECK(!m2.nonfinite_param.empty());
  CHECK(!std::isfinite(m2.grad_norm));
  const auto q = t.store().flat_params();
  CHECK(std::memcmp(before.data(), q.data(), before.size() * sizeof(float)) == 0);
  const auto m3 = t.step();
  CHECK_FALSE(m3.step_skipped);
  CHECK(std::isfinite(m3.loss));
  CHECK(std::isfinite(m3.grad_norm));
  CHECK(std::memcmp(before.data(), t.store().flat_params().data(), before.size() * sizeof(float)) != 0);
}

TEST_CASE("nan before the DP sync is named at its origin, with ZeRO-1 and with tp 2 too", "[faults]") {
  // The poison is in rank 1's own gradient before the reduction copies it to the other DP
  // replicas (or, under ZeRO-1, into one rank's shard): the report still names rank 1 only.
  auto w = test::world_ptr();
  REQUIRE(w->size() == 4);
  FaultEnv env("1:2:nan");
  for (const auto& [zero1, tp] : {std::pair{false, 1}, std::pair{true, 1}, std::pair{true, 2}, std::pair{false, 2}}) {
    CAPTURE(zero1, tp);
    TrainConfig c = tiny();
    c.zero = (zero1) ? 1 : 0;
    c.tp = tp;
    Trainer t(w, c);
    REQUIRE_FALSE(t.step().step_skipped);
    const auto m2 = t.step();
    CHECK(m2.step_skipped);
    CHECK(m2.nonfinite_rank == 1);
    CHECK(!m2.nonfinite_param.empty());
    CHECK_FALSE(t.step().step_skipped);
  }
}

TEST_CASE("--max-skipped-iterations ends the run after K consecutive skips", "[faults]") {
  auto w = test::world_ptr();
  FaultEnv env("3:1:nan,3:2:nan");
  TrainConfig c = tiny();
  c.max_skipped_iterations = 2;
  Trainer t(w, c);
  CHECK(t.step().step_skipped);
  REQUIRE_THROWS_WITH(t.step(), Contains("2 consecutive iterations (1 to 2) skipped") && Contains("rank 3"));
}

TEST_CASE("TRIAX_DEBUG_COLLECTIVES: mismatched sizes name both ranks and the number", "[faults]") {
  auto w = test::world_ptr();
  auto c = w->split(0, w->rank(), "mismatch");
  c->set_debug_collectives(true);
  std::vector<float> ok(10, 1.0f);
  c->all_reduce(std::span<float>(ok)).wait();  // sizes agree: passes the check
  CHECK(ok[0] == 4.0f);
  std::vector<float> v(c->rank() == 2 ? 12 : 10, 1.0f);
  if (c->rank() == 2)
    REQUIRE_THROWS_WITH(c->all_reduce(std::span<float>(v)),
                        Contains("collective mismatch") && Contains("all_reduce #1") &&
                            Contains("group rank 2 (world rank 2) called all_reduce (float32 x 12, sum)") &&
                            Contains("group rank 0 (world rank 0) called float32 x 10"));
  else
    REQUIRE_THROWS_WITH(c->all_reduce(std::span<float>(v)),
                        Contains("collective mismatch") && Contains("all_reduce #1") &&
                            Contains("float32 x 10, sum) but group rank 2 (world rank 2) called float32 x 12"));
  CHECK(c->poisoned());
}
