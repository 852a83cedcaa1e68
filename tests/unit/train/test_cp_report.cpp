// The context-parallel overlap report of an iteration: the log line's "cp exposed" field, the JSONL
// keys and the Prometheus gauges appear under --cp > 1 only, with the values given.
// (tests/multirank/test_cp_report_train.cpp: a trainer at cp 2 fills them, one at cp 1 does not.)
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "triax/train/metrics_exporter.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
IterationMetrics cp_metrics(double exposed_ms, double total_ms) {
  IterationMetrics m;
  m.iteration = 3;
  m.train_iters = 10;
  m.dp_exposed_ms = 1.25;
  m.p2p_wait_ms = 0.5;
  m.cp = true;
  m.cp_exposed_ms = exposed_ms;
  m.cp_exchange_ms = total_ms;
  return m;
}
}  // namespace

TEST_CASE("cp: the iteration line gives the exposed exchange time and the hidden share", "[cp]") {
  const IterationMetrics m = cp_metrics(1.5, 6.0);
  CHECK(m.cp_hidden() == Approx(0.75));
  CHECK_THAT(m.log_line(),
             Contains("| dp exposed (ms): 1.25 | cp exposed (ms): 1.50 of 6.00 (75% hidden) | p2p wait (ms): 0.50 |"));
  IterationMetrics plain = m;
  plain.cp = false;
  CHECK_THAT(plain.log_line(), Contains("| dp exposed (ms): 1.25 | p2p wait (ms): 0.50 |"));
  CHECK_THAT(plain.log_line(), !Contains("cp exposed"));
  // With ZeRO-3 as well: both fields, ZeRO-3's first.
  IterationMetrics both = m;
  both.zero3 = true;
  both.zero3_gather_exposed_ms = 0.25;
  both.zero3_gather_ms = 1.0;
  CHECK_THAT(both.log_line(), Contains("(75% hidden) | cp exposed (ms): 1.50 of 6.00 (75% hidden) | p2p wait"));
  // No exchange at all (total 0): nothing hidden, no division by zero.
  CHECK(cp_metrics(0, 0).cp_hidden() == 0.0);
  CHECK_THAT(cp_metrics(0, 0).log_line(), Contains("cp exposed (ms): 0.00 of 0.00 (0% hidden)"));
}

TEST_CASE("cp: JSONL keys only under context parallelism", "[cp]") {
  const auto j = nlohmann::json::parse(cp_metrics(2.0, 8.0).json());
  CHECK(j.at("cp_exposed_ms").get<double>() == 2.0);
  CHECK(j.at("cp_exchange_ms").get<double>() == 8.0);
  CHECK(j.at("cp_hidden").get<double>() == 0.75);
  IterationMetrics plain = cp_metrics(2.0, 8.0);
  plain.cp = false;
  const auto p = nlohmann::json::parse(plain.json());
  CHECK(!p.contains("cp_exposed_ms"));
  CHECK(!p.contains("cp_exchange_ms"));
  CHECK(!p.contains("cp_hidden"));
}

TEST_CASE("cp: Prometheus gauges only under context parallelism", "[cp]") {
  MetricsSnapshot s;
  s.have_iteration = true;
  s.it = cp_metrics(2.0, 8.0);
  const std::string text = s.render();
  CHECK_THAT(text, Contains("\ntriax_cp_exposed_seconds 0.002\n"));
  CHECK_THAT(text, Contains("\ntriax_cp_exchange_seconds 0.008\n"));
  s.it.cp = false;
  CHECK_THAT(s.render(), !Contains("triax_cp_"));
}
