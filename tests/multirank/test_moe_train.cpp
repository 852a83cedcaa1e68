// MoE in the trainer: for ep = 1, 2, 4 (and with tp and pp on top), in drop and no-drop modes and
// top-1 and top-2 routing, the losses of 3 iterations and every weight (experts by their global
// names) equal the serial run. Each DP rank routes its own micro-batches, whose tokens match the
// serial run's micro-batches one for one, so routing and capacity drops are the same.
#include <catch2/catch.hpp>

#include "support/train_compare.h"

using namespace triax;
using namespace triax::test;

namespace {
TrainConfig moe_config() {
  TrainConfig c = nano_train_config(3, 5e-4, 777);
  c.warmup_iters = 1;
  c.bucket_mb = 0.01;
  c.moe_every = 2;
  c.experts = 4;
  c.capacity_factor = 1.0;  // tight: some assignments are dropped in drop mode
  return c;
}
}  // namespace

TEST_CASE("expert parallelism trains the serial MoE model", "[train][moe]") {
  const int W = test::world().size();
  struct Layout {
    int tp, pp, ep;
    const char* schedule;
  };
  std::vector<Layout> layouts;
  if (W == 4) layouts = {{1, 1, 1, "1f1b"}, {1, 1, 2, "1f1b"}, {1, 1, 4, "1f1b"}, {2, 1, 2, "1f1b"}, {1, 2, 2, "1f1b"}};
  if (W == 8) layouts = {{2, 2, 2, "1f1b"}, {1, 2, 4, "zb-h1"}, {2, 1, 4, "gpipe"}};
  REQUIRE(!layouts.empty());
  int runs = 0;
  for (const auto& l : layouts)
    for (bool no_drop : {false, true})
      for (int topk : {1, 2}) {
        TrainConfig cfg = moe_config();
        cfg.tp = l.tp;
        cfg.pp = l.pp;
        cfg.ep = l.ep;
        cfg.schedule = parse_schedule_kind(l.schedule);
        cfg.no_drop = no_drop;
        cfg.topk = topk;
        cfg.moe_chunks = 1 + runs % 2;  // the overlap knob never changes the math
        INFO("tp " << l.tp << " pp " << l.pp << " ep " << l.ep << " " << l.schedule << " no_drop " << no_drop
                   << " topk " << topk << " chunks " << cfg.moe_chunks);
        const Result got = train(test::world_ptr(), cfg);
        compare(cfg, got, test::world().rank() % l.tp);
        ++runs;
      }
  REQUIRE(runs >= 12);
}
