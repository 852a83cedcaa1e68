// Model shapes: validation, presets, parameter counts against Megatron's closed form, and FLOP
// counts against the SC21 Eq. 3 and a hand-expanded small case.
#include <catch2/catch.hpp>

#include "triax/core/error.h"
#include "triax/plan/cluster.h"
#include "triax/plan/collective_model.h"
#include "triax/plan/cost_model.h"
#include "triax/plan/layout.h"
#include "triax/plan/model_shape.h"

using namespace triax::plan;

TEST_CASE("parameter count matches Megatron's 12lh^2(1 + 13/(12h) + (V+s)/(12lh)) for every preset") {
  for (const auto& m : model_presets()) {
    INFO(m.name);
    const double l = m.layers, h = m.hidden, V = m.vocab, s = m.seq;
    const double megatron = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
    // Megatron's form leaves out the final LayerNorm (2h).
    CHECK(total_parameters(m) == Approx(megatron + 2 * h).epsilon(1e-12));
  }
}

TEST_CASE("a 1.7B and a 1T preset have the sizes their names say") {
  CHECK(total_parameters(model_preset("megatron-1.7b")) / 1e9 == Approx(1.65).epsilon(0.01));
  CHECK(total_parameters(model_preset("megatron-1t")) / 1e9 == Approx(1008).epsilon(0.001));
  CHECK(total_parameters(model_preset("gpt2-small")) / 1e6 == Approx(124.4).epsilon(0.01));
}

TEST_CASE("full-recompute executed FLOPs equal SC21 Eq. 3 exactly") {
  for (const char* name : {"megatron-1.7b", "megatron-39b", "megatron-1t", "gpt3-175b"}) {
    INFO(name);
    const ModelShape m = model_preset(name);
    Layout l;
    l.recompute = Recompute::full;
    l.attention = AttentionKernel::unfused;
    CHECK(iteration_flops(m, l).executed == Approx(megatron_eq3_flops(m)).epsilon(1e-12));
    // Without the recomputed forward: 3/4 of Eq. 3's layer part plus all of its head part.
    const double B = m.global_batch, s = m.seq, h = m.hidden, V = m.vocab, L = m.layers;
    const double model = 72 * B * s * L * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V;
    CHECK(iteration_flops(m, l).model == Approx(model).epsilon(1e-12));
  }
}

TEST_CASE("FLOPs of a hand-expanded model with ffn != 4h") {
  ModelShape m;
  m.layers = 2;
  m.hidden = 8;
  m.heads = 2;
  m.ffn = 16;
  m.vocab = 10;
  m.seq = 4;
  m.global_batch = 3;
  // Per token per layer: 8h^2 + 4hf + 4sh = 512 + 512 + 128 = 1152; per sequence x4 = 4608.
  CHECK(layer_forward_flops_per_sequence(m) == 4608);
  CHECK(head_forward_flops_per_sequence(m) == 640);    // 2 s h V
  CHECK(attention_core_flops_per_sequence(m) == 512);  // 4 s^2 h
  Layout l;
  l.attention = AttentionKernel::unfused;
  l.recompute = Recompute::none;
  CHECK(iteration_flops(m, l).model == 88704);  // 3 B (l * 4608 + 640)
  CHECK(iteration_flops(m, l).executed == 88704);
  l.recompute = Recompute::full;
  CHECK(iteration_flops(m, l).executed == 88704 + 3 * 2 * 4608);
  l.recompute = Recompute::selective;
  CHECK(iteration_flops(m, l).executed == 88704 + 3 * 2 * 512);
  // Megatron-Core's selective granularity checkpoints the core attention whatever its kernel, so a
  // fused kernel's forward is redone too.
  l.attention = AttentionKernel::fused;
  CHECK(iteration_flops(m, l).executed == 88704 + 3 * 2 * 512);
  // Parameters: layer 4h^2 + 2hf + 9h + f = 256 + 256 + 72 + 16 = 600; embeddings Vh + sh + 2h.
  CHECK(layer_parameters(m) == 600);
  CHECK(embedding_parameters(m) == 80 + 32 + 16);
  m.tied_embeddings = false;
  CHECK(embedding_parameters(m) == 80 + 32 + 16 + 80);
}

TEST_CASE("grouped-query attention: a narrower QKV projection in parameters, FLOPs and the QKV GEMM") {
  ModelShape m;
  m.layers = 2;
  m.hidden = 8;
  m.heads = 4;
  m.ffn = 16;
  m.vocab = 10;
  m.seq = 4;
  m.global_batch = 3;
  CHECK(m.qkv_width() == 24);  // 3h without GQA
  m.kv_heads = 2;              // head dim 2: QKV width 8 + 2 x 2 x 2 = 16
  CHECK(m.kv_head_count() == 2);
  CHECK(m.qkv_width() == 16);
  // Per token per layer: 2 h q + 2 h^2 + 4 h f + 4 s h = 256 + 128 + 512 + 128 = 1024; x4 tokens.
  CHECK(layer_forward_flops_per_sequence(m) == 4096);
  // QKV h q + q = 144, projection h^2 + h = 72, MLP 2hf + f + h = 280, LayerNorms 4h = 32.
  CHECK(layer_parameters(m) == 528);
  m.kv_heads = 3;
  CHECK_THROWS_WITH(validate(m), Catch::Contains("kv_heads 3 must divide heads 4"));

  // The cost model prices the narrower QKV GEMM: with nothing memory bound the forward compute time
  // is the executed FLOPs over the GEMM rate, so it shrinks by exactly the FLOPs GQA removes.
  ModelShape big = model_preset("megatron-7.5b");
  Layout l;
  l.tp = 4;
  l.micro_batch = 1;
  l.dp = 1;
  l.attention = AttentionKernel::unfused;
  const CollectiveModel net(cluster_preset("selene-a100"));
  const double mha = estimate(big, net, l).time.compute;
  big.kv_heads = 8;
  const double gqa = estimate(big, net, l).time.compute;
  CHECK(gqa < mha);
  CHECK(big.qkv_width() == 4096 + 2 * 8 * 128);
  // tp must divide the key/value groups (a rank holds whole groups).
  big.kv_heads = 2;
  CHECK(layout_problem(big, cluster_preset("selene-a100"), l, LayoutRules{}).value_or("") ==
        "tp 4 does not divide kv_heads 2 (each rank holds whole key/value groups)");
}

TEST_CASE("model validation names the bad field") {
  ModelShape good = model_preset("gpt2-small");
  REQUIRE_NOTHROW(validate(good));
  auto bad = good;
  bad.layers = 0;
  CHECK_THROWS_WITH(validate(bad), Catch::Contains("layers must be positive"));
  bad = good;
  bad.heads = 7;
  CHECK_THROWS_WITH(validate(bad), Catch::Contains("hidden 768 is not a multiple of heads 7"));
  bad = good;
  bad.ffn = -1;
  CHECK_THROWS_AS(validate(bad), triax::ConfigError);
  bad = good;
  bad.global_batch = 0;
  CHECK_THROWS_WITH(validate(bad), Catch::Contains("global_batch"));
  for (auto field : {&ModelShape::hidden, &ModelShape::vocab, &ModelShape::seq}) {
    bad = good;
    bad.*field = -3;
    CHECK_THROWS_AS(validate(bad), triax::ConfigError);
  }
}

TEST_CASE("unknown model preset lists the known ones") {
  CHECK_THROWS_WITH(model_preset("gpt5"),
                    Catch::Contains("unknown model preset 'gpt5'") && Catch::Contains("megatron-1t"));
  for (const auto& m : model_presets()) CHECK_NOTHROW(validate(m));
}
