// triax-plan --tune: the proposals are priced by the cost model, ranked by tokens/s, the layout
// search dominates the single-knob changes at the same batch, and the limit names the real cause.
#include <catch2/catch.hpp>

#include "triax/core/error.h"
#include "triax/plan/tune.h"

using namespace triax::plan;

namespace {
Layout megatron_7b_current() {
  Layout l;  // the example: global batch 4096, accumulation 4, micro-batch 64 on 128 GPUs
  l.tp = 8;
  l.pp = 1;
  l.dp = 16;
  l.micro_batch = 64;
  l.recompute = Recompute::full;
  return l;
}
}  // namespace

TEST_CASE("tune: proposals are ranked, priced and the layout search dominates same-batch changes") {
  ModelShape m = model_preset("megatron-7.5b");
  m.global_batch = 4096;
  const CollectiveModel net(cluster_preset("selene-a100"));
  const Layout cur = megatron_7b_current();
  const TuneResult r = tune(m, net, cur);
  REQUIRE(r.current.estimate.micro_batches == 4);
  CHECK(r.current.speedup == 1.0);
  REQUIRE(r.options.size() >= 3);
  for (size_t i = 1; i < r.options.size(); ++i) CHECK(r.options[i - 1].speedup >= r.options[i].speedup);
  const Estimate direct = estimate(m, net, cur);
  double layout_speedup = 0, best_same_batch = 0;
  for (const auto& o : r.options) {
    INFO(o.change);
    CHECK(o.estimate.memory.fits());
    CHECK(!o.limit.empty());
    CHECK(o.speedup == Approx(o.estimate.tokens_per_second / direct.tokens_per_second));
    // GPU-hours per billion tokens follow from the step time.
    CHECK(o.gpu_hours_per_billion_tokens ==
          Approx(128 * o.estimate.seconds_per_iteration / 3600 / (o.estimate.model.global_batch * 2048.0 / 1e9)));
    if (o.change.rfind("layout:", 0) == 0) layout_speedup = o.speedup;
    else if (!o.changes_batch) best_same_batch = std::max(best_same_batch, o.speedup);
    if (o.change.rfind("accumulation", 0) == 0) CHECK(o.changes_batch);
  }
  CHECK(layout_speedup >= best_same_batch);
  CHECK(layout_speedup > 1.0);  // tp8 with full recompute at mbs 64 is far from the best 7.5B layout
  const std::string text = format_tune(r, TuneOptions{2.0, {}});
  CHECK_THAT(text, Catch::Contains("recommendation: layout:"));
  CHECK_THAT(text, Catch::Contains("limit:"));
}

TEST_CASE("tune: the limiting factor names memory, the bubble or communication") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  ModelShape m = model_preset("megatron-7.5b");
  m.global_batch = 64;
  Layout l;
  l.tp = 1;
  l.pp = 4;
  l.dp = 1;
  l.micro_batch = 16;  // 4 micro-batches on 4 stages: the bubble is ~3/7 of the step
  l.recompute = Recompute::full;
  CHECK_THAT(limiting_factor(estimate(m, net, l)), Catch::StartsWith("pipeline bubble"));
  l.recompute = Recompute::none;
  l.micro_batch = 64;
  l.pp = 1;
  l.dp = 1;
  l.tp = 4;
  const Estimate big = estimate(m, net, l);
  REQUIRE(!big.memory.fits());
  CHECK_THAT(limiting_factor(big), Catch::StartsWith("memory: needs"));
  // A layout over memory is still a valid current setting; the fitting proposals exclude it.
  const TuneResult r = tune(m, net, l);
  CHECK(!r.current.estimate.memory.fits());
  for (const auto& o : r.options) CHECK(o.estimate.memory.fits());
}

TEST_CASE("tune: an invalid current layout is an error naming it") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  ModelShape m = model_preset("megatron-7.5b");
  Layout l;
  l.tp = 3;
  CHECK_THROWS_AS(tune(m, net, l), triax::ConfigError);
}
