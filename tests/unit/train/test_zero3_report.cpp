// The ZeRO-3 overlap report of an iteration: the log line's "zero3 gather exposed" field, the
// JSONL keys and the Prometheus gauges appear under --zero 3 only, with the values given.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "triax/train/metrics_exporter.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
IterationMetrics zero3_metrics(double exposed_ms, double total_ms) {
  IterationMetrics m;
  m.iteration = 3;
  m.train_iters = 10;
  m.dp_exposed_ms = 1.25;
  m.p2p_wait_ms = 0.5;
  m.zero3 = true;
  m.zero3_gather_exposed_ms = exposed_ms;
  m.zero3_gather_ms = total_ms;
  return m;
}
}  // namespace

TEST_CASE("zero3: the iteration line gives the exposed gather time and the hidden share", "[zero3]") {
  const IterationMetrics m = zero3_metrics(0.8, 6.1);
  CHECK(m.zero3_hidden() == Approx(1.0 - 0.8 / 6.1));
  CHECK_THAT(m.log_line(),
             Contains("| dp exposed (ms): 1.25 | zero3 gather exposed (ms): 0.80 of 6.10 (87% hidden) | p2p wait (ms): 0.50 |"));
  IterationMetrics plain = m;
  plain.zero3 = false;
  CHECK_THAT(plain.log_line(), Contains("| dp exposed (ms): 1.25 | p2p wait (ms): 0.50 |"));
  CHECK_THAT(plain.log_line(), !Contains("zero3"));
  // No gather at all (total 0): nothing hidden, no division by zero.
  CHECK(zero3_metrics(0, 0).zero3_hidden() == 0.0);
  CHECK_THAT(zero3_metrics(0, 0).log_line(), Contains("zero3 gather exposed (ms): 0.00 of 0.00 (0% hidden)"));
}

TEST_CASE("zero3: JSONL keys only under ZeRO-3", "[zero3]") {
  const auto j = nlohmann::json::parse(zero3_metrics(2.0, 8.0).json());
  CHECK(j.at("zero3_gather_exposed_ms").get<double>() == 2.0);
  CHECK(j.at("zero3_gather_ms").get<double>() == 8.0);
  CHECK(j.at("zero3_gather_hidden").get<double>() == 0.75);
  IterationMetrics plain = zero3_metrics(2.0, 8.0);
  plain.zero3 = false;
  const auto p = nlohmann::json::parse(plain.json());
  CHECK(!p.contains("zero3_gather_ms"));
  CHECK(!p.contains("zero3_gather_exposed_ms"));
  CHECK(!p.contains("zero3_gather_hidden"));
}

TEST_CASE("zero3: Prometheus gauges only under ZeRO-3", "[zero3]") {
  MetricsSnapshot s;
  s.have_iteration = true;
  s.it = zero3_metrics(2.0, 8.0);
  const std::string text = s.render();
  CHECK_THAT(text, Contains("\ntriax_zero3_gather_exposed_seconds 0.002\n"));
  CHECK_THAT(text, Contains("\ntriax_zero3_gather_seconds 0.008\n"));
  s.it.zero3 = false;
  CHECK_THAT(s.render(), !Contains("triax_zero3"));
}
