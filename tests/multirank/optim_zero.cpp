// ZeRO-1 against plain DP under mpirun (same parameters after several clipped steps, with
// padding and shards that cut through parameters of different weight-decay flags), a hand-made
// reference for the first step, the global gradient norm over tp x pp x dp with replicated
// parameters counted once, and the agreement of every rank on skipping a non-finite step.
#include <catch2/catch.hpp>

#include <cmath>

#include "optim_support.h"
#include "support/optim_fixture.h"
#include "triax/optim/grad_norm.h"
#include "triax/optim/optimizer.h"

using namespace triax;
using namespace triax::test;

namespace {
// Pre-reduction gradient of parameter i on the rank with DP coordinate d (same on every tp/pp).
void rank_grads(ParamStore& s, int d, int step) {
  for (size_t i = 0; i < s.size(); ++i)
    fill_normal(s.grad(i), 900 + static_cast<uint64_t>(step), static_cast<uint64_t>(d) * 100 + i, 0.7f);
}

std::vector<FakeParam> params_for(const ProcessGrid& g) {
  auto ps = odd_params();
  // Identical copies on every tp rank (no tp split here): only tp rank 0 owns them in the norm.
  for (auto& p : ps) p.norm_owner = g.coord().tp == 0;
  return ps;
}
}  // namespace

TEST_CASE("ZeRO-1 gives the parameters of plain data parallelism") {
  std::vector<GridShape> shapes = {{1, 1, world().size()}};
  if (world().size() == 4) shapes.push_back({2, 1, 2});
  const size_t bucket_bytes = GENERATE(size_t{0}, size_t{48}, size_t{200});
  for (const auto& shape : shapes) {
    auto grid = make_grid(shape);
    const int dpn = grid->dp().size();
    INFO("tp " << shape.tp << " dp " << dpn << " bucket_bytes " << bucket_bytes);
    const auto ps = params_for(*grid);
    auto plain = make_store(ps, 1);
    auto zs = make_store(ps, static_cast<size_t>(dpn));
    auto ref = make_store(ps, 1);
    for (auto* s : {&plain, &zs, &ref}) fill_normal(s->flat_params().subspan(0, s->numel()), 5, 5);
    OptimizerConfig cfg;
    cfg.max_grad_norm = 1.0;
    cfg.adamw.weight_decay = 0.1f;
    cfg.grad_sync.bucket_bytes = bucket_bytes;
    Optimizer a(plain, *grid, cfg);
    cfg.zero = 1;
    Optimizer z(zs, *grid, cfg);
    CHECK(static_cast<size_t>(z.exp_avg().numel()) == zs.padded_numel() / static_cast<size_t>(dpn));
    if (dpn > 1) {
      CHECK(zs.padded_numel() > zs.numel());  // 259 elements: padded for dp 2 and 4
      bool cut = false;
      for (const auto& seg : z.grad_buffer().shard_segments()) cut |= seg.count < zs.info(seg.param).numel;
      CHECK(cut);
    }
    std::vector<float> m(ref.padded_numel(), 0.0f), v(ref.padded_numel(), 0.0f);
    for (int step = 1; step <= 3; ++step) {
      rank_grads(plain, grid->coord().dp, step);
      rank_grads(zs, grid->coord().dp, step);
      for (auto* o : {&a, &z})
        for (size_t p = plain.size(); p-- > 0;) {
          o->grad_buffer().mark_ready(p);
          o->grad_buffer().progress();
        }
      const double lr = 2e-2;
      const auto ra = a.step(lr);
      const auto rz = z.step(lr);
      // Reference on this rank: the DP average by hand, the serial norm, clip, AdamW.
      std::vector<float> avg(ref.padded_numel(), 0.0f);
      for (int d = 0; d < dpn; ++d) {
        rank_grads(ref, d, step);
        for (size_t k = 0; k < ref.numel(); ++k) avg[k] += ref.flat_grads()[k];
      }
      double sq = 0;
      for (size_t k = 0; k < ref.numel(); ++k) {
        avg[k] /= static_cast<float>(dpn);
        sq += double(avg[k]) * double(avg[k]);
      }
      const double norm = std::sqrt(sq);
      CHECK(ra.grad_norm == Approx(norm).epsilon(1e-6));
      CHECK(rz.grad_norm == Approx(norm).epsilon(1e-6));
      CHECK(ra.clip_coef < 0.5);  // clipping is active
      CHECK(rz.clip_coef == Approx(ra.clip_coef).epsilon(1e-6));
      for (size_t i = 0; i < ref.size(); ++i) {
        const auto& p = ref.info(i);
        adamw_update(ref.param(i), std::span<const float>(avg).subspan(p.offset, p.numel),
                     std::span<float>(m).subspan(p.offset, p.numel), std::span<float>(v).subspan(p.offset, p.numel),
                     cfg.adamw, p.spec.weight_decay ? cfg.adamw.weight_decay : 0.0f,
                     AdamWStep{static_cast<float>(lr), step, static_cast<float>(clip_coefficient(norm, 1.0))});
      }
      double worst_z = 0, worst_ref = 0;
      for (size_t k = 0; k < plain.numel(); ++k) {
        const double b = plain.flat_params()[k];
        worst_z = std::max(worst_z, std::abs(zs.flat_params()[k] - b) / std::max(std::abs(b), 1e-3));
        // The hand-made DP average sums in another order than MPI (1-ulp differences that AdamW
        // can amplify where v is tiny), so it is compared on the parameters' scale (~1).
        worst_ref = std::max(worst_ref, std::abs(ref.flat_params()[k] - b) / std::max(std::abs(b), 1.0));
      }
      INFO("step " << step << " ZeRO vs plain " << worst_z << ", reference vs plain " << worst_ref);
      CHECK(worst_z <= 1e-6);
      CHECK(worst_ref <= 1e-6);
      for (size_t k = zs.numel(); k < zs.padded_numel(); ++k) REQUIRE(zs.flat_params()[k] == 0.0f);
    }
    // Every rank holds the same gathered parameters.
    std::vector<float> hi(zs.flat_params().begin(), zs.flat_params().end()), lo = hi;
    world().all_reduce(std::span<float>(hi), ReduceOp::max).wait();
    world().all_reduce(std::span<float>(lo), ReduceOp::min).wait();
    CHECK(hi == lo);
  }
}

TEST_CASE("global gradient norm over tp x pp x dp counts replicated parameters once") {
  const bool zero = GENERATE(false, true);
  for (const auto& shape : all_shapes()) {
    auto grid = make_grid(shape);
    const GridCoord c = grid->coord();
    const int tpn = shape.tp, ppn = shape.pp, dpn = shape.dp;
    INFO("tp " << tpn << " pp " << ppn << " dp " << dpn << " zero " << zero);
    // Per stage: a replicated LayerNorm weight (same on every tp rank), a tp-sharded matrix
    // (distinct per tp rank), and a stage-sized bias.
    auto build = [&](int tp, int pp) {
      std::vector<FakeParam> ps = {{"ln.w", 9 + pp, false, tp == 0}, {"fc.w", 23, true, true}, {"b", 4 + pp, false, tp == 0}};
      return ps;
    };
    auto fill = [&](ParamStore& s, int tp, int pp, int d) {
      // Replicated params: same on every tp rank; sharded: per tp rank. DP replicas differ
      // (pre-reduction) under ZeRO; without ZeRO they hold identical, already reduced values.
      const int dd = zero ? d : 0;
      fill_normal(s.grad(0), 31, static_cast<uint64_t>(pp * 10 + dd));
      fill_normal(s.grad(1), 32, static_cast<uint64_t>(pp * 1000 + tp * 10 + dd));
      fill_normal(s.grad(2), 33, static_cast<uint64_t>(pp * 10 + dd));
    };
    auto s = make_store(build(c.tp, c.pp), static_cast<size_t>(dpn));
    fill(s, c.tp, c.pp, c.dp);
    double got;
    std::unique_ptr<GradBuffer> gb;
    if (zero) {
      GradBufferOptions o;
      o.sync = GradSync::reduce_scatter;
      o.bucket_bytes = 32;
      gb = std::make_unique<GradBuffer>(s, grid->dp(), o);
      gb->finish();
      got = global_grad_norm(s, *grid, gb.get());
    } else {
      got = global_grad_norm(s, *grid);
    }
    // Serial: the unsharded model's gradient = for each stage, the replicated params once and
    // every tp shard of the matrix, each averaged over DP.
    double sq = 0;
    for (int pp = 0; pp < ppn; ++pp)
      for (int tp = 0; tp < tpn; ++tp) {
        auto avg = make_store(build(tp, pp), 1);
        for (int d = 0; d < dpn; ++d) {
          auto r = make_store(build(tp, pp), 1);
          fill(r, tp, pp, d);
          for (size_t k = 0; k < r.numel(); ++k) avg.flat_grads()[k] += r.flat_grads()[k] / static_cast<float>(dpn);
        }
        for (size_t i = 0; i < avg.size(); ++i)
          if (i == 1 || tp == 0)
            for (float x : avg.grad(i)) sq += double(x) * double(x);
      }
    CHECK(got == Approx(std::sqrt(sq)).epsilon(1e-6));
    // The world agrees bit for bit.
    double hi[1] = {got}, lo[1] = {got};
    world().all_reduce(std::span<double>(hi), ReduceOp::max).wait();
    world().all_reduce(std::span<double>(lo), ReduceOp::min).wait();
    CHECK(hi[0] == lo[0]);
    // clip_grad_norm scales to max_norm.
    const double norm = clip_grad_norm(s, *grid, 0.5 * got, gb.get());
    CHECK(norm == Approx(got).epsilon(1e-12));
    const double after = global_grad_norm(s, *grid, gb.get());
    CHECK(after == Approx(0.5 * got).epsilon(1e-5));
  }
}

TEST_CASE("a NaN gradient on one rank makes every rank skip the step") {
  const bool zero = GENERATE(false, true);
  for (const auto& shape : all_shapes()) {
    auto grid = make_grid(shape);
    INFO("tp " << shape.tp << " pp " << shape.pp << " dp " << shape.dp << " zero " << zero);
    auto s = make_store(params_for(*grid), static_cast<size_t>(shape.dp));
    fill_normal(s.flat_params().subspan(0, s.numel()), 8, static_cast<uint64_t>(grid->coord().pp));
    OptimizerConfig cfg;
    cfg.zero = (zero) ? 1 : 0;
    cfg.grad_sync.bucket_bytes = 64;
    Optimizer opt(s, *grid, cfg);
    rank_grads(s, grid->coord().dp, 1);
    if (grid->rank() == world().size() - 1) s.grad(3)[5] = NAN;
    const std::vector<float> before(s.flat_params().begin(), s.flat_params().end());
    const auto rep = opt.step(1e-2);
    CHECK(rep.skipped);
    CHECK(rep.skipped_steps == 1);
    CHECK(std::equal(before.begin(), before.end(), s.flat_params().begin()));
    s.zero_grads();
    rank_grads(s, grid->coord().dp, 2);
    const auto rep2 = opt.step(1e-2);
    CHECK_FALSE(rep2.skipped);
    CHECK(rep2.applied_steps == 1);
    CHECK(std::isfinite(rep2.grad_norm));
    CHECK_FALSE(std::equal(before.begin(), before.end(), s.flat_params().begin()));
  }
}
