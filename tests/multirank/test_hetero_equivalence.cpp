// Uneven data-parallel shares (issue 29, docs/HETEROGENEOUS.md) train the one-process model over
// the same global batch: --dp-microbatches per replica (3,1 and 1,3; 5,2 whose sum dp does not
// divide) and per device class (TRIAX_DEVICE_CLASS set per rank here, before the Trainer reads it),
// with pp and uneven --pipeline-layers (and --stage-classes), ZeRO 1 (ZeRO 2/3 with equal shares: uneven
// ones are refused), tp, cp, MoE (ep 1, and ep 2 over replicas of equal shares), the interleaved schedule, recompute and validation. For each:
// the losses and gradient norms of 3 iterations and every final weight equal one process's
// (train_compare.h, 1e-5 relative). An even split given as shares (2,2) trains bit for bit like no
// shares, and a checkpoint written under 3,1 resumes under the even split and under 1,3 onto the
// uninterrupted one-process losses. Each np runs the rows of its world size.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>

#include <filesystem>
#include <functional>

#include "support/multirank.h"
#include "support/shared_dir.h"
#include "support/train_compare.h"
#include "support/valid_file.h"
#include "triax/checkpoint/checkpoint.h"
#include "triax/config/hetero.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/distributed/grid.h"

using namespace triax;
using namespace triax::test;

namespace {

// A layout with shares: its name, world size and the knobs beyond the shared base.
struct Case {
  const char* name;
  int world;
  const char* shares;  // --dp-microbatches
  std::function<void(TrainConfig&)> layout = [](TrainConfig&) {};
  std::vector<const char*> classes = {};  // TRIAX_DEVICE_CLASS per world rank (empty: unset)
};

// The nano model of the 3D tests (4 layers, 8-token samples, micro-batch 1), 3 iterations; the
// global batch is micro-batch x the shares' sum, given explicitly so that the one-process run
// trains the same samples.
TrainConfig base(int iters = 3) {
  TrainConfig c = nano_train_config(iters, 5e-4, 777);
  c.warmup_iters = 1;
  c.clip_grad = 1.0;
  c.bucket_mb = 0.01;
  return c;
}

// Per replica the global batch is micro-batch x the counts' sum; per class the case gives it.
void set_shares(TrainConfig& c, const std::string& shares) {
  find_train_option("dp-microbatches")->set(c, OptionInput{{shares}, nullptr, "--dp-microbatches"});
  if (!c.dp_microbatches.front().device_class.empty()) return;
  int64_t sum = 0;
  for (const auto& s : c.dp_microbatches) sum += s.count;
  c.global_batch = *c.micro_batch * sum;
}

// The configuration of the one-process comparison: the same run without the heterogeneous knobs.
TrainConfig without_shares(TrainConfig c) {
  c.dp_microbatches.clear();
  c.stage_classes.clear();
  return c;
}

// This rank's TRIAX_DEVICE_CLASS for the scope of a run (unset again after it).
struct RankClass {
  explicit RankClass(const std::vector<const char*>& classes) {
    if (!classes.empty()) ::setenv("TRIAX_DEVICE_CLASS", classes.at(static_cast<size_t>(world().rank())), 1);
  }
  ~RankClass() { ::unsetenv("TRIAX_DEVICE_CLASS"); }
  RankClass(const RankClass&) = delete;
  RankClass& operator=(const RankClass&) = delete;
};

int tp_rank_of(const TrainConfig& c) {
  const GridLayout g(world().size(), GridShape{c.tp, c.pp, world().size() / (c.tp * c.pp * c.cp), c.ep, c.order, c.cp});
  return g.coord(world().rank()).tp;
}

// Trains one case on the world and compares it with one process over the same global batch.
void run_case(const Case& k) {
  INFO(k.name << " --dp-microbatches " << k.shares);
  TrainConfig cfg = base();
  k.layout(cfg);
  set_shares(cfg, k.shares);
  RankClass cls(k.classes);
  {
    Trainer probe(world_ptr(), cfg);  // the replicas really run uneven shares
    REQUIRE(probe.batch_plan().shares.size() == static_cast<size_t>(probe.grid().layout().size(Axis::dp)));
    REQUIRE(probe.batch_plan().global_batch == *cfg.global_batch);
  }
  const Result got = train(world_ptr(), cfg);
  compare(without_shares(cfg), got, tp_rank_of(cfg));
}

std::vector<Case> cases() {
  auto pp = [](TrainConfig& c) { c.pp = 2, c.pipeline_layers = {3, 1}; };
  return {
      // np 2: dp 2.
      {"dp 2", 2, "3,1"},
      {"dp 2", 2, "1,3"},
      {"dp 2, a sum dp does not divide", 2, "5,2"},
      {"dp 2 micro-batch 2", 2, "1,2", [](TrainConfig& c) { c.micro_batch = 2; }},
      {"dp 2 ZeRO 1", 2, "3,1", [](TrainConfig& c) { c.zero = 1; }},
      // ZeRO 2/3 reduce per micro-batch over all replicas: equal shares only (uneven ones are refused).
      {"dp 2 ZeRO 2, equal shares", 2, "3,3", [](TrainConfig& c) { c.zero = 2; }},
      {"dp 2 ZeRO 3, equal shares", 2, "3,3", [](TrainConfig& c) { c.zero = 3; }},
      {"dp 2 recompute full", 2, "3,1", [](TrainConfig& c) { c.recompute = Recompute::full; }},
      {"dp 2 MoE no-drop ep 1", 2, "3,1", [](TrainConfig& c) { c.moe_every = 2, c.experts = 4, c.no_drop = true; }},
      {"dp 2 per class, rank 0 fast", 2, "fast=3,slow=1", [](TrainConfig& c) { c.global_batch = 4; }, {"fast", "slow"}},
      {"dp 2 per class, rank 0 slow", 2, "fast=3,slow=1", [](TrainConfig& c) { c.global_batch = 4; }, {"slow", "fast"}},
      // np 4.
      {"pp 2 x dp 2, layers 3,1", 4, "3,1", pp},
      {"pp 2 x dp 2, layers 3,1, stage classes", 4, "1,3",
       [pp](TrainConfig& c) { pp(c), c.stage_classes = {"fast", "slow"}; }, {"fast", "fast", "slow", "slow"}},
      {"pp 2 x dp 2 ZeRO 1", 4, "1,2", [pp](TrainConfig& c) { pp(c), c.zero = 1; }},
      {"pp 2 x dp 2 ZeRO 3, equal shares", 4, "3,3", [pp](TrainConfig& c) { pp(c), c.zero = 3; }},
      {"pp 2 x dp 2 interleaved", 4, "4,2",
       [](TrainConfig& c) { c.pp = 2, c.vpp = 2, c.schedule = ScheduleKind::interleaved; }},
      {"tp 2 x dp 2", 4, "1,3", [](TrainConfig& c) { c.tp = 2; }},
      {"cp 2 x dp 2", 4, "3,1", [](TrainConfig& c) { c.cp = 2; }},
      {"dp 4 MoE no-drop ep 2", 4, "3,3,1,1", [](TrainConfig& c) { c.moe_every = 2, c.experts = 4, c.no_drop = true, c.ep = 2; }},
      {"dp 4 per class", 4, "a=1,b=2", [](TrainConfig& c) { c.global_batch = 6; }, {"a", "b", "b", "a"}},
  };
}

}  // namespace

TEST_CASE("uneven data-parallel shares train the one-process model over the same global batch", "[train][hetero]") {
  world().set_timeout(std::chrono::seconds(60));
  int runs = 0;
  for (const Case& k : cases()) {
    if (k.world != world().size()) continue;
    run_case(k);
    ++runs;
  }
  REQUIRE(runs >= 6);
}

TEST_CASE("per-class shares equal the same shares per replica; an even split given as shares equals none",
          "[train][hetero]") {
  const int W = world().size();
  TrainConfig even = base();
  even.global_batch = 2 * W;
  const Result plain = train(world_ptr(), even);
  TrainConfig two = base();
  set_shares(two, fmt::format("{}", fmt::join(std::vector<int>(static_cast<size_t>(W), 2), ",")));
  const Result shared = train(world_ptr(), two);
  CHECK(shared.losses == plain.losses);
  CHECK(shared.grad_norms == plain.grad_norms);
  CHECK(shared.params == plain.params);
  // fast=3,slow=1 with world rank 0 fast (the rest slow) is 3,1,1,... bit for bit.
  TrainConfig per_replica = base();
  set_shares(per_replica, W == 2 ? "3,1" : "3,1,1,1");
  TrainConfig per_class = base();
  set_shares(per_class, "fast=3,slow=1");
  per_class.global_batch = per_replica.global_batch;
  const Result a = train(world_ptr(), per_replica);
  std::vector<const char*> classes(static_cast<size_t>(W), "slow");
  classes[0] = "fast";
  RankClass cls(classes);
  const Result b = train(world_ptr(), per_class);
  CHECK(a.losses == b.losses);
  CHECK(a.grad_norms == b.grad_norms);
  CHECK(a.params == b.params);
  CHECK(a.losses != plain.losses);  // the shares moved the samples' weights: another run
}

TEST_CASE("validation splits its batches by the shares: the one-process validation loss", "[train][hetero][eval]") {
  const int W = world().size();
  test::ValidTokenFile file("het", "nano", 400);
  TrainConfig cfg = base();
  if (W == 4) cfg.pp = 2;
  set_shares(cfg, W == 2 ? "3,1" : "1,3");
  cfg.valid_data = file.path;
  cfg.eval_interval = 1;
  cfg.eval_iters = 2;
  const auto ref = eval_losses(std::shared_ptr<Communicator>(make_self_communicator("serial", world().rank())),
                               [&] { TrainConfig one = without_shares(cfg); one.pp = 1; return one; }());
  const auto got = eval_losses(world_ptr(), cfg);
  REQUIRE(ref.size() == 3);
  REQUIRE(got.size() == ref.size());
  CHECK(ref.back() != ref.front());  // training moved the validation loss
  for (size_t i = 0; i < ref.size(); ++i) {
    INFO("evaluation " << i + 1 << ": " << got[i] << " vs " << ref[i]);
    CHECK(std::abs(got[i] - ref[i]) <= 1e-6 * std::abs(ref[i]));
  }
}

namespace {
// The losses of iterations 3 and 4 of a run resumed from dir under `resume` (its batch plan checked).
std::vector<double> resumed_losses(const std::string& dir, TrainConfig resume, const std::vector<int64_t>& want) {
  resume.load = dir;
  Trainer t(world_ptr(), with_checkpoint_batch(resume, false));  // train_gpt's --load: the batch sizes not given
  Checkpointer ck(t);
  REQUIRE(ck.resume() == 2);
  CHECK(t.batch_plan().global_batch == 4 * world().size());
  for (int d = 0; d < world().size(); ++d) CHECK(t.batch_plan().micro_batches_of(d) == want.at(static_cast<size_t>(d)));
  std::vector<double> losses;
  t.train([&](const IterationMetrics& m) { losses.push_back(m.loss); });
  return losses;
}
}  // namespace

TEST_CASE("a checkpoint written under uneven shares resumes under any split onto the one-process losses",
          "[train][hetero][checkpoint]") {
  const int W = world().size();
  world().set_timeout(std::chrono::seconds(60));
  // dp W, micro-batch 2, global batch 4W: saved under 3,1,2,..., resumed evenly and under 1,3,2,...
  std::vector<int64_t> saved(static_cast<size_t>(W), 2), swapped(static_cast<size_t>(W), 2);
  saved[0] = 3, saved[1] = 1, swapped[0] = 1, swapped[1] = 3;
  TrainConfig cfg = base(4);
  cfg.micro_batch = 2;
  TrainConfig one = cfg;
  one.global_batch = 4 * W;
  const Result whole = train(std::shared_ptr<Communicator>(make_self_communicator("serial", world().rank())), one);
  REQUIRE(whole.losses.size() == 4);
  const SharedDir scratch(world(), "het");
  const std::string& dir = scratch.path();
  {
    TrainConfig first = cfg;
    set_shares(first, fmt::format("{}", fmt::join(saved, ",")));
    first.train_iters = 2;
    first.save = dir;
    Trainer t(world_ptr(), first);
    Checkpointer ck(t);
    t.train([](const IterationMetrics&) {}, {}, [&] { return ck.after_iteration(); });
    ck.finish();
  }
  TrainConfig even = cfg;  // no shares, no batch sizes: the checkpoint's, split evenly
  even.global_batch.reset();
  even.micro_batch.reset();
  TrainConfig uneven = cfg;
  set_shares(uneven, fmt::format("{}", fmt::join(swapped, ",")));
  for (const auto& [resume, want] : {std::pair{even, std::vector<int64_t>(static_cast<size_t>(W), 2)},
                                     std::pair{uneven, swapped}}) {
    INFO("resumed with --dp-microbatches " << format_dp_microbatches(resume.dp_microbatches));
    const auto losses = resumed_losses(dir, resume, want);
    REQUIRE(losses.size() == 2);
    for (size_t i = 0; i < 2; ++i) CHECK(std::abs(losses[i] - whole.losses[i + 2]) <= 1e-6 * whole.losses[i + 2]);
  }
}
