// GridLayout over every factorisation of 1..16 ranks and every axis order: groups partition the
// world, coordinates round-trip, neighbours and derived groups are right, bad layouts are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "triax/distributed/grid.h"

using namespace triax;

namespace {
const std::vector<std::string> kOrders = {"tp-dp-pp", "tp-pp-dp", "dp-tp-pp", "dp-pp-tp", "pp-tp-dp", "pp-dp-tp"};

std::vector<GridShape> all_shapes(int world) {
  std::vector<GridShape> out;
  for (int tp = 1; tp <= world; ++tp)
    for (int pp = 1; pp <= world; ++pp)
      if (world % (tp * pp) == 0)
        for (const auto& o : kOrders) out.push_back({tp, pp, world / (tp * pp), 1, o});
  return out;
}

void check_partition(const std::vector<std::vector<int>>& groups, int world, int group_size) {
  std::vector<int> seen(static_cast<size_t>(world), 0);
  for (const auto& g : groups) {
    REQUIRE(static_cast<int>(g.size()) == group_size);
    for (int r : g) ++seen[static_cast<size_t>(r)];
  }
  for (int s : seen) REQUIRE(s == 1);
}
}  // namespace

TEST_CASE("every factorisation of 1..16 ranks and every order is a consistent grid", "[grid]") {
  for (int world = 1; world <= 16; ++world) {
    for (const auto& shape : all_shapes(world)) {
      INFO("world " << world << " tp " << shape.tp << " pp " << shape.pp << " dp " << shape.dp << " " << shape.order);
      GridLayout g(world, shape);
      // Coordinates round-trip and are a bijection.
      std::set<std::tuple<int, int, int>> coords;
      for (int r = 0; r < world; ++r) {
        const auto c = g.coord(r);
        REQUIRE(g.rank_of(c) == r);
        coords.insert({c.tp, c.pp, c.dp});
      }
      REQUIRE(static_cast<int>(coords.size()) == world);
      // Groups along each axis partition the world; group rank == coordinate on the axis; the
      // other coordinates are constant inside a group.
      for (Axis a : kAxes) {
        const auto groups = g.groups(a);
        check_partition(groups, world, g.size(a));
        for (const auto& grp : groups)
          for (size_t i = 0; i < grp.size(); ++i) {
            const auto c = g.coord(grp[i]);
            REQUIRE(c[a] == static_cast<int>(i));
            for (Axis b : kAxes)
              if (b != a) REQUIRE(c[b] == g.coord(grp[0])[b]);
            REQUIRE(g.group(a, grp[i]) == grp);
          }
      }
      // The fastest axis has stride 1.
      const Axis fast = g.order()[0];
      if (g.size(fast) > 1) REQUIRE(g.coord(1)[fast] == 1);
      for (int r = 0; r < world; ++r) {
        const auto c = g.coord(r);
        // Model-parallel group: every rank with the same dp coordinate, tp x pp of them.
        const auto mp = g.model_parallel_group(r);
        REQUIRE(static_cast<int>(mp.size()) == shape.tp * shape.pp);
        for (int m : mp) REQUIRE(g.coord(m).dp == c.dp);
        REQUIRE(std::count(mp.begin(), mp.end(), r) == 1);
        // Neighbours.
        if (c.pp > 0) {
          REQUIRE(g.coord(g.prev_stage(r)).pp == c.pp - 1);
          REQUIRE(g.next_stage(g.prev_stage(r)) == r);
        } else {
          REQUIRE(g.prev_stage(r) == -1);
          REQUIRE(g.is_first_stage(r));
        }
        if (c.pp < shape.pp - 1) {
          REQUIRE(g.coord(g.next_stage(r)).tp == c.tp);
          REQUIRE(g.coord(g.next_stage(r)).dp == c.dp);
        } else {
          REQUIRE(g.next_stage(r) == -1);
          REQUIRE(g.is_last_stage(r));
        }
        REQUIRE(g.prev_stage_wrap(g.next_stage_wrap(r)) == r);
        // Embedding group: first and last stage of the same pipeline.
        const auto emb = g.embedding_group(r);
        if (shape.pp == 1) {
          REQUIRE(emb == std::vector<int>{r});
        } else if (c.pp == 0 || c.pp == shape.pp - 1) {
          REQUIRE(emb.size() == 2);
          REQUIRE(g.coord(emb[0]).pp == 0);
          REQUIRE(g.coord(emb[1]).pp == shape.pp - 1);
          REQUIRE(std::count(emb.begin(), emb.end(), r) == 1);
        } else {
          REQUIRE(emb.empty());
        }
      }
    }
  }
}

TEST_CASE("Megatron's default order keeps TP groups on consecutive ranks", "[grid]") {
  GridLayout g(8, {2, 2, 2, 1, "tp-dp-pp"});
  REQUIRE(g.group(Axis::tp, 0) == std::vector<int>{0, 1});
  REQUIRE(g.group(Axis::dp, 0) == std::vector<int>{0, 2});
  REQUIRE(g.group(Axis::pp, 0) == std::vector<int>{0, 4});
  REQUIRE(g.group(Axis::dp, 5) == std::vector<int>{5, 7});
  REQUIRE(g.embedding_group(6) == std::vector<int>{2, 6});
  REQUIRE(g.model_parallel_group(2) == std::vector<int>{2, 3, 6, 7});
}

TEST_CASE("expert parallel groups are carved from data parallel", "[grid]") {
  for (int dp : {2, 4, 8})
    for (int ep = 1; ep <= dp; ep *= 2) {
      GridLayout g(2 * dp, {2, 1, dp, ep, "tp-dp-pp"});
      std::vector<std::vector<int>> epg, edpg;
      for (int r = 0; r < g.world_size(); ++r) {
        const auto e = g.ep_group(r);
        const auto d = g.expert_dp_group(r);
        REQUIRE(static_cast<int>(e.size()) == ep);
        REQUIRE(static_cast<int>(d.size()) == dp / ep);
        // An EP group and an expert-DP group meet in exactly this rank, and both lie in r's DP group.
        const auto dpg = g.group(Axis::dp, r);
        for (int x : e) REQUIRE(std::count(dpg.begin(), dpg.end(), x) == 1);
        for (int x : d) REQUIRE(std::count(dpg.begin(), dpg.end(), x) == 1);
        int common = 0;
        for (int x : e) common += static_cast<int>(std::count(d.begin(), d.end(), x));
        REQUIRE(common == 1);
        if (g.coord(r).dp % ep == 0 && g.coord(r).dp < ep) epg.push_back(e);
      }
    }
}

TEST_CASE("bad layouts fail with the numbers", "[grid]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 2, 3, 1, "tp-dp-pp"}), Contains("2 x 2 x 3 = 12") && Contains("8 ranks"));
  REQUIRE_THROWS_WITH(GridLayout(8, {0, 2, 4, 1, "tp-dp-pp"}), Contains("tp=0"));
  REQUIRE_THROWS_WITH(GridLayout(8, {-2, 2, 2, 1, "tp-dp-pp"}), Contains("tp=-2"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 2, 2, 1, "tp-xp-pp"}), Contains("unknown axis 'xp'"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 2, 2, 1, "tp-tp-pp"}), Contains("appears twice"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 2, 2, 1, "tp-dp"}), Contains("must name the axes tp, pp and dp"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 4, 3, "tp-dp-pp"}), Contains("ep=3") && Contains("dp=4"));
  REQUIRE_THROWS_AS(GridLayout(0, {1, 1, 1, 1, "tp-dp-pp"}), ConfigError);
}

TEST_CASE("a TP group spanning hosts is refused unless allowed, naming ranks and hosts", "[grid]") {
  using Catch::Matchers::Contains;
  const std::vector<std::string> hosts = {"node-a", "node-a", "node-a", "node-b", "node-b", "node-b", "node-c", "node-c"};
  GridLayout ok(8, {2, 1, 4, 1, "tp-dp-pp"});
  // tp=2 pairs (0,1) (2,3) (4,5) (6,7): (2,3) spans node-a and node-b.
  REQUIRE_THROWS_WITH(check_tp_placement(ok, hosts, false),
                      Contains("[2,3]") && Contains("node-a has ranks [2]") && Contains("node-b has ranks [3]"));
  REQUIRE_NOTHROW(check_tp_placement(ok, hosts, true));
  const std::vector<std::string> fours = {"a", "a", "a", "a", "b", "b", "b", "b"};
  REQUIRE_NOTHROW(check_tp_placement(GridLayout(8, {4, 1, 2, 1, "tp-dp-pp"}), fours, false));
  // With dp fastest, TP pairs are (0,4) ... and cross hosts.
  REQUIRE_THROWS_AS(check_tp_placement(GridLayout(8, {2, 1, 4, 1, "dp-tp-pp"}), fours, false), ConfigError);
}
