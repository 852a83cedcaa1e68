// Cluster presets and TOML files: the shipped clusters/*.toml equal the built-in presets, and every
// malformed file is rejected with a message naming the file and the key.
#include <catch2/catch.hpp>

#include <set>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/cluster.h"
#include "triax/plan/hetero.h"

using namespace triax::plan;
using triax::plan::test::ScratchDir;

namespace {

void require_same(const Cluster& a, const Cluster& b) {
  CHECK(a.name == b.name);
  CHECK(a.description == b.description);
  CHECK(a.gpus_per_node == b.gpus_per_node);
  CHECK(a.nodes == b.nodes);
  CHECK(a.peak_tflops_bf16 == b.peak_tflops_bf16);
  CHECK(a.peak_tflops_fp32 == b.peak_tflops_fp32);
  CHECK(a.gemm_efficiency == b.gemm_efficiency);
  CHECK(a.kernel_overhead_us == b.kernel_overhead_us);
  CHECK(a.sm_count == b.sm_count);
  CHECK(a.gemm_tile_m == b.gemm_tile_m);
  CHECK(a.gemm_tile_n == b.gemm_tile_n);
  CHECK(a.gemm_k_overhead == b.gemm_k_overhead);
  CHECK(a.attention_efficiency == b.attention_efficiency);
  CHECK(a.copy_gbps == b.copy_gbps);
  CHECK(a.cores_per_node == b.cores_per_node);
  CHECK(a.memory_gib == b.memory_gib);
  CHECK(a.memory_gbps == b.memory_gbps);
  CHECK(a.memory_efficiency == b.memory_efficiency);
  CHECK(a.reserved_gib == b.reserved_gib);
  CHECK(a.intra_gbps == b.intra_gbps);
  CHECK(a.intra_efficiency == b.intra_efficiency);
  CHECK(a.intra_latency_us == b.intra_latency_us);
  CHECK(a.nics_per_node == b.nics_per_node);
  CHECK(a.nic_gbps == b.nic_gbps);
  CHECK(a.nic_efficiency == b.nic_efficiency);
  CHECK(a.inter_latency_us == b.inter_latency_us);
  CHECK(a.collective_launch_us == b.collective_launch_us);
  CHECK(a.collective_buffer_mib == b.collective_buffer_mib);
  CHECK(a.nodes_per_access == b.nodes_per_access);
  CHECK(a.access_per_aggregation == b.access_per_aggregation);
  CHECK(a.oversub_access == b.oversub_access);
  CHECK(a.oversub_aggregation == b.oversub_aggregation);
  CHECK(a.oversub_core == b.oversub_core);
}

// A complete, valid cluster file; tests edit one line of it at a time.
const std::string kGood = R"(name = "t"
description = "test"
[node]
devices = 4
count = 2
[compute]
peak_tflops_bf16 = 100
peak_tflops_fp32 = 10.5
gemm_efficiency = 0.5
kernel_overhead_us = 1
[memory]
capacity_gib = 16
bandwidth_gbps = 900
efficiency = 0.9
reserved_gib = 1
[intra_node]
bandwidth_gbps = 50
efficiency = 0.8
latency_us = 2
[network]
nics_per_node = 2
nic_gbps = 12.5
efficiency = 0.9
latency_us = 3
[collectives]
launch_us = 5
buffer_mib = 16
[fat_tree]
nodes_per_access = 4
access_per_aggregation = 2
oversubscription = [2, 1.5, 1]
)";

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

}  // namespace

TEST_CASE("every built-in cluster preset is valid and has a distinct name") {
  std::set<std::string> names;
  for (const auto& c : cluster_presets()) {
    INFO(c.name);
    CHECK_NOTHROW(validate(c));
    CHECK(names.insert(c.name).second);
  }
  CHECK(cluster_preset("selene-a100").total_devices() == 4480);
  CHECK(cluster_preset("selene-a100").nic_share_gbps() == 25);
}

TEST_CASE("unknown cluster preset lists the known ones") {
  CHECK_THROWS_WITH(cluster_preset("frontier"), Catch::Contains("unknown cluster preset 'frontier'") &&
                                                    Catch::Contains("selene-a100") && Catch::Contains("cpu-local"));
}

TEST_CASE("clusters/*.toml are identical to the built-in presets of the same name") {
  if (!toml_supported()) {
    WARN("built without toml++: skipped");
    return;
  }
  const std::filesystem::path dir = std::filesystem::path(TRIAX_SOURCE_DIR) / "clusters";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    if (is_hetero_cluster_file(entry.path().string())) continue;  // node classes (test_plan_hetero.cpp)
    INFO(entry.path().string());
    const Cluster from_file = load_cluster_toml(entry.path());
    require_same(from_file, cluster_preset(from_file.name));
    CHECK(entry.path().stem() == from_file.name);
    ++files;
  }
  CHECK(files == int(cluster_presets().size()));
}

TEST_CASE("a TOML cluster file reads every field") {
  if (!toml_supported()) return;
  ScratchDir dir;
  const Cluster c = load_cluster_toml(dir.write("t.toml", kGood));
  CHECK(c.name == "t");
  CHECK(c.gpus_per_node == 4);
  CHECK(c.nodes == 2);
  CHECK(c.peak_tflops_bf16 == 100);
  CHECK(c.peak_tflops_fp32 == 10.5);
  CHECK(c.memory_gbps == 900);
  CHECK(c.intra_latency_us == 2);
  CHECK(c.nic_gbps == 12.5);
  CHECK(c.collective_buffer_mib == 16);
  CHECK(c.nodes_per_access == 4);
  CHECK(c.oversub_access == 2);
  CHECK(c.oversub_aggregation == 1.5);
  CHECK(c.oversub_core == 1);
  // resolve_cluster: a path ending in .toml is a file, a bare word a preset.
  CHECK(resolve_cluster((dir.path() / "t.toml").string()).name == "t");
  CHECK(resolve_cluster("cpu-local").name == "cpu-local");
}

TEST_CASE("malformed cluster files are rejected naming the file and the key") {
  if (!toml_supported()) return;
  ScratchDir dir;
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"devices = 4", "devices = 4\ngpus = 4", "unknown key 'node.gpus'"},
      {"launch_us = 5\n", "", "missing key collectives.launch_us"},
      {"count = 2", "count = 2.5", "node.count must be an integer"},
      {"peak_tflops_bf16 = 100", "peak_tflops_bf16 = \"fast\"", "compute.peak_tflops_bf16 must be a number"},
      {"[collectives]\nlaunch_us = 5\nbuffer_mib = 16\n", "", "missing section [collectives]"},
      {"oversubscription = [2, 1.5, 1]", "oversubscription = [2, 1.5]", "fat_tree.oversubscription must be an array of 3"},
      {"oversubscription = [2, 1.5, 1]", "oversubscription = [2, \"x\", 1]", "oversubscription[1] must be a number"},
      {"name = \"t\"", "name = \"t\"\ncolour = \"red\"", "unknown key 'colour'"},
      {"name = \"t\"\n", "", "missing key name"},
      {"devices = 4", "devices = ", "t.toml:"},  // parse error with line and column
  };
  for (const auto& k : cases) {
    INFO(k.message);
    const auto p = dir.write("t.toml", replace(kGood, k.from, k.to));
    CHECK_THROWS_AS(load_cluster_toml(p), triax::IoError);
    CHECK_THROWS_WITH(load_cluster_toml(p), Catch::Contains(k.message) && Catch::Contains("t.toml"));
  }
  CHECK_THROWS_WITH(load_cluster_toml(dir.path() / "absent.toml"), Catch::Contains("absent.toml: cluster file does not exist"));
}

TEST_CASE("out-of-range cluster values are ConfigErrors naming the field") {
  if (!toml_supported()) return;
  ScratchDir dir;
  struct Case {
    std::string from, to, message;
  };
  const Case cases[] = {
      {"gemm_efficiency = 0.5", "gemm_efficiency = 1.5", "gemm_efficiency must be in (0, 1]"},
      {"devices = 4", "devices = 0", "gpus_per_node must be positive"},
      {"oversubscription = [2, 1.5, 1]", "oversubscription = [0.5, 1.5, 1]", "oversubscription access must be >= 1"},
      {"reserved_gib = 1", "reserved_gib = 16", "reserved_gib 16 leaves nothing"},
      {"nic_gbps = 12.5", "nic_gbps = 0", "nic_gbps must be positive"},
  };
  for (const auto& k : cases) {
    INFO(k.message);
    const auto p = dir.write("t.toml", replace(kGood, k.from, k.to));
    CHECK_THROWS_AS(load_cluster_toml(p), triax::ConfigError);
    CHECK_THROWS_WITH(load_cluster_toml(p), Catch::Contains(k.message) && Catch::Contains("t.toml"));
  }
}

TEST_CASE("validate catches each out-of-range field of a preset") {
  Cluster c = cluster_preset("selene-a100");
  auto expect = [&](auto field, double value, const char* name) {
    Cluster bad = c;
    bad.*field = value;
    INFO(name);
    CHECK_THROWS_WITH(validate(bad), Catch::Contains(name));
  };
  expect(&Cluster::memory_efficiency, 0, "memory_efficiency");
  expect(&Cluster::intra_efficiency, 2, "intra_efficiency");
  expect(&Cluster::memory_gbps, -1, "memory_gbps");
  expect(&Cluster::intra_latency_us, -1, "intra_latency_us");
  expect(&Cluster::oversub_core, 0.9, "core");
  Cluster bad = c;
  bad.name = "";
  CHECK_THROWS_WITH(validate(bad), Catch::Contains("name must not be empty"));
  // A single node needs no network.
  Cluster one = cluster_preset("cpu-local");
  CHECK_NOTHROW(validate(one));
}
