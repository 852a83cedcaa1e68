// DynamicLossScaler: exact scale sequences (powers of two, so every value is exact) for growth
// after growth_interval clean steps, backoff on overflow, hysteresis, the min/max clamps, the
// skip decisions, checkpoint restore, and every configuration error.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "triax/core/error.h"
#include "triax/optim/loss_scaler.h"

using triax::ConfigError;
using triax::DynamicLossScaler;
using triax::LossScalerConfig;

namespace {
LossScalerConfig cfg(int64_t interval, int hysteresis = 1) {
  LossScalerConfig c;
  c.init_scale = 1024.0;
  c.growth_factor = 2.0;
  c.backoff_factor = 0.5;
  c.growth_interval = interval;
  c.hysteresis = hysteresis;
  c.min_scale = 1.0;
  c.max_scale = 65536.0;
  return c;
}
}  // namespace

TEST_CASE("loss scaler starts at init_scale and its inverse", "[loss_scaler]") {
  DynamicLossScaler s(cfg(3));
  CHECK(s.scale() == 1024.0);
  CHECK(s.inv_scale() == 1.0 / 1024.0);
  CHECK(s.skipped_steps() == 0);
  CHECK(s.state().clean_steps == 0);
  CHECK(s.state().hysteresis_left == 1);
  DynamicLossScaler d;  // the defaults are valid
  CHECK(d.scale() == 65536.0);
}

TEST_CASE("loss scaler grows after exactly growth_interval clean steps", "[loss_scaler]") {
  DynamicLossScaler s(cfg(3));
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 1024.0);  // 2 clean steps: not yet
  CHECK(s.update(false));
  CHECK(s.scale() == 2048.0);  // the 3rd
  CHECK(s.state().clean_steps == 0);
  for (int i = 0; i < 2; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 2048.0);
  CHECK(s.update(false));
  CHECK(s.scale() == 4096.0);
  CHECK(s.skipped_steps() == 0);
}

TEST_CASE("loss scaler skips and backs off on overflow, restarting the clean run", "[loss_scaler]") {
  DynamicLossScaler s(cfg(3));
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK_FALSE(s.update(true));  // skipped
  CHECK(s.scale() == 512.0);
  CHECK(s.skipped_steps() == 1);
  CHECK(s.update(false));
  CHECK(s.update(false));
  CHECK(s.scale() == 512.0);  // the run restarted at the overflow: 2 clean steps only
  CHECK(s.update(false));
  CHECK(s.scale() == 1024.0);
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 256.0);  // hysteresis 1: every overflow backs off
  CHECK(s.skipped_steps() == 3);
}

TEST_CASE("loss scaler hysteresis delays the backoff until the budget is spent; growth refills it", "[loss_scaler]") {
  DynamicLossScaler s(cfg(2, 3));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1024.0);
  CHECK(s.state().hysteresis_left == 2);
  CHECK(s.update(false));  // a clean step does not refill the budget
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 1024.0);
  CHECK(s.state().hysteresis_left == 1);
  CHECK_FALSE(s.update(true));  // the 3rd overflow since the start: backoff
  CHECK(s.scale() == 512.0);
  CHECK(s.state().hysteresis_left == 0);
  CHECK_FALSE(s.update(true));  // budget spent: every further overflow backs off at once
  CHECK(s.scale() == 256.0);
  CHECK(s.update(false));
  CHECK(s.update(false));  // growth after 2 clean steps refills the budget
  CHECK(s.scale() == 512.0);
  CHECK(s.state().hysteresis_left == 3);
  CHECK_FALSE(s.update(true));
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 512.0);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 256.0);
  CHECK(s.skipped_steps() == 7);
}

TEST_CASE("loss scaler clamps at min_scale and max_scale", "[loss_scaler]") {
  auto c = cfg(1);
  c.init_scale = 4.0;
  c.min_scale = 2.0;
  c.max_scale = 16.0;
  DynamicLossScaler s(c);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 2.0);
  CHECK_FALSE(s.update(true));
  CHECK(s.scale() == 2.0);  // floor
  for (int i = 0; i < 10; ++i) CHECK(s.update(false));
  CHECK(s.scale() == 16.0);  // 2 -> 4 -> 8 -> 16, then capped
  // A non-power-of-two factor still lands on the cap exactly.
  c.init_scale = 10.0;
  c.growth_factor = 3.0;
  c.max_scale = 50.0;
  DynamicLossScaler t(c);
  t.update(false);
  CHECK(t.scale() == 30.0);
  t.update(false);
  CHECK(t.scale() == 50.0);
}

TEST_CASE("loss scaler applies exactly the steps without overflow", "[loss_scaler]") {
  std::mt19937_64 rng(std::random_device{}());
  DynamicLossScaler s(cfg(4, 2));
  int64_t skipped = 0;
  for (int i = 0; i < 500; ++i) {
    const bool overflow = rng() % 5 == 0;
    CHECK(s.update(overflow) == !overflow);
    skipped += overflow;
    CHECK(s.scale() >= 1.0);
    CHECK(s.scale() <= 65536.0);
    CHECK(std::log2(s.scale()) == std::floor(std::log2(s.scale())));  // powers of two stay exact
  }
  CHECK(s.skipped_steps() == skipped);
}

TEST_CASE("loss scaler restore continues identically; bad states are rejected", "[loss_scaler]") {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<bool> flags(300);
  for (auto&& f : flags) f = rng() % 4 == 0;
  DynamicLossScaler a(cfg(3, 2));
  for (size_t i = 0; i < 150; ++i) a.update(flags[i]);
  DynamicLossScaler b(cfg(3, 2));
  b.restore(a.state());
  for (size_t i = 150; i < flags.size(); ++i) {
    CHECK(a.update(flags[i]) == b.update(flags[i]));
    CHECK(a.scale() == b.scale());
    CHECK(a.state().clean_steps == b.state().clean_steps);
    CHECK(a.state().hysteresis_left == b.state().hysteresis_left);
  }
  DynamicLossScaler c(cfg(3, 2));
  CHECK_THROWS_AS(c.restore({0.5, 0, 1}), ConfigError);        // below min_scale
  CHECK_THROWS_AS(c.restore({1e9, 0, 1}), ConfigError);        // above max_scale
  CHECK_THROWS_AS(c.restore({NAN, 0, 1}), ConfigError);
  CHECK_THROWS_AS(c.restore({64.0, 3, 1}), ConfigError);       // clean_steps == growth_interval
  CHECK_THROWS_AS(c.restore({64.0, -1, 1}), ConfigError);
  CHECK_THROWS_AS(c.restore({64.0, 0, 3}), ConfigError);       // more budget than hysteresis
  CHECK_THROWS_AS(c.restore({64.0, 0, -1}), ConfigError);
  CHECK(c.scale() == 1024.0);  // a rejected restore changes nothing
  c.restore({64.0, 2, 0});
  CHECK(c.scale() == 64.0);
}

TEST_CASE("loss scaler rejects every bad configuration", "[loss_scaler]") {
  const double inf = std::numeric_limits<double>::infinity();
  auto bad = [](auto mutate) {
    auto c = cfg(3);
    mutate(c);
    CHECK_THROWS_AS(DynamicLossScaler(c), ConfigError);
    CHECK_THROWS_AS(triax::validate(c), ConfigError);
  };
  bad([](LossScalerConfig& c) { c.init_scale = 0; });
  bad([&](LossScalerConfig& c) { c.init_scale = inf; });
  bad([](LossScalerConfig& c) { c.init_scale = 1e9; });   // above max_scale
  bad([](LossScalerConfig& c) { c.init_scale = 0.5; });   // below min_scale
  bad([](LossScalerConfig& c) { c.growth_factor = 1.0; });
  bad([](LossScalerConfig& c) { c.growth_factor = NAN; });
  bad([](LossScalerConfig& c) { c.backoff_factor = 1.0; });
  bad([](LossScalerConfig& c) { c.backoff_factor = 0.0; });
  bad([](LossScalerConfig& c) { c.growth_interval = 0; });
  bad([](LossScalerConfig& c) { c.hysteresis = 0; });
  bad([](LossScalerConfig& c) { c.min_scale = 0; });
  bad([&](LossScalerConfig& c) { c.max_scale = inf; });
  try {
    auto c = cfg(3);
    c.backoff_factor = 2.0;
    DynamicLossScaler s(c);
    FAIL("no error");
  } catch (const ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("backoff_factor") && Catch::Contains("(0, 1)"));
  }
}
