// GridLayout over every factorisation of 1..16 ranks and every axis order: groups partition the
// world, coordinates round-trip, neighbours and derived groups are right, bad layouts are refused.
// With context parallelism (cp > 1): every 4-axis order, the dp x cp weight groups, 3-axis orders
// placing cp after tp, and the tp x cp host-placement check on fake host lists.
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

// ---- Context parallelism: the fourth axis (issue 28) ----
namespace {
// Every order of the four axes, fastest first.
std::vector<std::string> four_axis_orders() {
  std::vector<std::string> axes = {"cp", "dp", "pp", "tp"}, out;
  do out.push_back(axes[0] + "-" + axes[1] + "-" + axes[2] + "-" + axes[3]);
  while (std::next_permutation(axes.begin(), axes.end()));
  return out;
}

// Every tp x cp x pp x dp factorisation of world with cp > 1.
std::vector<GridShape> cp_shapes(int world, const std::vector<std::string>& orders) {
  std::vector<GridShape> out;
  for (int cp = 2; cp <= world; ++cp)
    for (int tp = 1; tp * cp <= world; ++tp)
      for (int pp = 1; tp * cp * pp <= world; ++pp)
        if (world % (tp * cp * pp) == 0)
          for (const auto& o : orders) out.push_back({tp, pp, world / (tp * cp * pp), 1, o, cp});
  return out;
}

void check_cp_groups(const GridLayout& g) {
  const int world = g.world_size(), cp = g.size(Axis::cp), dp = g.size(Axis::dp);
  std::set<std::tuple<int, int, int, int>> coords;
  for (int r = 0; r < world; ++r) {
    const auto c = g.coord(r);
    REQUIRE(g.rank_of(c) == r);
    coords.insert({c.tp, c.pp, c.dp, c.cp});
  }
  REQUIRE(static_cast<int>(coords.size()) == world);
  for (Axis a : kAxes) check_partition(g.groups(a), world, g.size(a));
  std::set<std::vector<int>> dpcp_groups;
  for (int r = 0; r < world; ++r) {
    const auto c = g.coord(r);
    // dp x cp: the ranks with this rank's tp and pp, dp-major (group rank = dp * cp_size + cp).
    const auto grp = g.dp_cp_group(r);
    REQUIRE(static_cast<int>(grp.size()) == dp * cp);
    for (size_t i = 0; i < grp.size(); ++i) {
      const auto m = g.coord(grp[i]);
      REQUIRE(m.tp == c.tp);
      REQUIRE(m.pp == c.pp);
      REQUIRE(m.dp * cp + m.cp == static_cast<int>(i));
    }
    REQUIRE(grp[static_cast<size_t>(c.dp * cp + c.cp)] == r);
    REQUIRE(g.expert_dp_cp_group(r) == grp);  // ep 1: expert-DP is DP
    dpcp_groups.insert(grp);
    // The model-parallel group keeps dp and cp: CP ranks are separate replicas of the model's shards.
    for (int m : g.model_parallel_group(r)) {
      REQUIRE(g.coord(m).dp == c.dp);
      REQUIRE(g.coord(m).cp == c.cp);
    }
    if (c.pp < g.size(Axis::pp) - 1) REQUIRE(g.coord(g.next_stage(r)).cp == c.cp);
  }
  check_partition({dpcp_groups.begin(), dpcp_groups.end()}, world, dp * cp);
}
}  // namespace

TEST_CASE("with cp, every factorisation and 4-axis order is a consistent grid; dp x cp groups partition it", "[grid][cp]") {
  const auto orders = four_axis_orders();
  REQUIRE(orders.size() == 24);
  int layouts = 0;
  for (int world = 2; world <= 16; ++world)
    for (const auto& shape : cp_shapes(world, orders)) {
      INFO("world " << world << " tp " << shape.tp << " cp " << shape.cp << " pp " << shape.pp << " dp " << shape.dp
                    << " " << shape.order);
      const GridLayout g(world, shape);
      check_cp_groups(g);
      // The fastest axis has stride 1.
      if (g.size(g.order()[0]) > 1) REQUIRE(g.coord(1)[g.order()[0]] == 1);
      ++layouts;
    }
  REQUIRE(layouts > 1000);
}

TEST_CASE("a 3-axis order places cp right after tp", "[grid][cp]") {
  const std::vector<std::pair<std::string, std::string>> same = {
      {"tp-dp-pp", "tp-cp-dp-pp"}, {"tp-pp-dp", "tp-cp-pp-dp"}, {"dp-tp-pp", "dp-tp-cp-pp"},
      {"dp-pp-tp", "dp-pp-tp-cp"}, {"pp-tp-dp", "pp-tp-cp-dp"}, {"pp-dp-tp", "pp-dp-tp-cp"}};
  for (const auto& [three, four] : same)
    for (const GridShape& s : {GridShape{2, 2, 2, 1, three, 2}, GridShape{1, 2, 1, 1, three, 4}, GridShape{2, 1, 3, 1, three, 2}}) {
      const int world = s.tp * s.pp * s.dp * s.cp;
      INFO(three << " vs " << four << " tp " << s.tp << " cp " << s.cp << " pp " << s.pp << " dp " << s.dp);
      GridShape s4 = s;
      s4.order = four;
      const GridLayout a(world, s), b(world, s4);
      REQUIRE(a.order() == b.order());
      for (int r = 0; r < world; ++r) REQUIRE(a.coord(r) == b.coord(r));
    }
  // Megatron's default: TP pairs, then the CP ring over consecutive TP blocks, then DP, then PP.
  const GridLayout g(16, {2, 2, 2, 1, "tp-dp-pp", 2});
  CHECK(g.group(Axis::tp, 0) == std::vector<int>{0, 1});
  CHECK(g.group(Axis::cp, 0) == std::vector<int>{0, 2});
  CHECK(g.group(Axis::dp, 0) == std::vector<int>{0, 4});
  CHECK(g.group(Axis::pp, 0) == std::vector<int>{0, 8});
  CHECK(g.dp_cp_group(1) == std::vector<int>{1, 3, 5, 7});
  CHECK(g.describe() == "tp=2 pp=2 dp=2 cp=2 order=tp-dp-pp");
}

TEST_CASE("expert-DP x cp groups: expert_dp x cp ranks holding the same experts", "[grid][cp]") {
  const GridLayout g(16, {1, 1, 8, 2, "tp-dp-pp", 2});  // ep 2 of dp 8, cp 2
  for (int r = 0; r < 16; ++r) {
    const auto c = g.coord(r);
    const auto grp = g.expert_dp_cp_group(r);
    REQUIRE(grp.size() == 8);  // dp / ep = 4 expert-DP ranks x cp 2
    for (size_t i = 0; i < grp.size(); ++i) {
      const auto m = g.coord(grp[i]);
      REQUIRE(m.dp % 2 == c.dp % 2);  // the same experts
      REQUIRE((m.dp / 2) * 2 + m.cp == static_cast<int>(i));
    }
  }
}

TEST_CASE("bad cp layouts fail with the numbers", "[grid][cp]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 3, 1, "tp-dp-pp", 2}),
                      Contains("tp x cp x pp x dp = 2 x 2 x 1 x 3 = 12") && Contains("8 ranks"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 4, 1, "tp-dp-pp", 0}), Contains("cp=0"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 2, 1, "tp-cp-cp-pp", 2}), Contains("axis 'cp' appears twice"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 2, 1, "tp-cp-dp", 2}), Contains("must name the axes tp, pp and dp"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 2, 1, "tp-cp-dp-pp-cp", 2}), Contains("'tp-cp-dp-pp-cp'"));
  REQUIRE_THROWS_WITH(GridLayout(8, {2, 1, 2, 1, "tp-xp-dp-pp", 2}), Contains("unknown axis 'xp'"));
}

TEST_CASE("a tp x cp block spanning hosts is refused where every host could hold one", "[grid][cp]") {
  using Catch::Matchers::Contains;
  const std::vector<std::string> fours = {"a", "a", "a", "a", "b", "b", "b", "b"};
  // tp 2, cp 2, dp 2: blocks {0..3} and {4..7} with tp and cp fastest.
  REQUIRE_NOTHROW(check_tp_placement(GridLayout(8, {2, 1, 2, 1, "tp-cp-dp-pp", 2}), fours, false));
  REQUIRE_NOTHROW(check_tp_placement(GridLayout(8, {2, 1, 2, 1, "tp-dp-pp", 2}), fours, false));  // cp after tp
  // dp between tp and cp: TP pairs stay inside a host, but the block of TP pairs (0,1) and (4,5) spans both.
  const GridLayout split(8, {2, 1, 2, 1, "tp-dp-cp-pp", 2});
  REQUIRE_THROWS_WITH(check_tp_placement(split, fours, false),
                      Contains("tp x cp block of world ranks [0,1,4,5]") && Contains("spans 2 hosts") &&
                          Contains("tp=2 cp=2") && Contains("at least 4 ranks"));
  REQUIRE_THROWS_AS(check_tp_placement(GridLayout(8, {2, 1, 2, 1, "tp-dp-pp-cp", 2}), fours, false), ConfigError);
  REQUIRE_NOTHROW(check_tp_placement(split, fours, true));
  // Hosts of two ranks cannot hold a block of four: spanning is unavoidable, only TP must fit.
  const std::vector<std::string> twos = {"a", "a", "b", "b", "c", "c", "d", "d"};
  REQUIRE_NOTHROW(check_tp_placement(split, twos, false));
  // A host of two ranks beside one of six: not every host can hold a block, so none is required
  // (the block {4,5,6,7} spans a and b); the TP pairs still fit.
  const std::vector<std::string> uneven = {"a", "a", "a", "a", "a", "a", "b", "b"};
  REQUIRE_NOTHROW(check_tp_placement(GridLayout(8, {2, 1, 2, 1, "tp-cp-dp-pp", 2}), uneven, false));
  // cp fastest, tp after it: the TP group (0,2) crosses no host, the block {0,1,2,3} neither.
  REQUIRE_NOTHROW(check_tp_placement(GridLayout(8, {2, 1, 2, 1, "cp-tp-dp-pp", 2}), fours, false));
  // A TP group that spans hosts is still refused with cp (the TP check runs too).
  REQUIRE_THROWS_WITH(check_tp_placement(GridLayout(8, {2, 1, 1, 1, "dp-cp-pp-tp", 4}), twos, false),
                      Contains("tensor-parallel group"));
}
