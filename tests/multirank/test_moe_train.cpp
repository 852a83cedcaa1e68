// MoE in the trainer: for ep = 1, 2, 4 (and with tp and pp on top), in drop and no-drop modes and
// top-1 and top-2 routing, the losses of 3 iterations and every weight (experts by their global
// names) equal the serial run. Each DP rank routes its own micro-batches, whose tokens match the
// serial run's micro-batches one for one, so routing and capacity drops are the same. The same for
// the Llama block with Mixtral-shaped experts (SwiGLU, no biases).
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

TEST_CASE("expert parallelism trains the serial Mixtral-shaped model (Llama block, SwiGLU experts)", "[train][moe][llama]") {
  // llama-nano (RMSNorm, RoPE, 8 query heads over 4 KV heads, untied head) with every other MLP a
  // MoE of SwiGLU experts without biases, HF Mixtral names: ep with tp (which divides the KV heads)
  // and pp on top, drop and no-drop, top-2 as in Mixtral and top-1 once.
  const int W = test::world().size();
  struct Layout {
    int tp, pp, ep;
    const char* schedule;
    int topk;
  };
  std::vector<Layout> layouts;
  if (W == 4) layouts = {{1, 1, 4, "1f1b", 2}, {2, 1, 2, "1f1b", 2}, {1, 2, 2, "zb-h1", 1}};
  if (W == 8) layouts = {{2, 2, 2, "1f1b", 2}, {1, 2, 4, "gpipe", 2}};
  REQUIRE(!layouts.empty());
  int runs = 0;
  for (const auto& l : layouts)
    for (bool no_drop : {false, true}) {
      TrainConfig cfg = moe_config();
      cfg.model = "llama-nano";
      cfg.tp = l.tp;
      cfg.pp = l.pp;
      cfg.ep = l.ep;
      cfg.schedule = parse_schedule_kind(l.schedule);
      cfg.no_drop = no_drop;
      cfg.topk = l.topk;
      cfg.moe_chunks = 1 + runs % 2;
      INFO("llama tp " << l.tp << " pp " << l.pp << " ep " << l.ep << " " << l.schedule << " no_drop " << no_drop
                       << " topk " << l.topk << " chunks " << cfg.moe_chunks);
      const Result got = train(test::world_ptr(), cfg);
      // The experts really are Mixtral's: HF names, gate/up/down, no biases (4 layers, MoE every
      // other one: every stage of pp 2 holds one MoE layer).
      bool saw_w3 = false;
      for (const auto& [name, v] : got.params) {
        REQUIRE(name.find(".moe.") == std::string::npos);
        if (name.find("block_sparse_moe.experts.") != std::string::npos) {
          CHECK(!name.ends_with(".bias"));
          saw_w3 |= name.ends_with(".w3.weight");
        }
      }
      CHECK(saw_w3);
      compare(cfg, got, test::world().rank() % l.tp);
      ++runs;
    }
  REQUIRE(runs >= 4);
}
