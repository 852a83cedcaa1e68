// ZeRO-2 and ZeRO-3 (issue 27) train the serial model exactly: for GPT-2 (nano, tiny) and
// llama-nano, at dp 2, 4 and 8, with TP, PP (1F1B, interleaved, GPipe, ZB-H1), recompute,
// sequence parallelism, HSDP (--zero-shard-size) and MoE (ep 1 and 2), the losses and gradient
// norms of 3 iterations and every final weight equal one process's (train_compare.h, 1e-5
// relative), and equal the same layout at ZeRO 0. Final weights are read whole: under ZeRO-3 with
// ZeroSharding::full_master (collective over the shard group), under ZeRO-2 after
// gather_master_weights. Validation passes under ZeRO-3 give the serial validation loss, and fp16
// on the emulated backend trains like ZeRO 0 at the same layout.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "support/multirank.h"
#include "support/train_compare.h"
#include "support/valid_file.h"
#include "triax/data/data.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/token_shard.h"

using namespace triax;
using namespace triax::test;

namespace {

struct Case {
  const char* model;
  int tp, pp, dp, vpp;
  const char* schedule;
  int zero, shard = 0;
  Recompute recompute = Recompute::none;
  bool sp = false;
  int moe_every = 0, ep = 1;
};

std::string describe(const Case& k) {
  return fmt::format("{} tp {} pp {} dp {} vpp {} {} zero {} shard {} recompute {} sp {} moe_every {} ep {}", k.model,
                     k.tp, k.pp, k.dp, k.vpp, k.schedule, k.zero, k.shard, recompute_name(k.recompute), k.sp,
                     k.moe_every, k.ep);
}

TrainConfig config_of(const Case& k) {
  // The seeds of test_3d_equivalence (dense) and test_moe_train (MoE); at some other seeds a few
  // layouts miss 1e-5 against one process at ZeRO 0 too (AdamW amplifies reduction-order noise
  // where its second moment is tiny), which would hide what ZeRO-2/3 change.
  TrainConfig c = nano_train_config(3, 5e-4, k.moe_every > 0 ? 777 : 4321);
  c.model = k.model;
  c.warmup_iters = 1;
  c.clip_grad = 1.0;
  c.bucket_mb = 0.01;
  c.tp = k.tp;
  c.pp = k.pp;
  c.dp = k.dp;
  c.vpp = k.vpp;
  c.layers = std::max(4, k.pp * k.vpp);  // 4, or one layer per virtual stage
  c.schedule = parse_schedule_kind(k.schedule);
  c.zero = k.zero;
  c.zero_shard_size = k.shard;
  c.recompute = k.recompute;
  c.sequence_parallel = k.sp;
  if (k.moe_every > 0) {
    c.moe_every = k.moe_every;
    c.experts = 4;
    c.capacity_factor = 1.0;
    c.ep = k.ep;
  }
  return c;
}

// train() of train_compare.h (whole masters at any ZeRO level), checking the store really is sharded.
Result train_zero(const TrainConfig& cfg, const TrainerOptions& opts = {}) {
  Result r = train(world_ptr(), cfg, opts);
  REQUIRE(r.zero_level == cfg.zero);
  REQUIRE(r.store_level == (cfg.zero >= 2 ? cfg.zero : 0));
  return r;
}

// Two runs of the same layout (ZeRO 2/3 against 0): the reductions differ only in order. As in
// train_compare.h, the key bias (exactly zero gradient: rounding noise that AdamW turns into tiny
// updates) and experts' biases (fed by few tokens) are compared absolutely, to k_abs.
void compare_runs(const Result& got, const Result& ref, double tol, double k_abs = 1e-6) {
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("iteration " << i + 1 << " loss " << got.losses[i] << " vs " << ref.losses[i]);
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= tol * std::abs(ref.losses[i]));
    CHECK(std::abs(got.grad_norms[i] - ref.grad_norms[i]) <= tol * std::abs(ref.grad_norms[i]));
  }
  REQUIRE(got.params.size() == ref.params.size());
  auto worst_abs = [](std::span<const float> a, std::span<const float> b) {
    double w = 0;
    for (size_t k = 0; k < a.size(); ++k) w = std::max(w, double(std::abs(a[k] - b[k])));
    return w;
  };
  for (const auto& [name, mine] : got.params) {
    INFO(name);
    REQUIRE(ref.params.count(name) == 1);
    const std::span<const float> a(mine), b(ref.params.at(name));
    REQUIRE(a.size() == b.size());
    if (name.ends_with("c_attn.bias")) {
      const size_t part = a.size() / 3;
      CHECK(rel_err(a.first(part), b.first(part)) <= tol);
      CHECK(rel_err(a.last(part), b.last(part)) <= tol);
      CHECK(worst_abs(a.subspan(part, part), b.subspan(part, part)) <= k_abs);
    } else if (name.find("experts.") != std::string::npos && name.ends_with(".bias")) {
      CHECK(worst_abs(a, b) <= k_abs);
    } else {
      CHECK(rel_err(a, b) <= tol);
    }
  }
}

void run_cases(const std::vector<Case>& cases) {
  const int W = world().size();
  int runs = 0;
  for (const Case& k : cases) {
    if (k.tp * k.pp * k.dp != W) continue;
    INFO(describe(k));
    const TrainConfig cfg = config_of(k);
    const Result got = train_zero(cfg);
    compare(cfg, got, world().rank() % k.tp);
    TrainConfig plain = cfg;
    plain.zero = 0;
    plain.zero_shard_size = 0;
    compare_runs(got, train_zero(plain), 1e-5);
    ++runs;
  }
  REQUIRE(runs >= 2);
}

}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 train the serial GPT-2 model in every layout", "[train][zero]") {
  const Recompute none = Recompute::none, sel = Recompute::selective, full = Recompute::full;
  run_cases({
      // np 2
      {"nano", 1, 1, 2, 1, "1f1b", 2},
      {"nano", 1, 1, 2, 1, "1f1b", 3, 0, full},
      {"nano", 1, 2, 1, 1, "gpipe", 3},  // a shard group of one: the engine with nothing to shard
      // np 4
      {"nano", 1, 1, 4, 1, "zb-h1", 2, 0, sel},
      {"nano", 1, 1, 4, 1, "1f1b", 3},
      {"nano", 1, 1, 4, 1, "gpipe", 3, 2, full},  // HSDP: two groups of 2
      {"nano", 2, 1, 2, 1, "1f1b", 3, 0, sel, true},
      {"nano", 1, 2, 2, 2, "interleaved", 3, 0, full},
      {"nano", 1, 2, 2, 1, "zb-h1", 2, 0, none},
      {"nano", 1, 2, 2, 1, "gpipe", 3, 0, sel},
      // np 8: the done-means layouts (GPT-2 tiny) and more
      {"tiny", 2, 2, 2, 1, "1f1b", 3},
      {"tiny", 1, 1, 8, 1, "1f1b", 3, 4},
      {"nano", 2, 2, 2, 2, "interleaved", 2, 0, sel, true},
      {"nano", 1, 2, 4, 1, "zb-h1", 3, 2, full},
  });
}

TEST_CASE("ZeRO-2 and ZeRO-3 train the serial Llama model", "[train][zero][llama]") {
  run_cases({
      {"llama-nano", 1, 1, 2, 1, "1f1b", 3, 0, Recompute::selective},
      {"llama-nano", 1, 1, 2, 1, "gpipe", 2},
      {"llama-nano", 2, 1, 2, 1, "1f1b", 3, 0, Recompute::full, true},
      {"llama-nano", 1, 2, 2, 2, "interleaved", 2},
      {"llama-nano", 2, 2, 2, 1, "zb-h1", 3, 0, Recompute::selective, true},
      {"llama-nano", 1, 1, 8, 1, "1f1b", 2, 4},
  });
}

TEST_CASE("ZeRO-2 and ZeRO-3 train the serial MoE model (experts sharded over expert-DP)", "[train][zero][moe]") {
  run_cases({
      {"nano", 1, 1, 2, 1, "1f1b", 3, 0, Recompute::none, false, 2, 1},
      {"nano", 1, 1, 2, 1, "1f1b", 2, 0, Recompute::none, false, 2, 2},
      {"nano", 1, 1, 4, 1, "1f1b", 3, 0, Recompute::none, false, 2, 2},
      {"nano", 1, 1, 4, 1, "gpipe", 2, 0, Recompute::selective, false, 2, 1},
      {"nano", 1, 1, 4, 1, "1f1b", 3, 2, Recompute::none, false, 2, 1},  // HSDP with experts (ep 1)
      {"nano", 1, 1, 4, 1, "1f1b", 2, 2, Recompute::none, false, 2, 1},
      {"llama-nano", 1, 2, 2, 1, "1f1b", 3, 0, Recompute::full, false, 2, 2},
      {"nano", 2, 1, 4, 1, "1f1b", 3, 0, Recompute::none, false, 2, 2},  // (MoE refuses SP)
      {"nano", 1, 2, 4, 1, "zb-h1", 2, 0, Recompute::none, false, 2, 2},
  });
}

TEST_CASE("every layout and schedule at ZeRO-2 and ZeRO-3 trains the serial model", "[train][zero][sweep]") {
  // The 3D sweep of test_3d_equivalence at the sharded levels: every tp x pp x dp with dp >= 2,
  // every schedule, recompute and SP alternating, HSDP (shard 2) on every other run at dp >= 4.
  const int W = world().size();
  const Recompute modes[] = {Recompute::none, Recompute::selective, Recompute::full};
  std::vector<Case> cases;
  for (int tp = 1; tp <= W; tp *= 2)
    for (int pp = 1; tp * pp * 2 <= W; pp *= 2) {
      std::vector<std::pair<const char*, int>> schedules = {{"1f1b", 1}, {"gpipe", 1}, {"zb-h1", 1}};
      if (pp >= 2) schedules.push_back({"interleaved", 2});
      for (const auto& [sched, vpp] : schedules)
        for (int zero : {2, 3}) {
          const int n = static_cast<int>(cases.size()), dp = W / (tp * pp);
          cases.push_back({"nano", tp, pp, dp, vpp, sched, zero, dp >= 4 && n % 2 == 0 ? 2 : 0, modes[n % 3],
                           tp > 1 && n % 2 == 1});
        }
    }
  run_cases(cases);
}

TEST_CASE("under ZeRO-2/3 a compute copy and a power-of-two loss scale keep the bits; a NaN on one rank skips everywhere",
          "[train][zero][loss_scaler]") {
  const int W = world().size();
  world().set_timeout(std::chrono::seconds(120));
  std::vector<Case> layouts = {{"nano", 1, 1, W, 1, "1f1b", 2}, {"nano", 1, 1, W, 1, "1f1b", 3}};
  if (W >= 4) layouts.push_back({"nano", 1, 2, W / 2, 1, "zb-h1", 3});
  LossScalerConfig sc;
  sc.init_scale = 1024;
  sc.growth_interval = 2;  // grows within the run
  for (const Case& k : layouts) {
    INFO(describe(k));
    TrainConfig cfg = config_of(k);
    cfg.train_iters = 4;
    const Result plain = train_zero(cfg);
    TrainerOptions opts;
    opts.loss_scaler = sc;
    opts.force_compute_copy = true;
    const Result scaled = train_zero(cfg, opts);
    CHECK(scaled.losses == plain.losses);
    CHECK(scaled.grad_norms == plain.grad_norms);
    CHECK(scaled.params == plain.params);
    // TRIAX_FAULT's NaN gradient on the last rank at iteration 2: every rank skips the step.
    setenv("TRIAX_FAULT", fmt::format("{}:2:nan", W - 1).c_str(), 1);
    Trainer t(world_ptr(), cfg, opts);
    std::vector<bool> skipped;
    t.train([&](const IterationMetrics& m) { skipped.push_back(m.step_skipped); });
    unsetenv("TRIAX_FAULT");
    CHECK(skipped == std::vector<bool>{false, true, false, false});
    CHECK(t.optimizer().loss_scale() == 1024);  // 1024 -> 512 at 2, clean 3 and 4 -> 1024
  }
}

TEST_CASE("fp16 on the emulated backend trains at ZeRO-2/3 as at ZeRO 0", "[train][zero][emulated]") {
  const int W = world().size();
  if (W > 4) return;  // the emulated backend is slow; dp 2 and 4 suffice
  for (int zero : {2, 3}) {
    Case k{"nano", 1, 1, W, 1, "1f1b", zero};
    TrainConfig cfg = config_of(k);
    cfg.backend = "cpu-emulated";
    cfg.fp16 = true;
    INFO(describe(k) << " fp16");
    TrainConfig plain = cfg;
    plain.zero = 0;
    const Result ref = train_zero(plain);
    const Result got = train_zero(cfg);
    REQUIRE(ref.losses.back() < ref.losses.front());
    // The same fp16 weights and fp32 gradient sums in another order, which fp16 forward passes
    // amplify: close, not bit for bit. Measured at dp 2: losses within 1e-4, weights 2.8e-4 (a
    // layer-0 bias) against ZeRO 0, which is itself 1.3e-4 from one fp16 process.
    compare_runs(got, ref, 1e-3, 2e-4);
  }
}

TEST_CASE("validation passes under ZeRO-3 give the serial validation loss", "[train][zero][eval]") {
  const int W = world().size();
  test::ValidTokenFile file("zero", "nano", 400);
  std::vector<Case> layouts = {{"nano", 1, 1, W, 1, "1f1b", 3}};
  if (W >= 4) layouts.push_back({"nano", 1, 2, W / 2, 2, "interleaved", 3, 0, Recompute::full});
  if (W == 8) layouts.push_back({"nano", 2, 2, 2, 1, "1f1b", 3});
  for (const Case& k : layouts) {
    INFO(describe(k));
    TrainConfig cfg = config_of(k);
    cfg.valid_data = file.path;
    cfg.eval_interval = 1;
    cfg.eval_iters = 2;
    TrainConfig serial_cfg = cfg;
    serial_cfg.tp = serial_cfg.pp = serial_cfg.vpp = 1;
    serial_cfg.dp = 1;
    serial_cfg.zero = 0;
    serial_cfg.recompute = Recompute::none;
    serial_cfg.schedule = ScheduleKind::one_f_one_b;
    const auto ref = eval_losses(std::shared_ptr<Communicator>(make_self_communicator("serial", world().rank())), serial_cfg);
    const auto got = eval_losses(world_ptr(), cfg);
    REQUIRE(ref.size() == 3);
    REQUIRE(got.size() == ref.size());
    CHECK(ref.back() < ref.front());  // training moved the validation loss
    for (size_t i = 0; i < ref.size(); ++i) {
      INFO("evaluation " << i + 1 << ": " << got[i] << " vs " << ref[i]);
      CHECK(std::abs(got[i] - ref[i]) <= 1e-5 * std::abs(ref[i]));
    }
  }
}

TEST_CASE("what ZeRO-2/3 does not support is refused with a ConfigError naming the flags", "[train][zero][errors]") {
  using Catch::Matchers::Contains;
  const int W = world().size();
  // HSDP shards experts over expert-DP only with ep 1: with ep > 1 the trainer refuses it.
  if (W >= 4) {
    TrainConfig moe = config_of({"nano", 1, 1, W, 1, "1f1b", 3, 2, Recompute::none, false, 2, 2});
    CHECK_THROWS_WITH(Trainer(world_ptr(), moe), Contains("--zero-shard-size 2") && Contains("ep 2"));
  }
  TrainConfig hsdp1 = config_of({"nano", 1, 1, W, 1, "1f1b", 1, 2});
  CHECK_THROWS_WITH(Trainer(world_ptr(), hsdp1), Contains("--zero-shard-size 2") && Contains("--zero 1"));
  TrainConfig odd = config_of({"nano", 1, 1, W, 1, "1f1b", 3, 3});
  CHECK_THROWS_WITH(Trainer(world_ptr(), odd), Contains("--zero-shard-size 3") && Contains(std::to_string(W)));
  TrainConfig four = config_of({"nano", 1, 1, W, 1, "1f1b", 4});
  CHECK_THROWS_AS(Trainer(world_ptr(), four), ConfigError);
}
