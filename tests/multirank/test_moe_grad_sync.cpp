// Gradient sync of a store holding MoE experts, for every ep dividing the world (dp = world):
// dense parameters are averaged over DP; expert parameters are summed over expert_dp (the ranks
// holding the same experts) and divided by dp (sum and avg conventions); the global gradient norm
// counts every expert once; refusals (no expert group, ZeRO-1 with ep > 1).
#include <catch2/catch.hpp>

#include <cmath>

#include "optim_support.h"
#include "support/optim_fixture.h"
#include "triax/optim/grad_buffer.h"
#include "triax/optim/grad_norm.h"
#include "triax/optim/optimizer.h"

using namespace triax;
using namespace triax::test;

namespace {
ParamStore moe_store() {
  const std::vector<std::pair<int64_t, bool>> ps = {{37, false}, {5, false}, {61, true}, {7, true},
                                                    {11, false}, {29, true}, {3, true},  {13, false}};
  ParamStore s;
  for (size_t i = 0; i < ps.size(); ++i) {
    ParamSpec spec;
    spec.name = "p" + std::to_string(i);
    spec.full_shape = {ps[i].first};
    spec.expert = ps[i].second;
    s.add(spec, {ps[i].first});
  }
  s.finalize(1);
  return s;
}
}  // namespace

TEST_CASE("expert gradients reduce over expert_dp and divide by dp", "[moe][optim]") {
  const int w = world().size();
  for (int ep = 1; ep <= w; ++ep) {
    if (w % ep != 0) continue;
    for (ReduceOp op : {ReduceOp::avg, ReduceOp::sum})
      for (size_t bucket_bytes : {size_t{0}, size_t{64}}) {
        INFO("ep " << ep << " op " << reduce_op_name(op) << " bucket_bytes " << bucket_bytes);
        auto grid = make_grid({1, 1, w, ep});
        Communicator& dp = grid->dp();
        ParamStore s = moe_store();
        // Exact data: rank r holds (r + 1) * base (dense); experts also depend on the EP rank, as
        // different EP ranks hold different experts.
        const int er = grid->ep().rank();
        for (size_t i = 0; i < s.size(); ++i) fill_exact(s.grad(i), dp.rank(), i + (s.info(i).spec.expert ? 100 * er : 0));
        if (op == ReduceOp::sum)  // the caller pre-scales by 1 / dp
          for (auto& v : s.flat_grads()) v /= static_cast<float>(w);
        GradBufferOptions o;
        o.bucket_bytes = bucket_bytes;
        o.op = op;
        o.expert_dp = &grid->expert_dp();
        GradBuffer gb(s, dp, o);
        for (size_t b = 0; b < gb.num_buckets(); ++b)
          CHECK(&gb.comm_of(b) == (gb.bucket(b).expert && ep > 1 ? &grid->expert_dp() : &dp));
        for (size_t p = s.size(); p-- > 0;) gb.mark_ready(p);
        gb.finish();
        int64_t dense_sum = 0, expert_sum = 0;  // sum of (r + 1) over dp and over expert_dp
        for (int r : dp.world_ranks()) dense_sum += grid->layout().coord(r).dp + 1;
        for (int r : grid->expert_dp().world_ranks()) expert_sum += grid->layout().coord(r).dp + 1;
        for (size_t i = 0; i < s.size(); ++i) {
          INFO(s.info(i).spec.name);
          const bool ex = s.info(i).spec.expert;
          std::vector<float> base(s.info(i).numel);
          fill_exact(base, 0, i + (ex ? 100 * er : 0));
          const double mult = static_cast<double>(ex ? expert_sum : dense_sum) / w;
          for (size_t k = 0; k < base.size(); ++k)
            REQUIRE(s.grad(i)[k] == Approx(base[k] * mult).epsilon(1e-6).margin(1e-7));
        }
      }
  }
}

TEST_CASE("global gradient norm counts every expert once", "[moe][optim]") {
  const int w = world().size();
  for (int ep = 1; ep <= w; ++ep) {
    if (w % ep != 0) continue;
    INFO("ep " << ep);
    auto grid = make_grid({1, 1, w, ep});
    ParamStore s = moe_store();
    // After a sync: dense grads equal on every rank; expert grads equal within expert_dp.
    const int er = grid->ep().rank();
    for (size_t i = 0; i < s.size(); ++i)
      fill_normal(s.grad(i), 5, i + (s.info(i).spec.expert ? 1000 * static_cast<uint64_t>(er) : 0));
    // Independent reference: every rank's expert sum of squares, gathered; ep ranks 0..ep-1 of
    // EP group 0 together hold each expert once (all EP groups hold the same values).
    double dense = 0, expert = 0;
    for (size_t i = 0; i < s.size(); ++i)
      for (float v : s.grad(i)) (s.info(i).spec.expert ? expert : dense) += double(v) * v;
    std::vector<double> all(static_cast<size_t>(w));
    world().all_gather(std::span<const double>(&expert, 1), std::span<double>(all)).wait();
    double want = dense;
    for (int r = 0; r < w; ++r)
      if (grid->layout().coord(r).dp < ep) want += all[static_cast<size_t>(r)];
    CHECK(global_grad_norm(s, *grid) == Approx(std::sqrt(want)).epsilon(1e-12));
  }
}

TEST_CASE("expert gradient sync refuses what it cannot do", "[moe][optim]") {
  const int w = world().size();
  if (w < 2) return;  // one rank reduces nothing
  auto grid = make_grid({1, 1, w, 2 <= w && w % 2 == 0 ? 2 : 1});
  ParamStore s = moe_store();
  CHECK_THROWS_WITH(GradBuffer(s, grid->dp()), Catch::Contains("'p2' is a MoE expert parameter"));
  if (grid->layout().ep() > 1) {
    ParamStore z = moe_store();
    GradBufferOptions o;
    o.sync = GradSync::reduce_scatter;
    o.expert_dp = &grid->expert_dp();
    ParamStore zp;
    for (const auto& p : z.infos()) zp.add(p.spec, p.local_shape);
    zp.finalize(static_cast<size_t>(w));
    CHECK_THROWS_WITH(GradBuffer(zp, grid->dp(), o), Catch::Contains("ZeRO-1 (reduce_scatter) with expert parallelism"));
    // The optimizer wires grid.expert_dp() by itself: plain DP works, ZeRO-1 is refused.
    OptimizerConfig oc;
    CHECK_NOTHROW(Optimizer(s, *grid, oc));
    oc.zero = 1;
    CHECK_THROWS_WITH(Optimizer(zp, *grid, oc), Catch::Contains("ZeRO-1"));
  }
}
