// The trainer reports the context-parallel exchanges of each step: at cp 2 (both comm types) the
// iteration's cp field is on with a positive exchange time, exposed <= total on every rank's
// numbers, the counts are per step (reset between steps), and the log line and JSONL carry it;
// at cp 1 (dp 2) the field is off and absent from the line and the JSONL.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "support/multirank.h"
#include "triax/parallel/context_parallel.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
TrainConfig tiny(int cp, const std::string& type) {
  TrainConfig c;
  c.model = "tiny";
  c.layers = 2;
  c.seq = 64;
  c.global_batch = 4;
  c.micro_batch = 2;
  c.train_iters = 3;
  c.cp = cp;
  c.cp_comm_type = type;
  return c;
}
}  // namespace

TEST_CASE("cp 2: each step reports its own K/V exchanges", "[train][cp]") {
  auto w = test::world_ptr();
  REQUIRE(w->size() == 2);
  for (const std::string type : {"p2p", "allgather"}) {
    INFO("--cp-comm-type " << type);
    Trainer t(w, tiny(2, type));
    REQUIRE(t.context_parallel() != nullptr);
    const IterationMetrics a = t.step();
    const size_t first = t.context_parallel()->stats().exchanges;
    const IterationMetrics b = t.step();
    CHECK(first > 0);
    CHECK(t.context_parallel()->stats().exchanges == first);  // reset per step, not accumulated
    for (const IterationMetrics* m : {&a, &b}) {
      CHECK(m->cp);
      CHECK(m->cp_exchange_ms > 0);
      CHECK(m->cp_exposed_ms >= 0);
      CHECK(m->cp_hidden() <= 1.0);
      CHECK_THAT(m->log_line(), Contains(" cp exposed (ms): "));
      const auto j = nlohmann::json::parse(m->json());
      CHECK(j.at("cp_exchange_ms").get<double>() == m->cp_exchange_ms);
    }
    // This rank's own numbers: the wait is part of the exchanges' lifetime.
    const CpStats& s = t.context_parallel()->stats();
    CHECK(s.exposed_s <= s.total_s + 1e-9);
    CHECK(s.bytes > 0);
  }
}

TEST_CASE("cp 1: no cp field", "[train][cp]") {
  auto w = test::world_ptr();
  Trainer t(w, tiny(1, "p2p"));
  CHECK(t.context_parallel() == nullptr);
  const IterationMetrics m = t.step();
  CHECK(!m.cp);
  CHECK_THAT(m.log_line(), !Contains("cp exposed"));
  CHECK(!nlohmann::json::parse(m.json()).contains("cp_exposed_ms"));
}
