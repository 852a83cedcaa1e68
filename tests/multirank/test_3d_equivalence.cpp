// For every factorisation of the world into tp x pp x dp, every pipeline schedule, with and
// without ZeRO-1, and the same global batch: the losses of 3 iterations and the final weights
// equal a serial run (one rank, the same global batch by gradient accumulation), computed
// in-process on every rank as the reference, to 1e-5 relative in fp32.
#include <catch2/catch.hpp>

#include <cmath>

#include "support/train_compare.h"

using namespace triax;
using namespace triax::test;

namespace {

constexpr int kIters = 3;
constexpr int kGlobalBatch = 8;

TrainConfig base_config() {
  TrainConfig c;
  c.model = "nano";
  c.layers = 8;  // pp up to 8, and pp x vpp = 2 x 2 or 4 x 2
  c.seq = 8;
  c.global_batch = kGlobalBatch;
  c.micro_batch = 1;
  c.train_iters = kIters;
  c.lr = 5e-4;
  c.warmup_iters = 1;
  c.clip_grad = 1.0;
  c.seed = 4321;
  c.bucket_mb = 0.01;  // several buckets even for this small model
  return c;
}

}  // namespace

TEST_CASE("every 3D layout, schedule and ZeRO-1 setting trains the serial model", "[train][equivalence]") {
  const int W = test::world().size();
  const int heads = GptConfig::preset("nano").n_head;
  int runs = 0;
  for (int tp = 1; tp <= W; tp *= 2)
    for (int pp = 1; tp * pp <= W; pp *= 2) {
      if (W % (tp * pp) != 0 || heads % tp != 0) continue;
      const int dp = W / (tp * pp);
      std::vector<std::pair<std::string, int>> schedules = {{"gpipe", 1}, {"1f1b", 1}, {"zb-h1", 1}};
      if (pp >= 2 && 8 % (pp * 2) == 0) schedules.push_back({"interleaved", 2});
      for (const auto& [sched, vpp] : schedules)
        for (bool zero1 : {false, true}) {
          TrainConfig cfg = base_config();
          cfg.tp = tp;
          cfg.pp = pp;
          cfg.dp = dp;
          cfg.schedule = parse_schedule_kind(sched);
          cfg.vpp = vpp;
          cfg.zero = (zero1) ? 1 : 0;
          // Recompute modes change memory, never the math: exercise them across layouts.
          cfg.recompute = (runs % 3 == 0) ? Recompute::none : (runs % 3 == 1) ? Recompute::selective : Recompute::full;
          // Sequence parallelism, likewise, on every other TP layout.
          cfg.sequence_parallel = tp > 1 && runs % 2 == 1;
          INFO("tp " << tp << " pp " << pp << " dp " << dp << " " << sched << " vpp " << vpp << " zero1 " << zero1
                     << " recompute " << recompute_name(cfg.recompute) << " sp " << cfg.sequence_parallel);
          const Result got = train(test::world_ptr(), cfg);
          const int tp_rank = test::world().rank() % tp;  // tp is the fastest axis
          compare(cfg, got, tp_rank);
          ++runs;
        }
    }
  REQUIRE(runs >= 8);
}

TEST_CASE("uneven pipeline splits and batch-size ramp-up train the serial model", "[train][equivalence]") {
  const int W = test::world().size();
  // pp 2: stage 0 holds 3 layers, stage 1 five (the head's stage is often given fewer in
  // practice; either way the math must not change).
  TrainConfig cfg = base_config();
  cfg.pp = 2;
  cfg.dp = W / 2;
  cfg.pipeline_layers = {3, 5};
  cfg.schedule = ScheduleKind::one_f_one_b;
  const Result uneven = train(test::world_ptr(), cfg);
  compare(cfg, uneven, 0);
  // Ramp-up: the global batch grows 4 -> 6 -> 8 over the first 10 samples, so the number of
  // micro-batches (and the schedule) changes between iterations; the serial run ramps alike.
  TrainConfig ramp = base_config();
  ramp.pp = 2;
  ramp.dp = W / 2;
  ramp.schedule = ScheduleKind::zb_h1;
  ramp.rampup = BatchRampup{W / 2 * 2, W / 2, 10};
  ramp.global_batch = W / 2 * 4;
  std::vector<int64_t> batches;
  {
    Trainer t(test::world_ptr(), ramp);
    t.train([&](const IterationMetrics& m) { batches.push_back(m.global_batch); });
  }
  REQUIRE(batches.size() == 3);
  CHECK(batches.front() == ramp.rampup->start);
  CHECK(batches.back() > batches.front());  // the ramp moved: the schedule changed mid-run
  CHECK(batches.back() <= *ramp.global_batch);
  const Result ramped = train(test::world_ptr(), ramp);
  compare(ramp, ramped, 0);
}

TEST_CASE("the Llama block trains the serial model in every 3D layout", "[train][equivalence][llama]") {
  // RMSNorm, SwiGLU, RoPE, 8 query heads over 4 KV heads, untied head: every tp that divides the
  // KV heads, every pp, the schedules in turn, ZeRO-1, SP and the recompute modes alternating.
  const int W = test::world().size();
  const GptConfig m = GptConfig::preset("llama-nano");
  const std::vector<std::pair<std::string, int>> schedules = {{"1f1b", 1}, {"zb-h1", 1}, {"gpipe", 1}};
  int runs = 0;
  for (int tp = 1; tp <= W; tp *= 2)
    for (int pp = 1; tp * pp <= W; pp *= 2) {
      if (W % (tp * pp) != 0 || m.kv_heads() % tp != 0) continue;
      std::vector<std::pair<std::string, int>> mine = {schedules[static_cast<size_t>(runs) % schedules.size()]};
      if (pp >= 2 && 8 % (pp * 2) == 0) mine.push_back({"interleaved", 2});
      for (const auto& [sched, vpp] : mine) {
        TrainConfig cfg = base_config();
        cfg.model = "llama-nano";
        cfg.tp = tp;
        cfg.pp = pp;
        cfg.dp = W / (tp * pp);
        cfg.schedule = parse_schedule_kind(sched);
        cfg.vpp = vpp;
        cfg.zero = (runs % 2 == 1) ? 1 : 0;
        cfg.recompute = (runs % 3 == 0) ? Recompute::none : (runs % 3 == 1) ? Recompute::selective : Recompute::full;
        cfg.sequence_parallel = tp > 1 && runs % 2 == 0;
        INFO("llama tp " << tp << " pp " << pp << " dp " << W / (tp * pp) << " " << sched << " vpp " << vpp << " zero1 "
                         << (cfg.zero == 1) << " recompute " << recompute_name(cfg.recompute) << " sp "
                         << cfg.sequence_parallel);
        const Result got = train(test::world_ptr(), cfg);
        compare(cfg, got, test::world().rank() % tp);
        ++runs;
      }
    }
  REQUIRE(runs >= 5);
}
