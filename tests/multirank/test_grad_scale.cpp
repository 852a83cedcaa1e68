// The gradient itself, against a reference that cannot share a scale bug. AdamW is nearly blind to
// a constant gradient scale and clipping normalises the rest, so a lost 1/m (micro-batches) or
// 1/dp leaves losses and weights equal to a serial run that accumulates over micro-batches the
// same way. Here the reference is B one-sample steps of a serial run (one micro-batch: nothing to
// weight, nothing to average; lr 0 keeps the weights put): the mean of those B per-sample
// gradients must equal the synced gradient of one step over the same B samples in every layout
// (plain DP and ZeRO-1's shard), and so must the reported norm, to ~1e-6. Padded vocabulary rows
// of wte get exactly zero gradient.
//
// And the overlap of the DP gradient sync through the pipeline executor (not GradBuffer driven by
// hand): at pp 2 x dp 2 every schedule must start all buckets but at most one (the tied
// embedding's, which waits for both stages) before finish().
#include <catch2/catch.hpp>

#include <cmath>

#include "support/train_compare.h"

using namespace triax;
using namespace triax::test;

namespace {

constexpr int kSamples = 8;

TrainConfig step_config() {
  TrainConfig c = nano_train_config(1, 0.0, 2024);  // lr 0: the weights never move
  c.clip_grad = 0;                                  // off: the gradient is reported as synced
  c.bucket_mb = 0.01;                               // several DP buckets
  return c;
}

struct Reference {
  std::map<std::string, std::vector<float>> grad;  // mean of the per-sample gradients, full shapes
  double norm = 0;
};

// Per-sample gradients of the serial model, one sample per step, averaged in double.
const Reference& per_sample_mean() {
  static const Reference ref = [] {
    TrainConfig c = step_config();
    c.global_batch = 1;
    c.train_iters = kSamples;
    auto self = make_self_communicator("serial", test::world().rank());
    Trainer t(std::shared_ptr<Communicator>(std::move(self)), c);
    const ParamStore& st = t.store();
    std::vector<double> sum(st.flat_grads().size(), 0.0);
    for (int s = 0; s < kSamples; ++s) {
      const IterationMetrics m = t.step();
      REQUIRE(m.micro_batches == 1);
      const auto g = st.flat_grads();
      for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    Reference r;
    double sq = 0;
    for (size_t p = 0; p < st.size(); ++p) {
      const auto& info = st.info(p);
      auto& out = r.grad[info.spec.name];
      for (size_t i = 0; i < info.numel; ++i) {
        const double v = sum[info.offset + i] / kSamples;
        out.push_back(static_cast<float>(v));
        sq += v * v;
      }
    }
    r.norm = std::sqrt(sq);
    return r;
  }();
  return ref;
}

struct Layout {
  int tp, pp, vpp;
  const char* schedule;
  bool zero1, sp;
  int micro_batch;
};

// This rank's synced gradient of parameter p, and where it is held: the flat gradients (plain
// DP), or, under ZeRO-1, the pieces of this rank's shard (-1 marks elements another rank owns).
std::vector<double> synced_grad(Trainer& t, size_t p, std::vector<bool>& have) {
  const ParamStore& st = t.store();
  const auto& info = st.info(p);
  std::vector<double> g(info.numel, 0.0);
  have.assign(info.numel, !(t.config().zero == 1));
  if (!(t.config().zero == 1)) {
    for (size_t i = 0; i < info.numel; ++i) g[i] = st.flat_grads()[info.offset + i];
    return g;
  }
  const GradBuffer& gb = t.optimizer().grad_buffer();
  for (const auto& seg : gb.shard_segments())
    if (seg.param == p)
      for (size_t i = 0; i < seg.count; ++i) {
        const size_t e = seg.flat_offset - info.offset + i;
        g[e] = gb.shard_grads()[seg.shard_offset + i];
        have[e] = true;
      }
  return g;
}

void check_layout(const Layout& l) {
  const int dp = test::world().size() / (l.tp * l.pp);
  TrainConfig cfg = step_config();
  cfg.tp = l.tp;
  cfg.pp = l.pp;
  cfg.vpp = l.vpp;
  cfg.dp = dp;
  cfg.schedule = parse_schedule_kind(l.schedule);
  cfg.zero = (l.zero1) ? 1 : 0;
  cfg.sequence_parallel = l.sp;
  cfg.micro_batch = l.micro_batch;
  cfg.global_batch = kSamples;
  INFO("tp " << l.tp << " pp " << l.pp << " dp " << dp << " " << l.schedule << " vpp " << l.vpp << " zero1 "
             << l.zero1 << " sp " << l.sp << " micro-batch " << l.micro_batch);
  const Reference& ref = per_sample_mean();
  Trainer t(test::world_ptr(), cfg);
  const IterationMetrics m = t.step();
  REQUIRE(m.micro_batches == kSamples / l.micro_batch / dp);
  INFO("grad norm " << m.grad_norm << ", mean of the per-sample gradients " << ref.norm);
  CHECK(std::abs(m.grad_norm - ref.norm) <= 1e-6 * ref.norm);

  const int tp_rank = test::world().rank() % l.tp;  // tp is the fastest axis
  const ParamStore& st = t.store();
  double num = 0, den = 0;  // this rank's whole gradient
  size_t compared = 0;
  for (size_t p = 0; p < st.size(); ++p) {
    const auto& info = st.info(p);
    INFO(info.spec.name);
    std::vector<bool> have;
    const auto got = synced_grad(t, p, have);
    const auto want = serial_part(cfg, info.spec.name, ref.grad.at(info.spec.name), tp_rank);
    REQUIRE(want.size() <= got.size());
    double pn = 0, pd = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (!have[i]) continue;
      if (i >= want.size()) {
        CHECK(got[i] == 0.0);  // a padded vocabulary row: the loss never sees it
        continue;
      }
      pn += (got[i] - want[i]) * (got[i] - want[i]);
      pd += double(want[i]) * want[i];
      ++compared;
    }
    // Per tensor: 1e-5 of its own size, or of the whole gradient for tensors whose exact gradient
    // is ~0 (the key bias: softmax ignores a shift shared by all keys).
    CHECK(std::sqrt(pn) <= 1e-5 * std::sqrt(pd) + 1e-7 * ref.norm);
    num += pn;
    den += pd;
  }
  CHECK(compared > 0);
  CHECK(std::sqrt(num) <= 2e-6 * std::sqrt(den));
}

}  // namespace

TEST_CASE("the synced gradient is the mean of the per-sample gradients in every layout", "[train][grad]") {
  const int W = test::world().size();
  std::vector<Layout> layouts;
  if (W == 1) layouts = {{1, 1, 1, "1f1b", false, false, 1}, {1, 1, 1, "gpipe", false, false, 2}};
  if (W == 4)
    layouts = {{1, 1, 1, "1f1b", false, false, 1},  {1, 1, 1, "gpipe", true, false, 1},
               {1, 2, 1, "1f1b", true, false, 1},   {1, 2, 2, "interleaved", false, false, 1},
               {2, 2, 1, "zb-h1", false, true, 2},  {2, 1, 1, "gpipe", true, true, 1},
               {1, 2, 1, "zb-h1", false, false, 2}};
  REQUIRE(!layouts.empty());
  for (const auto& l : layouts) check_layout(l);
}

TEST_CASE("the executor overlaps the DP gradient sync with backward in every schedule", "[train][overlap]") {
  if (test::world().size() != 4) {
    SUCCEED("pp 2 x dp 2 needs 4 ranks");
    return;
  }
  struct Sched {
    const char* name;
    int vpp;
  };
  for (const Sched s : {Sched{"1f1b", 1}, Sched{"zb-h1", 1}, Sched{"interleaved", 2}, Sched{"gpipe", 1}}) {
    for (bool zero1 : {false, true}) {
      TrainConfig cfg = nano_train_config(2, 5e-4, 99);
      cfg.pp = 2;
      cfg.dp = 2;
      cfg.schedule = parse_schedule_kind(s.name);
      cfg.vpp = s.vpp;
      cfg.zero = (zero1) ? 1 : 0;
      cfg.bucket_mb = 0.01;
      cfg.overlap_grad_reduce = true;
      Trainer t(test::world_ptr(), cfg);
      for (int it = 0; it < 2; ++it) {
        t.step();
        const GradSyncStats& st = t.last_report().sync;
        INFO(s.name << " zero1 " << zero1 << " iteration " << it + 1 << ": " << st.started_early << " of "
                    << st.buckets << " buckets started before finish()");
        REQUIRE(st.buckets >= 3);  // several buckets, or the check says nothing
        CHECK(st.started_early + 1 >= st.buckets);
      }
    }
  }
}
