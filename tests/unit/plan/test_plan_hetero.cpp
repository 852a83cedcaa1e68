// Heterogeneous clusters in the planner: node-class files, plan pricing against estimate(), the
// search's layer splits and DP shares, and the train_gpt config it writes.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>

#include "triax/config/train_config.h"
#include "triax/core/error.h"
#include "triax/plan/hetero.h"

using namespace triax::plan;
using Catch::Matchers::Contains;

namespace {

// A cluster of two classes of one-device nodes; `fast` computes `ratio` times faster than `slow`.
HeteroCluster two_classes(double ratio, const Cluster& base = cluster_preset("selene-a100")) {
  Cluster slow = base;
  slow.gpus_per_node = 1;
  slow.nodes = 1;
  Cluster fast = slow;
  fast.peak_tflops_bf16 *= ratio;
  fast.peak_tflops_fp32 *= ratio;
  fast.memory_gbps *= ratio;
  fast.copy_gbps *= ratio;
  fast.kernel_overhead_us /= ratio;
  return HeteroCluster{"two", "", {{"fast", 1, fast}, {"slow", 1, slow}}, slow};
}

ModelShape small_model() {
  ModelShape m = model_preset("gpt2-medium");  // 24 layers
  m.global_batch = 48;
  m.vocab = 1024;  // an LM head of about 1/10 layer: the last stage's extra work does not move the split
  return m;
}

HeteroSearchSpace pinned(int tp, int pp, int dp, int mbs) {
  HeteroSearchSpace s;
  s.tp = {tp};
  s.pp = {pp};
  s.dp = {dp};
  s.micro_batch = {mbs};
  s.recompute = {Recompute::none};
  s.zero = {0};
  return s;
}

// The search's best plan (the search must find one).
HeteroChoice best_plan(const ModelShape& m, const HeteroCluster& hc, const HeteroSearchSpace& s) {
  const HeteroSearchResult r = search_hetero(m, hc, s);
  REQUIRE(!r.best.empty());
  return r.best.front();
}

// train_gpt's reading of an emitted file (`key` is an option the file relies on).
std::optional<triax::TrainConfig> read_config(const std::string& text, const char* key) {
  REQUIRE(triax::find_train_option(key) != nullptr);
  triax::TrainConfig cfg;
  triax::apply_config_text(cfg, text, "run.toml");
  return cfg;
}

std::filesystem::path write_file(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / "triax_test_plan_hetero";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

}  // namespace

TEST_CASE("identical classes with an even split reproduce estimate()", "[plan][hetero]") {
  const ModelShape m = small_model();
  struct Case {
    const char* cluster;
    int tp, pp, dp, mbs, zero;
    bool by_stage;
  };
  for (const Case& k : {Case{"selene-a100", 2, 2, 2, 2, 0, true}, Case{"selene-a100", 1, 4, 2, 1, 1, false},
                        Case{"dgx-h100", 4, 2, 1, 4, 0, true}, Case{"cpu-local", 1, 2, 2, 2, 0, false}}) {
    CAPTURE(k.cluster, k.tp, k.pp, k.dp, k.mbs, k.zero);
    Cluster c = cluster_preset(k.cluster);
    if (c.cores_per_node > 0) c.gpus_per_node = 4;  // 4 ranks time-slicing 2 cores: core_sharing priced
    Layout l;
    l.tp = k.tp, l.pp = k.pp, l.dp = k.dp, l.micro_batch = k.mbs, l.zero = k.zero;
    if (c.cores_per_node > 0) l.precision = Precision::fp32;
    const Estimate ref = estimate(m, CollectiveModel(c), l);
    const HeteroCluster hc{"twin", "", {{"a", c.nodes, c}, {"b", c.nodes, c}}, c};
    HeteroPlan p;
    p.layout = l;
    p.stage_layers.assign(size_t(l.pp), m.layers / l.pp);
    p.replica_microbatches.assign(size_t(l.dp), ref.micro_batches);
    if (k.by_stage) {
      for (int s = 0; s < l.pp; ++s) p.stage_classes.push_back(s % 2);
    } else {
      p.replica_classes.assign(size_t(l.dp), 0);
    }
    const HeteroEstimate e = estimate_hetero(m, hc, p);
    CHECK(e.seconds == Approx(ref.seconds_per_iteration).epsilon(0.01));
    if (c.cores_per_node > 0) CHECK(e.core_sharing > 0);
    const double mem = std::max(e.classes[0].memory.total(), e.classes[1].memory.total());
    CHECK(mem == Approx(ref.memory.total()).epsilon(0.01));
  }
}

TEST_CASE("a class twice as fast gets about 2/3 of the layers and of the micro-batches", "[plan][hetero]") {
  const ModelShape m = small_model();
  const HeteroCluster hc = two_classes(2.0);
  SECTION("pipeline: fast, slow") {
    HeteroSearchSpace s = pinned(1, 2, 1, 1);
    s.stage_classes = {0, 1};
    const HeteroSearchResult r = search_hetero(m, hc, s);
    REQUIRE(!r.best.empty());
    const HeteroChoice& c = r.best.front();
    const double fast_share = double(c.plan.plan.stage_layers[0]) / m.layers;
    CHECK(fast_share > 0.6);
    CHECK(fast_share < 0.75);
    CHECK(c.even.plan.stage_layers == std::vector<int>{12, 12});
    CHECK(c.speedup() > 1.15);
    CHECK(c.plan.classes[0].utilisation > c.even.classes[0].utilisation);
  }
  SECTION("--even prices the even split of the same placement on its own") {
    HeteroSearchSpace s = pinned(1, 2, 1, 1);
    s.stage_classes = {0, 1};
    const HeteroChoice planned = best_plan(m, hc, s);
    s.even = true;
    const HeteroChoice even = best_plan(m, hc, s);
    CHECK(even.plan.plan.stage_layers == std::vector<int>{12, 12});
    CHECK(even.plan.seconds == Approx(planned.even.seconds));
    CHECK(even.plan.seconds > planned.plan.seconds);
  }
  SECTION("data parallel: one replica on each class") {
    const HeteroSearchResult r = search_hetero(m, hc, pinned(1, 1, 2, 1));
    REQUIRE(!r.best.empty());
    const HeteroChoice& c = r.best.front();
    REQUIRE(c.plan.plan.replica_classes == std::vector<int>{0, 1});
    const double fast_share = double(c.plan.plan.replica_microbatches[0]) / c.plan.plan.microbatches();
    CHECK(fast_share == Approx(2.0 / 3).margin(0.05));
    CHECK(c.even.plan.replica_microbatches == std::vector<long>{24, 24});
    CHECK(c.speedup() == Approx(1.5).margin(0.1));  // 2/3 of the work at twice the speed vs half on the slow
  }
}

TEST_CASE("balanced splits follow the stage and replica times", "[plan][hetero]") {
  CHECK(balance_layers(9, {0, 0}, {1, 2}, {100, 100}) == std::vector<int>{6, 3});
  CHECK(balance_layers(9, {0, 0}, {1, 1}, {3, 100}) == std::vector<int>{3, 6});  // memory cap
  CHECK(balance_layers(9, {0, 0}, {1, 1}, {3, 3}).empty());                      // does not fit
  CHECK(balance_microbatches(12, {1, 2}, {1, 2}) == std::vector<long>{8, 4});
  CHECK(balance_microbatches(1, {1, 1}, {1, 1}).empty());
}

TEST_CASE("a class with less memory gets fewer layers", "[plan][hetero]") {
  ModelShape m = small_model();
  HeteroCluster hc = two_classes(1.0);
  // The poor class holds about 0.8 of what an even first stage needs.
  Layout l;
  l.pp = 2;
  l.micro_batch = 4;
  const std::vector<StageCost> even = stage_costs(m, CollectiveModel(hc.classes[1].device), l, {12, 12}, 12);
  hc.classes[1].device.memory_gib = 0.8 * even[0].memory.total() / (1024.0 * 1024 * 1024);
  HeteroSearchSpace s = pinned(1, 2, 1, 4);
  s.stage_classes = {1, 0};  // the poor class first
  const HeteroSearchResult r = search_hetero(m, hc, s);
  REQUIRE(!r.best.empty());
  const HeteroChoice& c = r.best.front();
  CHECK(c.plan.plan.stage_layers[0] < 12);
  CHECK(c.plan.fits);
  CHECK_FALSE(c.even.fits);
  CHECK(c.plan.classes[1].memory.total() <= c.plan.classes[1].memory.capacity);
}

TEST_CASE("the mixed H100/A100 example file loads and is searched", "[plan][hetero]") {
  const auto file = std::filesystem::path(TRIAX_SOURCE_DIR) / "clusters" / "mixed-h100-a100.toml";
  REQUIRE(is_hetero_cluster_file(file.string()));
  const HeteroCluster hc = load_hetero_cluster(file);
  REQUIRE(hc.classes.size() == 2);
  CHECK(hc.classes[0].name == "h100");
  CHECK(hc.classes[0].devices() == 64);
  CHECK(hc.classes[1].name == "a100");
  CHECK(hc.classes[1].devices() == 16);
  CHECK(hc.classes[0].device.peak_tflops_bf16 > 2 * hc.classes[1].device.peak_tflops_bf16);
  CHECK(hc.between.nic_gbps == 25.0);
  CHECK(hc.total_devices() == 80);
  // A homogeneous file is one class "default".
  const HeteroCluster one = load_hetero_cluster(std::filesystem::path(TRIAX_SOURCE_DIR) / "clusters" / "cpu-local.toml");
  REQUIRE(one.classes.size() == 1);
  CHECK(one.classes[0].name == "default");
  CHECK_FALSE(is_hetero_cluster_file((std::filesystem::path(TRIAX_SOURCE_DIR) / "clusters" / "cpu-local.toml").string()));
}

TEST_CASE("classes without a network share one machine: the CPU two-speed file", "[plan][hetero]") {
  const HeteroCluster hc =
      load_hetero_cluster(std::filesystem::path(TRIAX_SOURCE_DIR) / "clusters" / "cpu-two-speeds.toml");
  REQUIRE(hc.classes.size() == 2);
  CHECK(hc.classes[0].devices() == 1);
  CHECK(hc.between.gpus_per_node == 2);  // both ranks on one node: the shared-memory link
  ModelShape m;  // train_bench's default model
  m.layers = 8, m.hidden = 128, m.heads = 4, m.seq = 128, m.vocab = 256, m.global_batch = 32;
  HeteroSearchSpace s = pinned(1, 1, 2, 4);
  s.base.precision = Precision::fp32;
  const HeteroChoice dp = best_plan(m, hc, s);
  CHECK(std::isfinite(dp.plan.seconds));
  CHECK(dp.plan.sync > 0);
  CHECK(dp.plan.plan.replica_microbatches[0] > dp.plan.plan.replica_microbatches[1]);
  CHECK(dp.speedup() > 1.1);
  s = pinned(1, 2, 1, 4);
  s.base.precision = Precision::fp32;
  s.stage_classes = {0, 1};
  const HeteroChoice pp = best_plan(m, hc, s);
  CHECK(std::isfinite(pp.plan.seconds));
  CHECK(pp.plan.plan.stage_layers[0] > pp.plan.plan.stage_layers[1]);
}

TEST_CASE("ZeRO 2/3 plans keep equal DP shares (the runtime refuses unequal ones there)", "[plan][hetero]") {
  const HeteroCluster hc = two_classes(2.0);
  const ModelShape m = small_model();
  HeteroSearchSpace s = pinned(1, 1, 2, 1);
  s.zero = {0, 1, 2, 3};
  s.top_k = 100;
  const HeteroSearchResult r = search_hetero(m, hc, s);
  bool uneven_low = false, zero_high = false;
  for (const auto& c : r.best) {
    const auto& v = c.plan.plan.replica_microbatches;
    const bool equal = std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end();
    if (c.plan.plan.layout.zero >= 2) {
      zero_high = true;
      CHECK(equal);
    } else if (!equal) {
      uneven_low = true;
    }
  }
  CHECK(zero_high);   // ZeRO 2/3 are still searched (with even shares) ...
  CHECK(uneven_low);  // ... and ZeRO 0/1 plans take the uneven shares that pay
  CHECK(r.best.front().plan.plan.layout.zero <= 1);
}

TEST_CASE("bad heterogeneous cluster files name the file, the class and the key", "[plan][hetero]") {
  const std::string head = "name = \"bad\"\n";
  const std::string fast = "[[node_class]]\nname = \"fast\"\ncount = 1\nbase = \"dgx-h100\"\n";
  struct Bad {
    const char* file;
    std::string text;
    std::vector<const char*> says;
  };
  const std::vector<Bad> cases = {
      {"unknown_key.toml", head + fast + "speed = 2\n", {"unknown_key.toml", "'fast'", "unknown key 'speed'"}},
      {"count.toml", head + "[[node_class]]\nname = \"slow\"\ncount = 0\nbase = \"dgx-h100\"\n",
       {"count.toml", "'slow'", "count must be an integer >= 1"}},
      {"dup.toml", head + fast + fast, {"dup.toml", "duplicate class name 'fast'"}},
      {"nobase.toml", head + "[[node_class]]\nname = \"slow\"\ncount = 1\n", {"nobase.toml", "'slow'", "missing key 'base'"}},
      {"badbase.toml", head + "[[node_class]]\nname = \"slow\"\ncount = 1\nbase = \"tpu9\"\n",
       {"badbase.toml", "'slow'", "unknown cluster preset 'tpu9'"}},
      {"override.toml", head + fast + "[node_class.compute]\npeak_tflops = 3\n",
       {"override.toml", "'fast'", "compute.peak_tflops"}},
      {"top.toml", head + "classes = 2\n" + fast, {"top.toml", "unknown key 'classes'"}},
  };
  for (const Bad& b : cases) {
    CAPTURE(b.file);
    const auto path = write_file(b.file, b.text);
    try {
      (void)load_hetero_cluster(path);
      FAIL("no error for " << b.file);
    } catch (const triax::Error& e) {
      for (const char* s : b.says) CHECK_THAT(std::string(e.what()), Contains(s));
    }
  }
}

TEST_CASE("overrides and relative bases apply per class", "[plan][hetero]") {
  const auto base = write_file("base.toml", cluster_toml(cluster_preset("cpu-local")));
  const auto file = write_file("mixed.toml", "name = \"m\"\n[[node_class]]\nname = \"fast\"\ncount = 1\nbase = "
                                             "\"base.toml\"\n[[node_class]]\nname = \"slow\"\ncount = 2\nbase = "
                                             "\"selene-a100\"\n[node_class.compute]\npeak_tflops_fp32 = 0.05\n");
  (void)base;
  const HeteroCluster hc = load_hetero_cluster(file);
  REQUIRE(hc.classes.size() == 2);
  CHECK(hc.classes[0].device.peak_tflops_fp32 == Approx(0.097));
  CHECK(hc.classes[1].device.peak_tflops_fp32 == Approx(0.05));
  CHECK(hc.classes[1].device.peak_tflops_bf16 == Approx(cluster_preset("selene-a100").peak_tflops_bf16));
  CHECK(hc.classes[1].nodes == 2);
  CHECK(hc.classes[1].device.nodes == 2);
}

TEST_CASE("the emitted config is what train_gpt reads", "[plan][hetero]") {
  const ModelShape m = small_model();
  const HeteroCluster hc = two_classes(2.0);
  HeteroSearchSpace s = pinned(1, 2, 1, 2);
  s.stage_classes = {0, 1};
  const HeteroChoice c = best_plan(m, hc, s);
  const std::string text = train_config_toml(m, c, hc, "run.toml");
  CHECK_THAT(text, Contains("mpirun -np 1 -x TRIAX_DEVICE_CLASS=fast train_gpt --config run.toml : -np 1 -x "
                            "TRIAX_DEVICE_CLASS=slow train_gpt --config run.toml"));
  const auto read = read_config(text, "stage-classes");
  if (!read) return;
  const triax::TrainConfig& cfg = *read;
  CHECK(cfg.tp == 1);
  CHECK(cfg.pp == 2);
  CHECK(cfg.dp == 1);
  CHECK(cfg.pipeline_layers == c.plan.plan.stage_layers);
  CHECK(cfg.micro_batch == 2);
  CHECK(cfg.global_batch == m.global_batch);
  CHECK(cfg.layers == m.layers);
  CHECK(cfg.hidden == m.hidden);
  CHECK(cfg.heads == m.heads);
  CHECK(cfg.seq == m.seq);
  CHECK(triax::to_toml(cfg).find("stage-classes = \"fast,slow\"") != std::string::npos);
}

TEST_CASE("the emitted config names train_gpt's preset of the same model (its RoPE base comes along)", "[plan][hetero]") {
  ModelShape m = model_preset("llama3.2-1b");
  const HeteroCluster hc = two_classes(2.0, cluster_preset("dgx-h100"));
  HeteroSearchSpace s = pinned(1, 2, 1, 1);
  s.recompute = {Recompute::full};
  s.stage_classes = {0, 1};
  const HeteroChoice c = best_plan(m, hc, s);
  triax::TrainConfig with;
  triax::apply_config_text(with, train_config_toml(m, c, hc, "run.toml", "llama3.2-1b"), "run.toml");
  CHECK(with.model == "llama3.2-1b");
  CHECK(with.layers == m.layers);
  with.bf16 = false;  // priced in bf16; resolved here on the CPU backend, which computes in fp32
  const triax::ResolvedTrainConfig r = triax::resolve_train_config(with, 2, {"fast", "slow"});
  CHECK(r.model.rope_theta == 500000.0);  // Llama 3's base, which no shape key carries
  CHECK(r.model.positions == triax::PositionEmbedding::rope);
  // Without a preset the file keeps the default model's block choices that no key overrides.
  triax::TrainConfig without;
  triax::apply_config_text(without, train_config_toml(m, c, hc, "run.toml"), "run.toml");
  CHECK(without.model == triax::TrainConfig{}.model);
}

TEST_CASE("the emitted config of uneven DP shares carries dp-microbatches", "[plan][hetero]") {
  const ModelShape m = small_model();
  const HeteroCluster hc = two_classes(2.0);
  const HeteroChoice c = best_plan(m, hc, pinned(1, 1, 2, 1));
  const std::string text = train_config_toml(m, c, hc, "run.toml");
  const auto& mb = c.plan.plan.replica_microbatches;
  CHECK_THAT(text, Contains(fmt::format("dp-microbatches = \"{},{}\"", mb[0], mb[1])));
  const auto read = read_config(text, "dp-microbatches");
  if (!read) return;
  const triax::TrainConfig& cfg = *read;
  CHECK(cfg.dp == 2);
  CHECK(cfg.global_batch == m.global_batch);
  CHECK(triax::to_toml(cfg).find(fmt::format("dp-microbatches = \"{},{}\"", mb[0], mb[1])) != std::string::npos);
}

TEST_CASE("the emitted config of a one-class plan parses with every train_gpt", "[plan][hetero]") {
  const ModelShape m = small_model();
  HeteroCluster hc = two_classes(2.0);
  hc.classes[0].nodes = hc.classes[0].device.nodes = 2;  // room for both stages on the fast class
  const HeteroChoice c = best_plan(m, hc, pinned(1, 2, 1, 2));
  REQUIRE(c.plan.plan.replica_classes == std::vector<int>{0});  // both stages on the fast class
  const std::string text = train_config_toml(m, c, hc, "run.toml");
  CHECK_THAT(text, Contains("mpirun -np 2 -x TRIAX_DEVICE_CLASS=fast train_gpt --config run.toml"));
  triax::TrainConfig cfg;
  triax::apply_config_text(cfg, text, "run.toml");
  CHECK(cfg.pp == 2);
  CHECK(cfg.pipeline_layers == c.plan.plan.stage_layers);
  CHECK(cfg.micro_batch == 2);
  CHECK(cfg.global_batch == m.global_batch);
  CHECK(cfg.ffn == m.ffn_hidden());
  CHECK(cfg.vocab == m.vocab);
  CHECK(cfg.max_seq == m.seq);
}
