// Collective alpha-beta model: group placement on nodes and the fat tree, ring / tree / p2p times
// written out by hand on a round-number cluster, calibration files and the sample fit.
#include <catch2/catch.hpp>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/collective_model.h"

using namespace triax::plan;
using triax::plan::test::round_cluster;
using triax::plan::test::ScratchDir;

TEST_CASE("groups are placed on nodes and fat-tree levels") {
  const Cluster c = round_cluster();  // 8 per node, 2 nodes per access switch
  auto g = place_group(c, 8, 1);
  CHECK((g.ranks == 8 && g.per_node == 8 && g.nodes == 1 && g.level == 0));
  g = place_group(c, 16, 1);
  CHECK((g.per_node == 8 && g.nodes == 2 && g.level == 1));
  g = place_group(c, 4, 8);  // one per node over 4 nodes: crosses access switches
  CHECK((g.per_node == 1 && g.nodes == 4 && g.level == 3));
  g = place_group(c, 8, 2);
  CHECK((g.per_node == 4 && g.nodes == 2 && g.level == 1));
  g = place_group(c, 1, 5);
  CHECK((g.ranks == 1 && g.nodes == 1 && g.level == 0));
}

TEST_CASE("steps and bus factors follow nccl-tests' definitions") {
  GroupPlacement g{8, 8, 1, 0};
  CHECK(algorithm_steps(CollectiveOp::all_reduce, Algorithm::ring, g) == 14);
  CHECK(algorithm_steps(CollectiveOp::all_gather, Algorithm::ring, g) == 7);
  CHECK(algorithm_steps(CollectiveOp::p2p, Algorithm::direct, g) == 1);
  GroupPlacement across{32, 8, 4, 1};
  CHECK(algorithm_steps(CollectiveOp::all_reduce, Algorithm::tree, across) == 2 * (2 + 7));
  CHECK(bus_factor(CollectiveOp::all_reduce, 8) == 1.75);
  CHECK(bus_factor(CollectiveOp::reduce_scatter, 8) == 0.875);
  CHECK(bus_factor(CollectiveOp::p2p, 8) == 1);
}

TEST_CASE("collective times on the round cluster, by hand") {
  const CollectiveModel net(round_cluster());
  // Inside a node: 10 us launch + 14 steps x 1 us + 1.75 x 1e9 B / 100 GB/s.
  auto one_node = place_group(net.cluster(), 8, 1);
  CHECK(net.seconds(CollectiveOp::all_reduce, one_node, 1e9) == Approx((10 + 14 + 17500) * 1e-6).epsilon(1e-12));
  CHECK(net.cost(CollectiveOp::all_reduce, one_node, 1e9).algorithm == Algorithm::ring);  // no tree in a node
  CHECK(net.seconds(CollectiveOp::all_gather, one_node, 8e8) == Approx((10 + 7 + 7000) * 1e-6).epsilon(1e-12));
  CHECK(net.seconds(CollectiveOp::reduce_scatter, one_node, 8e8) == Approx((10 + 7 + 7000) * 1e-6).epsilon(1e-12));

  // Two full nodes: 8 members per node drive 8 x 10 GB/s of NIC, narrower than NVLink's 100.
  auto two_nodes = place_group(net.cluster(), 16, 1);
  CHECK(net.link(CollectiveOp::all_reduce, Algorithm::ring, two_nodes).bus_gbps == 80);
  const double data_us = 2 * 15.0 / 16 * 1e9 / 80e3;
  auto ar = net.cost(CollectiveOp::all_reduce, two_nodes, 1e9);
  CHECK(ar.algorithm == Algorithm::tree);  // same bandwidth term, 16 steps instead of 30
  CHECK(ar.seconds == Approx((10 + 16 + data_us) * 1e-6).epsilon(1e-12));

  // One member per node over 4 nodes crosses the access switches: 10 GB/s / (2 x 3 x 1).
  auto spread = place_group(net.cluster(), 4, 8);
  CHECK(net.link(CollectiveOp::all_reduce, Algorithm::ring, spread).bus_gbps == Approx(10.0 / 6));
  CHECK(net.seconds(CollectiveOp::all_gather, spread, 6e8) == Approx((10 + 3 + 0.75 * 6e8 / (10.0 / 6 * 1e3)) * 1e-6));

  // p2p between neighbouring nodes under one access switch: full NIC share.
  auto pair = place_group(net.cluster(), 2, 8);
  CHECK(net.seconds(CollectiveOp::p2p, pair, 1e8) == Approx((10 + 1 + 1e8 / 1e4) * 1e-6).epsilon(1e-12));
  CHECK(net.seconds(CollectiveOp::all_reduce, place_group(net.cluster(), 1, 1), 1e9) == 0);
}

TEST_CASE("small messages across many nodes prefer the tree, large ones the ring on one node") {
  Cluster c = round_cluster();
  c.nodes = 64;
  c.nodes_per_access = 64;
  const CollectiveModel net(c);
  auto g = place_group(c, 64, 8);
  CHECK(net.cost(CollectiveOp::all_reduce, g, 1024).algorithm == Algorithm::tree);
  // Ring: 126 steps; tree: 2 x log2(64) = 12 steps.
  const double ring = net.cluster().collective_launch_us + 126 + 2 * 63.0 / 64 * 1024 / 10e3;
  const double tree = net.cluster().collective_launch_us + 12 + 2 * 63.0 / 64 * 1024 / 10e3;
  CHECK(net.seconds(CollectiveOp::all_reduce, g, 1024) == Approx(tree * 1e-6));
  CHECK(tree < ring);
}

TEST_CASE("a calibration entry replaces the cluster's alpha and bandwidth") {
  ScratchDir dir;
  const auto p = dir.write("cal.json", R"({"format": "triax-collective-calibration", "version": 1,
    "entries": [{"op": "all_reduce", "link": "intra", "algorithm": "ring", "alpha_us": 3, "bus_gbps": 50,
                 "launch_us": 0}]})");
  const Calibration cal = load_calibration(p);
  REQUIRE(cal.size() == 1);
  const CollectiveModel net(round_cluster(), cal);
  auto g = place_group(net.cluster(), 8, 1);
  CHECK(net.seconds(CollectiveOp::all_reduce, g, 1e9) == Approx((14 * 3 + 1.75e9 / 5e4) * 1e-6).epsilon(1e-12));
  // Other collectives keep the cluster's numbers.
  CHECK(net.seconds(CollectiveOp::all_gather, g, 8e8) == Approx((10 + 7 + 7000) * 1e-6).epsilon(1e-12));
}

TEST_CASE("samples are fitted back to the alpha and bandwidth that generated them") {
  const double alpha = 2.5, bus = 40;  // us per step, GB/s
  std::vector<Sample> samples;
  for (double bytes : {1e3, 1e5, 1e6, 3e7, 2e8}) samples.push_back({bytes, 14 * alpha + 1.75 * bytes / (bus * 1e3)});
  const auto k = fit_samples(CollectiveOp::all_reduce, Algorithm::ring, GroupPlacement{8, 8, 1, 0}, samples);
  CHECK(k.alpha_us == Approx(alpha).epsilon(1e-9));
  CHECK(k.bus_gbps == Approx(bus).epsilon(1e-9));
  CHECK(*k.launch_us == 0);

  // Across 2 nodes with 8 ranks each, the measured bus bandwidth is per node: stored per rank.
  std::vector<Sample> inter;
  for (double bytes : {1e4, 1e6, 1e8}) inter.push_back({bytes, 30 * 4.0 + 2 * 15.0 / 16 * bytes / 80e3});
  const auto ki = fit_samples(CollectiveOp::all_reduce, Algorithm::ring, GroupPlacement{16, 8, 2, 1}, inter);
  CHECK(ki.alpha_us == Approx(4).epsilon(1e-9));
  CHECK(ki.bus_gbps == Approx(10).epsilon(1e-9));

  CHECK_THROWS_WITH(fit_samples(CollectiveOp::all_reduce, Algorithm::ring, GroupPlacement{8, 8, 1, 0},
                                {{1e6, 10}, {1e6, 12}}),
                    Catch::Contains("2 or more distinct sizes"));
  CHECK_THROWS_WITH(fit_samples(CollectiveOp::all_gather, Algorithm::ring, GroupPlacement{8, 8, 1, 0},
                                {{1e3, 100}, {1e6, 10}}),
                    Catch::Contains("does not grow with size"));
  CHECK_THROWS_WITH(fit_samples(CollectiveOp::all_gather, Algorithm::ring, GroupPlacement{8, 8, 1, 0},
                                {{0, 100}, {1e6, 10}}),
                    Catch::Contains("positive size and time"));
}

TEST_CASE("JSON and TOML calibration files with samples give the same model") {
  ScratchDir dir;
  const auto js = dir.write("c.json", R"({"format": "triax-collective-calibration", "version": 1,
    "source": "comm_bench on node17",
    "entries": [
      {"op": "all_reduce", "link": "inter", "ranks": 16, "ranks_per_node": 8,
       "samples": [[10000, 120.234375], [1000000, 143.4375], [100000000, 2463.75]]},
      {"op": "p2p", "link": "inter", "algorithm": "direct", "alpha_us": 2, "bus_gbps": 20}]})");
  const auto ts = dir.write("c.toml", R"(format = "triax-collective-calibration"
version = 1
source = "comm_bench on node17"
[[entries]]
op = "all_reduce"
link = "inter"
ranks = 16
ranks_per_node = 8
samples = [[10000, 120.234375], [1000000, 143.4375], [100000000, 2463.75]]
[[entries]]
op = "p2p"
link = "inter"
algorithm = "direct"
alpha_us = 2
bus_gbps = 20
)");
  const Calibration a = load_calibration(js);
  const Calibration b = toml_supported() ? load_calibration(ts) : a;  // built without toml++: JSON only
  for (const Calibration* cal : {&a, &b}) {
    auto k = cal->find(CollectiveOp::all_reduce, LinkClass::inter, Algorithm::ring);
    REQUIRE(k);
    CHECK(k->alpha_us == Approx(4).epsilon(1e-9));  // the samples are 30 x 4 us + data / 80 GB/s
    CHECK(k->bus_gbps == Approx(10).epsilon(1e-9));
    auto p = cal->find(CollectiveOp::p2p, LinkClass::inter, Algorithm::direct);
    REQUIRE(p);
    CHECK(p->bus_gbps == 20);
    CHECK(!cal->find(CollectiveOp::all_gather, LinkClass::intra, Algorithm::ring));
  }
  // A group with 4 members per node on 2 nodes gets 4 x 10 GB/s from this calibration.
  const CollectiveModel net(round_cluster(), a);
  CHECK(net.link(CollectiveOp::all_reduce, Algorithm::ring, place_group(net.cluster(), 8, 2)).bus_gbps == Approx(40));
}

TEST_CASE("malformed calibration files are rejected naming the file and entry") {
  ScratchDir dir;
  auto json = [&](const std::string& entries) {
    return dir.write("bad.json", R"({"format": "triax-collective-calibration", "version": 1, "entries": [)" + entries + "]}");
  };
  struct Case {
    std::string entries, message;
  };
  const Case cases[] = {
      {R"({"op": "allreduce", "link": "intra", "alpha_us": 1, "bus_gbps": 1})", "unknown collective 'allreduce'"},
      {R"({"op": "all_reduce", "link": "nvlink", "alpha_us": 1, "bus_gbps": 1})", "unknown link class 'nvlink'"},
      {R"({"op": "all_reduce", "link": "intra", "alpha_us": 1, "bus_gbps": 1, "colour": 1})", "unknown key 'colour'"},
      {R"({"link": "intra", "alpha_us": 1, "bus_gbps": 1})", "needs \"op\" and \"link\""},
      {R"({"op": "all_reduce", "link": "intra"})", "either alpha_us and bus_gbps, or samples"},
      {R"({"op": "all_reduce", "link": "intra", "alpha_us": 1})", "alpha_us and bus_gbps go together"},
      {R"({"op": "all_reduce", "link": "intra", "alpha_us": 1, "bus_gbps": 0})", "bus_gbps must be > 0"},
      {R"({"op": "all_reduce", "link": "intra", "alpha_us": "1", "bus_gbps": 1})", "wrong type"},
      {R"({"op": "all_reduce", "link": "intra", "ranks": 8, "alpha_us": 1, "bus_gbps": 1, "samples": [[1, 1], [2, 2]]})",
       "not both"},
      {R"({"op": "all_reduce", "link": "intra", "samples": [[1, 1], [2, 2]]})", "samples need 'ranks' >= 2"},
      {R"({"op": "all_reduce", "link": "intra", "ranks": 8, "samples": [[1, 1, 1]]})", "each sample is [bytes, time_us]"},
      {R"({"op": "all_reduce", "link": "intra", "ranks": 8, "samples": [[1000, 5]]})", "2 or more distinct sizes"},
      {R"({"op": "all_reduce", "link": "inter", "ranks": 8, "ranks_per_node": 3, "samples": [[1, 1], [2, 2]]})",
       "ranks_per_node 3 must divide ranks 8"},
      {R"({"op": "all_reduce", "link": "intra", "ranks": 8, "ranks_per_node": 4, "samples": [[1, 1], [2, 2]]})",
       "link 'intra' but ranks 8 / ranks_per_node 4 = 2 nodes"},
  };
  for (const auto& k : cases) {
    INFO(k.message);
    const auto p = json(k.entries);
    CHECK_THROWS_AS(load_calibration(p), triax::IoError);
    CHECK_THROWS_WITH(load_calibration(p), Catch::Contains(k.message) && Catch::Contains("bad.json: entries[0]"));
  }
  CHECK_THROWS_WITH(load_calibration(dir.write("f.json", R"({"format": "nccl", "version": 1, "entries": []})")),
                    Catch::Contains("\"format\": \"triax-collective-calibration\""));
  CHECK_THROWS_WITH(load_calibration(dir.write("v.json", R"({"format": "triax-collective-calibration", "version": 2, "entries": []})")),
                    Catch::Contains("unsupported version"));
  CHECK_THROWS_WITH(load_calibration(dir.write("k.json", R"({"format": "triax-collective-calibration", "version": 1, "entries": [], "x": 1})")),
                    Catch::Contains("unknown key 'x'"));
  CHECK_THROWS_WITH(load_calibration(dir.write("n.json", "{not json")), Catch::Contains("n.json: not valid JSON"));
  CHECK_THROWS_WITH(load_calibration(dir.write("c.csv", "a,b")), Catch::Contains("end in .json or .toml"));
  CHECK_THROWS_WITH(load_calibration(dir.path() / "absent.json"), Catch::Contains("absent.json: calibration file does not exist"));
  if (toml_supported()) {
    CHECK_THROWS_WITH(load_calibration(dir.write("t.toml", "format = \"triax-collective-calibration\"\nversion = 1\n"
                                                           "[[entries]]\nop = \"p2p\"\nlink = \"inter\"\nalgorithm = \"direct\"\n"
                                                           "alpha_us = \"fast\"\nbus_gbps = 1\n")),
                      Catch::Contains("t.toml: entries[0]: alpha_us must be a number"));
    CHECK_THROWS_WITH(load_calibration(dir.write("u.toml", "format = \"triax-collective-calibration\"\nversion = 1\n"
                                                           "[[entries]]\nop = \"p2p\"\nlink = \"inter\"\nspeed = 3\n")),
                      Catch::Contains("unknown key 'speed'"));
  }
}

TEST_CASE("enum names round-trip and unknown names are rejected") {
  for (auto op : {CollectiveOp::all_reduce, CollectiveOp::all_gather, CollectiveOp::reduce_scatter, CollectiveOp::p2p})
    CHECK(parse_collective_op(to_string(op)) == op);
  for (auto a : {Algorithm::ring, Algorithm::tree, Algorithm::direct}) CHECK(parse_algorithm(to_string(a)) == a);
  for (auto l : {LinkClass::intra, LinkClass::inter}) CHECK(parse_link_class(to_string(l)) == l);
  CHECK_THROWS_WITH(parse_algorithm("butterfly"), Catch::Contains("expected one of: ring, tree, direct"));
}
