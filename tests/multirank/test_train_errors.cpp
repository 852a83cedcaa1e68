// Wrong knob combinations and layouts that do not divide the model or the world fail on every
// rank with a ConfigError that shows the numbers.
#include <catch2/catch.hpp>

#include "support/multirank.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
TrainConfig tiny() {
  TrainConfig c;
  c.model = "nano";
  c.layers = 8;
  c.seq = 8;
  c.train_iters = 1;
  return c;
}
}  // namespace

TEST_CASE("bad layouts and knobs are refused with the arithmetic", "[train][errors]") {
  auto w = test::world_ptr();
  REQUIRE(w->size() == 4);
  auto with = [](auto f) {
    TrainConfig c = tiny();
    f(c);
    return c;
  };
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.tp = 3; })), Contains("not divisible by tp 3 x pp 1"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.tp = 2; c.pp = 2; c.dp = 2; })),
                      Contains("2 x 2 x 2 = 8") && Contains("4 ranks"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.layers = 6; c.pp = 4; })),
                      Contains("6 layers cannot be split evenly over pp 4"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.pp = 2; c.pipeline_layers = {3, 4}; })),
                      Contains("sum to 7") && Contains("8 layers"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.tp = 4; c.heads = 6; c.hidden = 36; })),
                      Contains("6 attention heads cannot be split over tp=4"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.global_batch = 32; c.micro_batch = 4; c.num_micro_batches = 3; })),
                      Contains("global batch 32 != micro-batch 4 x dp 4 x micro-batches 3 = 48"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.global_batch = 30; c.micro_batch = 4; })),
                      Contains("not divisible"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.pp = 2; c.schedule = ScheduleKind::interleaved; c.vpp = 2;
                                                    c.micro_batch = 1; c.num_micro_batches = 3; })),
                      Contains("3"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.vpp = 2; })), Contains("interleaved"));
  // Configurations built in code get the same range checks as flags and config files.
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.micro_batch = 0; })),
                      Contains("micro-batch-size = 0: out of range; expected an integer >= 1"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.clip_grad = -1; })), Contains("clip-grad = -1"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.bucket_mb = 0; })), Contains("bucket-mb = 0"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.seq = 999; })), Contains("999"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.data = "/nonexistent/shard.bin"; })),
                      Contains("/nonexistent/shard.bin"));
  REQUIRE_THROWS_WITH(Trainer(w, with([](auto& c) { c.data = "/nonexistent/corpus.txt"; c.vocab = 256; })),
                      Contains("/nonexistent/corpus.txt"));
  // Every rank is still in step after the failures: a collective completes.
  int one[1] = {1};
  w->all_reduce(std::span<int>(one)).wait();
  REQUIRE(one[0] == 4);
}
