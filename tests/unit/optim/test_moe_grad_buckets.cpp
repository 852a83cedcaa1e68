// Gradient buckets of a store holding MoE experts: with split_experts no bucket mixes expert and
// dense parameters, the expert buckets are marked, and the other rules (cover, order, target size)
// still hold; GradBuffer refuses a store with experts but no expert_dp group, and ZeRO-1 with ep > 1.
#include <catch2/catch.hpp>

#include "support/optim_fixture.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/optim/grad_buffer.h"

using namespace triax;

namespace {
ParamStore moe_store() {
  // dense, 2 experts, dense, 1 expert at the end (a router between them, like a MoE layer).
  const std::vector<std::pair<int64_t, bool>> ps = {{37, false}, {5, false}, {61, true}, {7, true},
                                                    {11, false}, {29, true}, {3, true},  {13, false},
                                                    {17, true}};
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

TEST_CASE("plan_grad_buckets: split_experts never mixes experts with dense parameters", "[moe]") {
  const ParamStore s = moe_store();
  for (size_t target : {size_t{0}, size_t{1}, size_t{20}, size_t{100}, size_t{1000}}) {
    INFO("target " << target);
    for (std::optional<size_t> tied : {std::optional<size_t>{}, std::optional<size_t>{0}}) {
      const auto bs = plan_grad_buckets(s.infos(), s.padded_numel(), 1, target, tied, true);
      std::vector<int> seen(s.padded_numel(), 0);
      for (const auto& b : bs) {
        for (size_t i = b.begin; i < b.end; ++i) ++seen[i];
        REQUIRE(!b.params.empty());
        for (size_t p : b.params) CHECK(s.info(p).spec.expert == b.expert);
      }
      for (int c : seen) CHECK(c == 1);
      // Reverse order: bucket 0 holds the last parameter.
      CHECK(bs.front().end == s.padded_numel());
    }
    // Without the split, one big bucket mixes them and nothing is marked.
    const auto one = plan_grad_buckets(s.infos(), s.padded_numel(), 1, 0);
    REQUIRE(one.size() == 1);
    CHECK_FALSE(one[0].expert);
  }
  // target 0 (one bucket per region) still splits at each of the 5 kind changes: 6 buckets.
  CHECK(plan_grad_buckets(s.infos(), s.padded_numel(), 1, 0, std::nullopt, true).size() == 6);
  CHECK_THROWS_WITH(plan_grad_buckets(s.infos(), s.padded_numel(), 2, 0, std::nullopt, true),
                    Catch::Contains("ZeRO-1 with expert parallelism"));
}

TEST_CASE("GradBuffer with experts on one rank needs no expert group", "[moe]") {
  ParamStore s = moe_store();
  auto dp = make_self_communicator("dp", 0);
  GradBuffer gb(s, *dp);  // dp = 1: nothing to reduce, experts or not
  for (size_t i = 0; i < s.size(); ++i) s.grad(i)[0] = static_cast<float>(i + 1);
  gb.finish();
  for (size_t i = 0; i < s.size(); ++i) CHECK(s.grad(i)[0] == static_cast<float>(i + 1));
}
