// The layout search against a brute-force reference that tries every combination of every knob
// and filters with layout_problem, plus its bookkeeping (counts, loss reasons) and its reports.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/planner.h"
#include "triax/plan/report.h"

using namespace triax::plan;
using triax::plan::test::round_cluster;
using triax::plan::test::small_model;

namespace {

// Every (tp, cp, pp, dp, vpp, mbs, schedule, recompute, sp, zero level, shard size) with
// tp*cp*pp*dp == gpus, cp a power of two (the search's CP sizes), with the search's duplicates
// dropped (one schedule at pp 1, no sp at tp 1, no ZeRO at dp*cp 1) and its HSDP choice (ZeRO-2/3
// shard groups of one node's dp x cp ranks, when smaller than dp x cp).
std::vector<Estimate> brute_force(const ModelShape& m, const CollectiveModel& net, int gpus) {
  std::vector<Estimate> out;
  for (int tp = 1; tp <= gpus; ++tp)
    for (int cp = 1; cp <= gpus; cp *= 2)
    for (int pp = 1; pp <= gpus; ++pp)
      for (int dp = 1; dp <= gpus; ++dp) {
        if (tp * cp * pp * dp != gpus) continue;
        const int ranks = dp * cp;  // the gradient (and ZeRO shard) ranks
        for (int mbs = 1; mbs <= m.global_batch; ++mbs)
          for (int v = 1; v <= m.layers; ++v)
            for (Schedule s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1})
              for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full})
                for (bool sp : {false, true})
                  for (int z = 0; z <= 3; ++z)
                  for (int shard = 0; shard <= ranks; ++shard) {
                    if (s == Schedule::gpipe) continue;  // the search does not rank GPipe by default
                    if (pp == 1 && s != Schedule::one_f_one_b) continue;
                    if ((sp && tp == 1) || (z > 0 && ranks == 1)) continue;
                    const int node_dp = net.cluster().gpus_per_node / tp;
                    if (shard != 0 && (z < 2 || shard != node_dp || node_dp >= ranks || ranks % shard != 0)) continue;
                    if (rc == Recompute::selective) continue;  // same as none with the fused kernel
                    Layout l;
                    l.tp = tp;
                    l.cp = cp;
                    l.pp = pp;
                    l.dp = dp;
                    l.vpp = v;
                    l.micro_batch = mbs;
                    l.schedule = s;
                    l.recompute = rc;
                    l.sequence_parallel = sp;
                    l.zero = z;
                    l.zero_shard = shard;
                    if (layout_problem(m, net.cluster(), l)) continue;
                    out.push_back(estimate(m, net, l));
                  }
      }
  return out;
}

}  // namespace

TEST_CASE("search finds the same best layout and the same counts as brute force") {
  const CollectiveModel net(round_cluster());
  ModelShape m = small_model();
  m.global_batch = 16;  // keeps the brute force quick
  for (int gpus : {4, 8}) {
    INFO("gpus " << gpus);
    SearchSpace sp;
    sp.gpus = gpus;
    sp.top_k = 3;
    const SearchResult r = search(m, net, sp);
    const auto all = brute_force(m, net, gpus);
    long fit = 0;
    const Estimate* best = nullptr;
    for (const auto& e : all) {
      if (!e.memory.fits()) continue;
      ++fit;
      if (!best || e.seconds_per_iteration < best->seconds_per_iteration) best = &e;
    }
    REQUIRE(best);
    CHECK(r.ranked == fit);
    CHECK(r.ranked + r.no_fit == long(all.size()));
    CHECK(r.enumerated == r.invalid + r.no_fit + r.ranked);
    REQUIRE(r.best.size() == 3);
    CHECK(r.best.front().seconds_per_iteration == best->seconds_per_iteration);
    for (size_t i = 1; i < r.best.size(); ++i)
      CHECK(r.best[i - 1].seconds_per_iteration <= r.best[i].seconds_per_iteration);
    long lost = 0;
    for (const auto& [why, n] : r.lost_by) {
      lost += n;
      // The example of each reason is a fitting layout that lost for that reason.
      REQUIRE(r.lost_example.count(why));
      const Estimate& x = r.lost_example.at(why);
      CHECK(loss_reason(x, r.best.front()) == why);
      CHECK(x.seconds_per_iteration >= r.best.back().seconds_per_iteration);
    }
    CHECK(lost == r.ranked - 3);
  }
}

TEST_CASE("fixed knobs are respected and everything returned is valid and fits") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  const ModelShape m = model_preset("megatron-39b");
  SearchSpace sp;
  sp.gpus = 64;
  sp.tp = {8};
  sp.recompute = {Recompute::full, Recompute::selective};
  sp.top_k = 4;
  const SearchResult r = search(m, net, sp);
  REQUIRE(!r.best.empty());
  for (const auto& e : r.best) {
    CHECK(e.layout.tp == 8);
    CHECK(e.layout.recompute != Recompute::none);
    CHECK(e.memory.fits());
    CHECK(!layout_problem(m, net.cluster(), e.layout));
    CHECK(e.layout.gpus() == 64);
  }
  CHECK(r.no_fit > 0);  // 39B on 64 GPUs: shallow pipelines do not fit
}

TEST_CASE("a model that fits nowhere reports the fastest layout that does not fit") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  SearchSpace sp;
  sp.gpus = 8;
  const SearchResult r = search(model_preset("megatron-145b"), net, sp);
  CHECK(r.best.empty());
  CHECK(r.ranked == 0);
  CHECK(r.no_fit > 0);
  REQUIRE(r.fastest_no_fit.size() == 1);
  CHECK(!r.fastest_no_fit.front().memory.fits());
  const auto j = nlohmann::json::parse(search_json(r));
  CHECK(j.at("fits") == false);
  CHECK(j.at("search").at("ranked") == 0);
  CHECK_THAT(format_search(r), Catch::Contains("no layout fits"));
}

TEST_CASE("invalid layouts are counted by rule") {
  const CollectiveModel net(round_cluster());
  SearchSpace sp;
  sp.gpus = 24;  // tp 3, 6, 12, 24 do not divide 8 heads
  sp.micro_batch = {1};
  const SearchResult r = search(small_model(), net, sp);
  REQUIRE(r.invalid_reasons.count("tp N does not divide heads N"));
  CHECK(r.invalid_reasons.at("tp N does not divide heads N") > 0);
  long sum = 0;
  for (const auto& [why, n] : r.invalid_reasons) sum += n;
  CHECK(sum == r.invalid);
  CHECK_THAT(format_search(r), Catch::Contains("invalid, by rule"));
}

TEST_CASE("the loss reason is the component that grew most") {
  Estimate best, e;
  best.time = {10, 1, 1, 1, 1, 1};
  e.time = {10.5, 1, 4, 1, 2, 1};
  CHECK(loss_reason(e, best) == LossReason::tp_comm);
  e.time = {10, 3.5, 1, 1, 1, 1};
  CHECK(loss_reason(e, best) == LossReason::bubble);
  e.time = {10, 1, 1, 1, 1, 1.2};
  CHECK(loss_reason(e, best) == LossReason::optimizer);
  CHECK(to_string(LossReason::dp_comm) == "dp_comm");
}

TEST_CASE("bad search requests are ConfigErrors") {
  const CollectiveModel net(round_cluster());
  SearchSpace sp;
  sp.gpus = 0;
  CHECK_THROWS_WITH(search(small_model(), net, sp), Catch::Contains("GPU count >= 1"));
  sp.gpus = 64;
  CHECK_THROWS_WITH(search(small_model(), net, sp), Catch::Contains("64 GPUs requested but cluster 'round' has 32"));
  sp.gpus = 8;
  sp.top_k = 0;
  CHECK_THROWS_AS(search(small_model(), net, sp), triax::ConfigError);
}

TEST_CASE("estimate JSON carries the documented keys and consistent numbers") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  Layout l;
  l.tp = 8;
  l.pp = 4;
  l.dp = 2;
  l.micro_batch = 2;
  l.recompute = Recompute::selective;
  const Estimate e = estimate(model_preset("megatron-39b"), net, l);
  const auto j = nlohmann::json::parse(estimate_json(e));
  for (const char* key : {"seconds_per_iteration", "tflops_per_gpu", "mfu", "memory_gib", "fits", "time", "memory"})
    CHECK(j.contains(key));
  CHECK(j.at("seconds_per_iteration").get<double>() == Approx(e.seconds_per_iteration));
  CHECK(j.at("fits").get<bool>() == e.memory.fits());
  double sum = 0;
  for (const char* k : {"compute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer"}) sum += j["time"][k].get<double>();
  CHECK(sum == Approx(e.seconds_per_iteration));
  double mem = 0;
  for (const char* k : {"weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "comm_buffers_gib", "reserved_gib"})
    mem += j["memory"][k].get<double>();
  CHECK(mem == Approx(j["memory_gib"].get<double>()));
  CHECK(j["layout"]["summary"] == describe(l));
  const std::string text = format_estimate(e);
  CHECK_THAT(text, Catch::Contains("time per iteration") && Catch::Contains("TFLOP/s per GPU") && Catch::Contains("fits"));
}
