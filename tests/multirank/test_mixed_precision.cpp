// Mixed-precision plumbing on the CPU (docs/CUDA.md, "Precision of each buffer"):
//  - A forced compute copy (a flat weight copy of the masters' own type, as bf16/fp16 training
//    keeps one in the compute type) trains bit for bit like the store without one, in the plain
//    case, under ZeRO-1 (which then gathers the copy, not the masters) and on pipeline/TP layouts:
//    the copy is refreshed after init and by every AdamW pass, and gathered under ZeRO-1.
//    A copy that is not refreshed (or not gathered) leaves the layers on old weights: the losses
//    from the second iteration on differ.
//  - A checkpoint saved under ZeRO-1 with the copy (each rank writes its own shard of masters,
//    the only current ones) and resumed (the copy refreshed from the loaded masters) continues
//    bit for bit like the uninterrupted run.
//  - The fp16 loss scaler's overflow flag: a non-finite gradient on one rank only makes every rank
//    of every layout skip the same step, with the same backed-off scale, parameters untouched; the
//    scaled gradients of the clean steps give the unscaled run's parameters bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "optim_support.h"
#include "support/multirank.h"
#include "support/shared_dir.h"
#include "support/optim_fixture.h"
#include "triax/backend/backend.h"
#include "triax/checkpoint/checkpoint.h"
#include "triax/optim/optimizer.h"
#include "triax/train/trainer.h"

using namespace triax;
using namespace triax::test;

namespace {

struct Run {
  std::vector<double> losses, grad_norms;
  std::map<std::string, std::vector<float>> masters;
  bool copy_equals_masters = false;
  bool had_copy = false;
};

std::vector<std::byte> bytes_of(Backend& be, const Tensor& t) {
  std::vector<std::byte> b(t.nbytes());
  be.copy_to_host(b.data(), t, b.size());
  return b;
}

Run train(const TrainConfig& cfg, bool force_copy) {
  Trainer t(world_ptr(), cfg, TrainerOptions{force_copy});
  Run r;
  r.had_copy = t.store().has_compute_copy();
  t.train([&](const IterationMetrics& m) {
    r.losses.push_back(m.loss);
    r.grad_norms.push_back(m.grad_norm);
  });
  // Under ZeRO-1 with a copy only the copy was gathered: the masters of other shards are stale
  // until gathered (a DP collective, so every rank calls it).
  t.optimizer().gather_master_weights();
  REQUIRE(t.store().masters_current());
  for (size_t i = 0; i < t.store().size(); ++i) r.masters[t.store().info(i).spec.name] = t.store().param_to_host(i);
  r.copy_equals_masters = bytes_of(t.backend(), t.store().weights_t()) == bytes_of(t.backend(), t.store().params_t());
  return r;
}

TrainConfig config(int tp, int pp, int dp, bool zero1) {
  TrainConfig c;
  c.model = "nano";
  c.layers = 4;
  c.seq = 8;
  c.global_batch = 8;
  c.micro_batch = 1;
  c.train_iters = 4;
  c.lr = 3e-3;
  c.warmup_iters = 1;
  c.seed = 77;
  c.bucket_mb = 0.01;  // several buckets: ZeRO-1 pieces cut through parameters
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.zero = (zero1) ? 1 : 0;
  return c;
}

}  // namespace

TEST_CASE("a forced compute copy trains bit for bit like the masters alone", "[mixed_precision][train]") {
  const int W = world().size();
  world().set_timeout(std::chrono::seconds(120));
  std::vector<TrainConfig> layouts;
  if (W == 1) layouts = {config(1, 1, 1, false), config(1, 1, 1, true)};
  if (W == 2) layouts = {config(1, 1, 2, false), config(1, 1, 2, true), config(1, 2, 1, false), config(2, 1, 1, false)};
  if (W == 4) layouts = {config(1, 1, 4, true), config(2, 1, 2, true), config(1, 2, 2, true), config(2, 2, 1, false)};
  REQUIRE_FALSE(layouts.empty());
  for (const auto& cfg : layouts) {
    INFO("tp " << cfg.tp << " pp " << cfg.pp << " dp " << *cfg.dp << " zero1 " << (cfg.zero == 1));
    const Run plain = train(cfg, false);
    const Run copy = train(cfg, true);
    CHECK_FALSE(plain.had_copy);
    CHECK(copy.had_copy);
    REQUIRE(plain.losses.size() == 4);
    REQUIRE(plain.losses.back() < plain.losses.front());  // it learned: the weights moved
    for (size_t i = 0; i < plain.losses.size(); ++i) {
      INFO("iteration " << i + 1);
      CHECK(copy.losses[i] == plain.losses[i]);
      CHECK(copy.grad_norms[i] == plain.grad_norms[i]);
    }
    CHECK(copy.masters == plain.masters);
    CHECK(copy.copy_equals_masters);
  }
}

TEST_CASE("a checkpoint of a ZeRO-1 run with a compute copy resumes bit for bit", "[mixed_precision][checkpoint]") {
  const int W = world().size();
  world().set_timeout(std::chrono::seconds(120));
  const TrainConfig base = config(1, 1, W, /*zero1=*/true);
  const Run whole = train(base, false);  // 4 iterations, no copy, uninterrupted
  const SharedDir scratch(world(), "mp");
  const std::string& dir = scratch.path();
  {
    TrainConfig first = base;
    first.train_iters = 2;
    first.save = dir;
    Trainer t(world_ptr(), first, TrainerOptions{true});
    Checkpointer ck(t);
    t.train([](const IterationMetrics&) {}, {}, [&] { return ck.after_iteration(); });
    ck.finish();
    if (W > 1) CHECK_FALSE(t.store().masters_current());  // saved from each rank's own shard
  }
  TrainConfig second = base;
  second.load = dir;
  Trainer t(world_ptr(), second, TrainerOptions{true});
  Checkpointer ck(t);
  REQUIRE(ck.resume() == 2);
  std::vector<double> losses;
  t.train([&](const IterationMetrics& m) { losses.push_back(m.loss); });
  REQUIRE(losses.size() == 2);
  CHECK(losses[0] == whole.losses[2]);
  CHECK(losses[1] == whole.losses[3]);
  t.optimizer().gather_master_weights();
  for (size_t i = 0; i < t.store().size(); ++i) {
    INFO(t.store().info(i).spec.name);
    CHECK(t.store().param_to_host(i) == whole.masters.at(t.store().info(i).spec.name));
  }
}

namespace {
// Pre-reduction gradients of the rank with DP coordinate d at a step, times `scale` (a power of
// two, so exact): the same on every tp/pp rank.
void rank_grads(ParamStore& s, int d, int step, float scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    fill_normal(s.grad(i), 600 + static_cast<uint64_t>(step), static_cast<uint64_t>(d) * 100 + i, 0.5f);
    for (float& g : s.grad(i)) g *= scale;
  }
}
}  // namespace

TEST_CASE("fp16 loss scaler: a non-finite gradient on one rank skips the step on every rank",
          "[mixed_precision][loss_scaler]") {
  const int W = world().size();
  std::vector<GridShape> shapes = {{1, 1, W}};
  if (W == 4) shapes = {{1, 1, 4}, {2, 1, 2}, {1, 2, 2}, {2, 2, 1}};
  if (W == 2) shapes = {{1, 1, 2}, {2, 1, 1}, {1, 2, 1}};
  const bool zero1 = GENERATE(false, true);
  for (const auto& shape : shapes) {
    auto grid = make_grid(shape);
    const int dpn = grid->dp().size();
    const int bad_rank = W - 1;  // the last rank alone gets a NaN (a model-parallel peer under tp/pp)
    INFO("tp " << shape.tp << " pp " << shape.pp << " dp " << dpn << " zero1 " << zero1 << " NaN on world rank "
               << bad_rank);
    auto ps = odd_params();
    for (auto& p : ps) p.norm_owner = grid->coord().tp == 0;
    ParamStore scaled = make_store(ps, static_cast<size_t>(dpn), /*force_copy=*/true);
    ParamStore ref = make_store(ps, static_cast<size_t>(dpn));
    for (auto* s : {&scaled, &ref}) fill_normal(s->flat_params().subspan(0, s->numel()), 8, 8);
    scaled.refresh_compute_copy();
    OptimizerConfig cfg;
    cfg.zero = (zero1) ? 1 : 0;
    cfg.max_grad_norm = 1.0;
    cfg.grad_sync.bucket_bytes = 200;
    Optimizer b(ref, *grid, cfg);
    cfg.loss_scaler = LossScalerConfig{};
    cfg.loss_scaler->init_scale = 1024;
    cfg.loss_scaler->growth_interval = 2;
    Optimizer a(scaled, *grid, cfg);
    const int d = grid->coord().dp;
    int applied = 0;
    for (int step = 1; step <= 4; ++step) {
      INFO("step " << step);
      const double scale = a.loss_scale();
      scaled.zero_grads();
      ref.zero_grads();
      rank_grads(scaled, d, step, static_cast<float>(scale));
      rank_grads(ref, d, step, 1.0f);
      const bool poison = step == 2;
      if (poison && grid->rank() == bad_rank) scaled.grad(3)[5] = std::numeric_limits<float>::quiet_NaN();
      const std::vector<float> before(scaled.flat_params().begin(), scaled.flat_params().end());
      const StepReport ra = a.step(1e-2);
      // Every rank agrees (a max over the world of the flags each saw).
      double flags[2] = {ra.overflow ? 1.0 : 0.0, ra.overflow ? 0.0 : 1.0};
      world().all_reduce(std::span<double>(flags), ReduceOp::sum).wait();
      CHECK(flags[0] + flags[1] == W);
      CHECK(ra.overflow == poison);
      CHECK(ra.skipped == poison);
      CHECK(ra.loss_scale == scale);
      if (poison) {
        CHECK(a.loss_scale() == scale / 2);  // backed off alike everywhere
        CHECK(std::memcmp(before.data(), scaled.flat_params().data(), before.size() * sizeof(float)) == 0);
        continue;  // the reference skips nothing: it sees the step's clean gradients later
      }
      const StepReport rb = b.step(1e-2);
      ++applied;
      // The scaled gradients, unscaled in the norm and in AdamW's grad_scale, give the same bits.
      CHECK(ra.grad_norm == rb.grad_norm);
      CHECK(ra.applied_steps == applied);
      a.gather_master_weights();
      CHECK(std::memcmp(scaled.flat_params().data(), ref.flat_params().data(), ref.padded_numel() * sizeof(float)) == 0);
    }
    CHECK(a.loss_scaler()->skipped_steps() == 1);
    CHECK(a.skipped_steps() == 1);
  }
}

TEST_CASE("the Trainer's loss scaler: a power-of-two scale keeps fp32's bits; a NaN on one rank skips everywhere",
          "[mixed_precision][loss_scaler][train]") {
  const int W = world().size();
  world().set_timeout(std::chrono::seconds(120));
  std::vector<TrainConfig> layouts = {config(1, 1, W, true)};
  if (W == 4) layouts.push_back(config(2, 2, 1, false));
  if (W == 2) layouts.push_back(config(1, 2, 1, false));
  LossScalerConfig sc;
  sc.init_scale = 1024;
  sc.growth_interval = 2;  // grows within the run
  for (const auto& cfg : layouts) {
    INFO("tp " << cfg.tp << " pp " << cfg.pp << " dp " << *cfg.dp << " zero1 " << (cfg.zero == 1));
    const Run plain = train(cfg, false);
    TrainerOptions opts;
    opts.loss_scaler = sc;
    Trainer t(world_ptr(), cfg, opts);
    std::vector<double> losses, norms;
    t.train([&](const IterationMetrics& m) {
      losses.push_back(m.loss);
      norms.push_back(m.grad_norm);
    });
    CHECK(losses == plain.losses);
    CHECK(norms == plain.grad_norms);
    CHECK(t.optimizer().loss_scale() == 4096);  // grown twice in 4 clean steps
    for (size_t i = 0; i < t.store().size(); ++i)
      CHECK(t.store().param_to_host(i) == plain.masters.at(t.store().info(i).spec.name));
  }
  // TRIAX_FAULT's NaN gradient on the last rank at iteration 2: every rank skips it (the metrics
  // are the same everywhere; checked per rank), the scale backs off, and --max-skipped-iterations 1
  // does not end the run: an overflow is the scaler's work, not a fault.
  setenv("TRIAX_FAULT", fmt::format("{}:2:nan", W - 1).c_str(), 1);
  TrainConfig cfg = layouts.back();
  cfg.max_skipped_iterations = 1;
  TrainerOptions opts;
  opts.loss_scaler = sc;
  Trainer t(world_ptr(), cfg, opts);
  std::vector<bool> skipped;
  t.train([&](const IterationMetrics& m) { skipped.push_back(m.step_skipped); });
  unsetenv("TRIAX_FAULT");
  CHECK(skipped == std::vector<bool>{false, true, false, false});
  CHECK(t.last_report().skipped_steps == 1);
  CHECK(t.optimizer().loss_scale() == 1024);  // 1024 -> 512 at 2, clean 3 and 4 -> 1024
  double flag[1] = {t.optimizer().loss_scale()};
  world().all_reduce(std::span<double>(flag), ReduceOp::max).wait();
  CHECK(flag[0] == t.optimizer().loss_scale());
}
