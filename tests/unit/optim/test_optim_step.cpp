// Optimizer::step on one rank: equals fused AdamW applied by hand with the serial clip
// coefficient; skips a non-finite step without touching anything; ZeRO-1 at dp 1 is identical.
#include <catch2/catch.hpp>

#include <cmath>

#include "support/optim_fixture.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/optim/grad_norm.h"
#include "triax/optim/optimizer.h"

using namespace triax;
using triax::test::make_store;
using triax::test::odd_params;

namespace {
std::unique_ptr<ProcessGrid> self_grid() {
  return std::make_unique<ProcessGrid>(std::shared_ptr<Communicator>(make_self_communicator()), GridShape{});
}
double serial_norm(const ParamStore& s) {
  double t = 0;
  for (size_t i = 0; i < s.size(); ++i)
    if (s.info(i).spec.norm_owner)
      for (float g : s.flat_grads().subspan(s.info(i).offset, s.info(i).numel)) t += double(g) * double(g);
  return std::sqrt(t);
}
}  // namespace

TEST_CASE("clip_coefficient") {
  CHECK(clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(clip_coefficient(1.0, 1.0) == 1.0);
  CHECK(clip_coefficient(4.0, 1.0) == Approx(1.0 / (4.0 + 1e-6)).epsilon(1e-15));
  CHECK(clip_coefficient(4.0, 0.0) == 1.0);  // clipping off
  CHECK(clip_coefficient(NAN, 1.0) == 1.0);
}

TEST_CASE("Optimizer::step equals AdamW by hand with the serial clip coefficient") {
  const bool zero = GENERATE(false, true);
  const double max_norm = GENERATE(0.0, 1.0, 1e6);
  auto grid = self_grid();
  auto ps = odd_params();
  ps[2].norm_owner = false;  // pretend ln1.b is a replicated copy owned elsewhere
  auto s = make_store(ps, 1);
  auto ref = make_store(ps, 1);
  test::fill_normal(s.flat_params().subspan(0, s.numel()), 1, 1);
  test::fill_normal(ref.flat_params().subspan(0, ref.numel()), 1, 1);
  OptimizerConfig cfg;
  cfg.max_grad_norm = max_norm;
  cfg.zero = (zero) ? 1 : 0;
  cfg.grad_sync.bucket_bytes = 64;
  Optimizer opt(s, *grid, cfg);
  std::vector<float> m(ref.padded_numel(), 0.0f), v(ref.padded_numel(), 0.0f);
  for (int step = 1; step <= 3; ++step) {
    test::fill_grads_normal(s, 10 + step, 0, 0.8f);
    test::fill_grads_normal(ref, 10 + step, 0, 0.8f);
    const double lr = 1e-2 * step;
    auto rep = opt.step(lr);
    const double norm = serial_norm(ref);
    CHECK(rep.grad_norm == Approx(norm).epsilon(1e-12));
    CHECK_FALSE(rep.skipped);
    CHECK(rep.applied_steps == step);
    const double coef = clip_coefficient(norm, max_norm);
    CHECK(rep.clip_coef == Approx(coef).epsilon(1e-12));
    if (max_norm == 1.0) CHECK(coef < 0.5);  // the clipping path is really exercised
    for (size_t i = 0; i < ref.size(); ++i) {
      const auto& p = ref.info(i);
      adamw_update(ref.param(i), ref.grad(i), std::span<float>(m).subspan(p.offset, p.numel),
                   std::span<float>(v).subspan(p.offset, p.numel), cfg.adamw, p.spec.weight_decay ? cfg.adamw.weight_decay : 0.0f,
                   AdamWStep{static_cast<float>(lr), step, static_cast<float>(coef)});
    }
    for (size_t k = 0; k < s.padded_numel(); ++k) REQUIRE(s.flat_params()[k] == ref.flat_params()[k]);
  }
}

TEST_CASE("Optimizer::step skips a non-finite gradient and counts it") {
  const bool zero = GENERATE(false, true);
  const float bad = GENERATE(NAN, INFINITY);
  auto grid = self_grid();
  auto s = make_store(odd_params(), 1);
  test::fill_normal(s.flat_params().subspan(0, s.numel()), 2, 2);
  OptimizerConfig cfg;
  cfg.zero = (zero) ? 1 : 0;
  Optimizer opt(s, *grid, cfg);
  test::fill_grads_normal(s, 3, 0);
  s.grad(5)[17] = bad;
  const std::vector<float> before(s.flat_params().begin(), s.flat_params().end());
  auto rep = opt.step(1e-2);
  CHECK(rep.skipped);
  CHECK_FALSE(std::isfinite(rep.grad_norm));
  CHECK(rep.skipped_steps == 1);
  CHECK(rep.applied_steps == 0);
  CHECK(std::equal(before.begin(), before.end(), s.flat_params().begin()));
  for (float x : to_host_f32(s.backend(), opt.exp_avg())) REQUIRE(x == 0.0f);
  // The next finite step is AdamW's first (t = 1): each parameter moves by about lr.
  test::fill_grads_normal(s, 4, 0);
  rep = opt.step(1e-2);
  CHECK_FALSE(rep.skipped);
  CHECK(rep.applied_steps == 1);
  CHECK(opt.skipped_steps() == 1);
}

TEST_CASE("Optimizer refuses bad configuration") {
  auto grid = self_grid();
  auto s = make_store(odd_params(), 1);
  OptimizerConfig cfg;
  cfg.adamw.beta1 = 1.5f;
  CHECK_THROWS_WITH(Optimizer(s, *grid, cfg), Catch::Contains("beta1"));
  cfg = {};
  cfg.max_grad_norm = INFINITY;
  CHECK_THROWS_WITH(Optimizer(s, *grid, cfg), Catch::Contains("max_grad_norm"));
  cfg = {};
  Optimizer opt(s, *grid, cfg);
  CHECK_THROWS_WITH(opt.step(-1.0), Catch::Contains("learning rate -1"));
  CHECK_THROWS_AS(opt.set_step_counts(-1, 0), ConfigError);
}
