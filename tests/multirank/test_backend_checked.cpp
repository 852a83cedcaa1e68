// The Backend seam holds: whole 3D training steps run through the checking CPU backend, whose
// buffers are PROT_NONE outside its own calls and the communicator calls on them, so any read or
// write of buffer memory by model, optimizer, executor or trainer code would kill the rank with
// SIGSEGV. The runs cover GPT-2 and Llama blocks, dense and MoE layers, every schedule kind, ZeRO-1/2/3, sequence parallelism
// and each recompute mode, and must produce exactly the plain CPU backend's losses and weights.
#include <catch2/catch.hpp>

#include "support/train_compare.h"

using namespace triax;
using namespace triax::test;

namespace {

TrainConfig base() {
  TrainConfig c = nano_train_config(2, 5e-4, 77);
  c.bucket_mb = 0.01;
  return c;
}

struct Layout {
  int tp, pp;
  const char* schedule;
  int vpp;
  int zero;
  bool sp;
  const char* recompute;
  int moe_every, ep;
  const char* model = "nano";
};

}  // namespace

TEST_CASE("3D steps through the checking backend equal the plain backend bit for bit", "[backend][train]") {
  const int W = test::world().size();
  std::vector<Layout> layouts = {
      {2, 2, "1f1b", 1, 1, true, "selective", 0, 1},
      {1, 2, "zb-h1", 1, 0, false, "none", 0, 1},
      {2, 2, "interleaved", 2, 0, false, "full", 0, 1},
      {1, 2, "gpipe", 1, 0, false, "none", 2, 2},
      // The Llama block (RMSNorm, SwiGLU, RoPE tables, GQA, untied head), dense and MoE.
      {2, 2, "interleaved", 2, 1, true, "full", 0, 1, "llama-nano"},
      {2, 1, "1f1b", 1, 0, false, "selective", 2, 2, "llama-nano"},
      // ZeRO-2/3: unit gathers, per-pass gradient buffers and their reduce-scatters on backend buffers only.
      {1, 2, "1f1b", 1, 3, false, "selective", 0, 1},
      {2, 1, "1f1b", 1, 2, true, "none", 0, 1},
      {1, 2, "interleaved", 2, 3, false, "full", 0, 1, "llama-nano"},
      {1, 1, "gpipe", 1, 3, false, "none", 2, 2},
  };
  for (const auto& l : layouts) {
    if (W % (l.tp * l.pp) != 0) continue;
    const int dp = W / (l.tp * l.pp);
    if (l.ep > dp || dp % l.ep != 0) continue;
    TrainConfig cfg = base();
    cfg.model = l.model;
    cfg.tp = l.tp;
    cfg.pp = l.pp;
    cfg.dp = dp;
    cfg.schedule = parse_schedule_kind(l.schedule);
    cfg.vpp = l.vpp;
    cfg.zero = l.zero;
    cfg.sequence_parallel = l.sp;
    cfg.recompute = parse_recompute(l.recompute);
    cfg.moe_every = l.moe_every;
    cfg.experts = 4;
    cfg.ep = l.ep;
    INFO(l.model << " tp " << l.tp << " pp " << l.pp << " dp " << dp << " " << l.schedule << " zero " << l.zero << " sp "
               << l.sp << " recompute " << l.recompute << " moe " << l.moe_every);
    const Result plain = train(world_ptr(), cfg);
    cfg.backend = "cpu-checked";
    const Result checked = train(world_ptr(), cfg);
    REQUIRE(plain.losses.size() == 2);
    CHECK(checked.losses == plain.losses);
    CHECK(checked.params == plain.params);
  }
}

TEST_CASE("the executor releases each send buffer as its send completes", "[backend][pipeline]") {
  // 1F1B over two stages with 8 micro-batches per DP rank: every stage sends 8 tensors a step
  // (activations forward, gradients back). Held until the end of the step, as before the seam,
  // that is 8 at once; released as each (small, eagerly completing) send finishes, at most the
  // schedule's in-flight depth, p = 2.
  const int W = test::world().size();
  if (W % 2 != 0) return;
  TrainConfig cfg = base();
  cfg.pp = 2;
  cfg.dp = W / 2;
  cfg.schedule = ScheduleKind::one_f_one_b;
  cfg.global_batch = 8 * (W / 2);
  cfg.backend = "cpu-checked";
  Trainer t(world_ptr(), cfg);
  t.train([](const IterationMetrics&) {});
  const size_t peak = t.last_step().peak_send_buffers;
  INFO("stage " << t.grid().coord().pp << ": " << t.last_step().micro_batches << " micro-batches, at most " << peak
                << " send buffers held");
  CHECK(t.last_step().micro_batches == 8);
  CHECK(peak >= 1);
  CHECK(peak <= 2);
}
