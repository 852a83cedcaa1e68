// Initialisation is a pure function of (seed, name); shards tile the full tensor exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <numeric>

#include "triax/model/config.h"
#include "triax/model/param_shards.h"

using namespace triax;

TEST_CASE("init_normal depends on seed and name only, with the right moments", "[shard]") {
  const auto a = init_normal(7, "h.0.attn.c_attn.weight", 20000, 0.02f);
  const auto b = init_normal(7, "h.0.attn.c_attn.weight", 20000, 0.02f);
  const auto c = init_normal(7, "h.1.attn.c_attn.weight", 20000, 0.02f);
  const auto d = init_normal(8, "h.0.attn.c_attn.weight", 20000, 0.02f);
  REQUIRE(a == b);
  REQUIRE(a != c);
  REQUIRE(a != d);
  // A prefix does not depend on the length requested.
  const auto p = init_normal(7, "h.0.attn.c_attn.weight", 100, 0.02f);
  REQUIRE(std::equal(p.begin(), p.end(), a.begin()));
  double mean = 0, var = 0;
  for (float x : a) mean += x;
  mean /= a.size();
  for (float x : a) var += (x - mean) * (x - mean);
  var /= a.size();
  REQUIRE(std::abs(mean) < 0.02 * 0.05);
  REQUIRE(std::sqrt(var) == Approx(0.02).epsilon(0.03));
}

TEST_CASE("shards of every split tile the full tensor and round-trip", "[shard]") {
  const std::vector<int64_t> shape = {12, 8};
  std::vector<float> full(96);
  std::iota(full.begin(), full.end(), 1.0f);
  for (TpSplit s : {TpSplit::none, TpSplit::rows, TpSplit::cols, TpSplit::qkv_rows})
    for (int tp : {1, 2, 4}) {
      std::vector<float> back(96, -1.0f);
      size_t total = 0;
      for (int r = 0; r < tp; ++r) {
        const auto sh = shard_of(full, shape, s, r, tp);
        const auto ls = shard_shape(shape, s, tp, "w");
        REQUIRE(static_cast<int64_t>(sh.size()) == ls[0] * ls[1]);
        total += sh.size();
        place_shard(sh, back, shape, s, r, tp);
      }
      REQUIRE(back == full);
      if (s != TpSplit::none) REQUIRE(total == full.size());
    }
  // Exact content: a column shard of a 2x4 matrix, and the QKV shard picks the head block of each part.
  const std::vector<float> m = {0, 1, 2, 3, 4, 5, 6, 7};
  REQUIRE(shard_of(m, {2, 4}, TpSplit::cols, 1, 2) == std::vector<float>{2, 3, 6, 7});
  const std::vector<float> qkv = {10, 11, 20, 21, 30, 31};  // (6, 1): Q=[10,11], K=[20,21], V=[30,31]
  REQUIRE(shard_of(qkv, {6, 1}, TpSplit::qkv_rows, 1, 2) == std::vector<float>{11, 21, 31});
}

TEST_CASE("splits that do not divide are refused, naming the parameter", "[shard]") {
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(shard_shape({10, 6}, TpSplit::rows, 4, "h.0.mlp.c_fc.weight"),
                      Contains("h.0.mlp.c_fc.weight") && Contains("tp=4"));
  REQUIRE_THROWS_WITH(shard_shape({9, 4}, TpSplit::qkv_rows, 2, "qkv"), Contains("Q, K, V"));
}

TEST_CASE("model config presets and validation", "[config]") {
  using Catch::Matchers::Contains;
  const auto g = GptConfig::preset("gpt2-124m");
  REQUIRE(g.padded_vocab(1) == 50304);
  REQUIRE(g.num_params() == 124475904);  // llm.c's count for GPT-2 124M with the padded vocab
  REQUIRE(GptConfig::preset("nano").padded_vocab(4) == 68);
  REQUIRE(GptConfig::preset("tiny").n_layer % 8 == 0);
  REQUIRE_THROWS_WITH(GptConfig::preset("gpt2-124m").validate(5), Contains("12 attention heads") && Contains("tp=5"));
  REQUIRE_THROWS_WITH(GptConfig::preset("gpt2-2t"), Contains("unknown model preset 'gpt2-2t'"));
  GptConfig bad = GptConfig::preset("nano");
  bad.ffn = 130;
  REQUIRE_THROWS_WITH(bad.validate(4), Contains("130") && Contains("tp=4"));
}
