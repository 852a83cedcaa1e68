// The Llama block in the planner: presets against the published parameter counts, the planner's
// counts against triax's own GptConfig::num_params for every block choice, a hand-expanded small
// case, and what SwiGLU, RMSNorm, RoPE, biases and the untied head change in time and memory.
#include <catch2/catch.hpp>

#include "triax/model/config.h"
#include "triax/plan/cluster.h"
#include "triax/plan/collective_model.h"
#include "triax/plan/cost_model.h"
#include "triax/plan/layout.h"
#include "triax/plan/model_shape.h"

using namespace triax::plan;

namespace {

// The planner's view of a triax model config (padded vocabulary: the rows triax stores).
ModelShape shape_of(const triax::GptConfig& c) {
  ModelShape m;
  m.name = "from-config";
  m.layers = c.n_layer;
  m.hidden = c.n_embd;
  m.heads = c.n_head;
  m.kv_heads = c.n_kv_head;
  m.ffn = c.ffn;
  m.vocab = c.padded_vocab(1);
  m.seq = c.max_seq;
  m.global_batch = 1;
  m.tied_embeddings = c.tied_embeddings;
  m.learned_positions = c.positions == triax::PositionEmbedding::learned_absolute;
  m.rope = c.positions == triax::PositionEmbedding::rope;
  m.swiglu = c.swiglu;
  m.rmsnorm = c.norm == triax::Norm::rmsnorm;
  m.bias = c.bias;
  return m;
}

// The hand-expanded shape: 2 layers, h 8, 4 heads of 2 over 2 kv heads, f 16, V 10, s 4, B 3.
ModelShape small_llama() {
  ModelShape m;
  m.name = "small-llama";
  m.layers = 2;
  m.hidden = 8;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn = 16;
  m.vocab = 10;
  m.seq = 4;
  m.global_batch = 3;
  m.swiglu = m.rmsnorm = m.rope = true;
  m.bias = m.tied_embeddings = m.learned_positions = false;
  return m;
}

Layout one_gpu() {
  Layout l;
  l.micro_batch = 1;
  l.attention = AttentionKernel::unfused;
  l.recompute = Recompute::none;
  return l;
}

}  // namespace

TEST_CASE("Llama presets have Meta's published parameter counts (within 0.5%)") {
  // Model cards: Meta-Llama-3-8B 8.03B, Meta-Llama-3-70B 70.6B, Llama-3.2-1B 1.24B.
  CHECK(total_parameters(model_preset("llama3-8b")) / 1e9 == Approx(8.03).epsilon(0.005));
  CHECK(total_parameters(model_preset("llama3-70b")) / 1e9 == Approx(70.6).epsilon(0.005));
  CHECK(total_parameters(model_preset("llama3.2-1b")) / 1e9 == Approx(1.24).epsilon(0.005));
  for (const auto& m : llama_presets()) {
    INFO(m.name);
    CHECK_NOTHROW(validate(m));
    CHECK(m.swiglu);
    CHECK(m.rmsnorm);
    CHECK(m.rope);
    CHECK_FALSE(m.learned_positions);
    CHECK_FALSE(m.bias);
    CHECK(block_choices(m).find("SwiGLU, RMSNorm, RoPE, no biases") == 0);
  }
  CHECK(block_choices(model_preset("gpt2-small")).empty());
}

TEST_CASE("the planner's parameter count equals GptConfig::num_params for the same shapes") {
  // Every preset triax and the planner share by name (one source of shapes each).
  for (const char* name : {"llama3.2-1b", "llama3-8b", "llama3-70b"}) {
    INFO(name);
    const triax::GptConfig c = triax::GptConfig::preset(name);
    const ModelShape p = model_preset(name);
    CHECK(p.layers == c.n_layer);
    CHECK(p.hidden == c.n_embd);
    CHECK(p.heads == c.n_head);
    CHECK(p.kv_head_count() == c.kv_heads());
    CHECK(p.ffn_hidden() == c.ffn_size());
    CHECK(p.vocab == c.padded_vocab(1));
    CHECK(p.tied_embeddings == c.tied_embeddings);
    CHECK(total_parameters(p) == double(c.num_params()));
  }
  // Every triax preset through the shape mapping.
  for (const auto& name : triax::GptConfig::preset_names()) {
    INFO(name);
    const triax::GptConfig c = triax::GptConfig::preset(name);
    CHECK(total_parameters(shape_of(c)) == double(c.num_params()));
  }
  // Every combination of the block's choices on a small shape.
  for (int bits = 0; bits < 64; ++bits) {
    triax::GptConfig c = triax::GptConfig::preset("llama-nano");
    c.swiglu = bits & 1;
    c.norm = bits & 2 ? triax::Norm::rmsnorm : triax::Norm::layernorm;
    c.bias = bits & 4;
    c.positions = bits & 8 ? triax::PositionEmbedding::rope : triax::PositionEmbedding::learned_absolute;
    c.tied_embeddings = bits & 16;
    c.n_kv_head = bits & 32 ? 2 : 0;
    INFO(c.describe());
    const ModelShape m = shape_of(c);
    REQUIRE_NOTHROW(validate(m));
    CHECK(total_parameters(m) == double(c.num_params()));
  }
}

TEST_CASE("FLOPs and parameters of a hand-expanded Llama block") {
  ModelShape m = small_llama();
  REQUIRE_NOTHROW(validate(m));
  CHECK(m.qkv_width() == 16);  // 8 + 2 x 2 kv heads x 2
  CHECK(m.fc1_width() == 32);  // gate and up
  // Per token per layer: 2hq + 2h^2 + 6hf + 4sh = 256 + 128 + 768 + 128 = 1280; x4 tokens.
  CHECK(layer_forward_flops_per_sequence(m) == 5120);
  CHECK(head_forward_flops_per_sequence(m) == 640);  // 2 s h V, tied or not
  const Layout l = one_gpu();
  CHECK(iteration_flops(m, l).model == 97920);  // 3 B (l * 5120 + 640)
  // Layer: QKV h q = 128, projection h^2 = 64, gate/up/down 3hf = 384, two RMSNorms 2h = 16.
  CHECK(layer_parameters(m) == 592);
  // Token table V h = 80, final RMSNorm h = 8, untied head V h = 80.
  CHECK(embedding_parameters(m) == 168);
  CHECK(total_parameters(m) == 1352);
  // Biases: QKV q = 16, projection h = 8, gate and up 2f = 32, down h = 8.
  m.bias = true;
  CHECK(layer_parameters(m) == 592 + 64);
  m.rmsnorm = false;  // LayerNorm biases: 2h per layer, h on the final norm
  CHECK(layer_parameters(m) == 592 + 64 + 16);
  CHECK(embedding_parameters(m) == 168 + 8);
  m.tied_embeddings = true;
  CHECK(embedding_parameters(m) == 168 + 8 - 80);
  m.learned_positions = true;  // a position table s h = 32
  CHECK(embedding_parameters(m) == 168 + 8 - 80 + 32);
  // The GELU MLP at the same f: two matrices, 4hf FLOPs.
  m.swiglu = false;
  CHECK(layer_forward_flops_per_sequence(m) == 5120 - 4 * 2 * 8 * 16);
}

TEST_CASE("SwiGLU's activations: its input (2f) and output (f) instead of GeLU's input and output (2f)") {
  const ModelShape llama = model_preset("llama3-8b");
  ModelShape gelu = llama;
  gelu.swiglu = false;
  for (int tp : {1, 4, 8}) {
    for (bool sp : {false, true}) {
      INFO("tp " << tp << " sp " << sp);
      Layout l = one_gpu();
      l.tp = tp;
      l.sequence_parallel = sp;
      l.attention = AttentionKernel::fused;
      const double e = 2, M = double(l.micro_batch) * llama.seq, f = llama.ffn_hidden();
      CHECK(layer_activation_bytes(llama, l) - layer_activation_bytes(gelu, l) == Approx(e * M * f / tp));
      // RMSNorm, RoPE and the missing biases store nothing the GPT block does not.
      ModelShape gpt_block = gelu;
      gpt_block.rmsnorm = gpt_block.rope = false;
      gpt_block.bias = gpt_block.learned_positions = true;
      CHECK(layer_activation_bytes(gpt_block, l) == layer_activation_bytes(gelu, l));
      // Full recomputation keeps the layer input only, whatever the block.
      l.recompute = Recompute::full;
      CHECK(layer_activation_bytes(llama, l) == layer_activation_bytes(gpt_block, l));
    }
  }
}

TEST_CASE("the untied head: its own weights, gradient and optimizer state, the same FLOPs") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  ModelShape untied = model_preset("llama3-8b");
  ModelShape tied = untied;
  tied.tied_embeddings = true;
  CHECK(total_parameters(untied) - total_parameters(tied) == double(untied.vocab) * untied.hidden);
  Layout l = one_gpu();
  l.attention = AttentionKernel::fused;
  l.tp = 8;
  l.dp = 64;
  CHECK(iteration_flops(untied, l).model == iteration_flops(tied, l).model);
  // One pipeline rank holds both: V h / t more parameters, at 2 (bf16 weights) + 4 (fp32
  // gradients) + 12 (master and Adam) bytes each.
  const double head = double(untied.vocab) * untied.hidden / l.tp;
  const Estimate a = estimate(untied, net, l), b = estimate(tied, net, l);
  CHECK(a.memory.weights - b.memory.weights == Approx(2 * head));
  CHECK(a.memory.gradients - b.memory.gradients == Approx(4 * head));
  CHECK(a.memory.optimizer - b.memory.optimizer == Approx(12 * head));
  // Under pipeline parallelism a tied head is a copy on the last rank too, kept in step by an
  // all-reduce that an untied head does not need.
  l.pp = 4;
  l.dp = 16;
  const Estimate c = estimate(untied, net, l), d = estimate(tied, net, l);
  CHECK(c.memory.weights == Approx(d.memory.weights));
  CHECK(c.time.dp_comm < d.time.dp_comm);
}

TEST_CASE("the cost model prices SwiGLU's three GEMMs, RoPE's rotation and the missing biases") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  const ModelShape llama = model_preset("llama3-8b");
  Layout l = one_gpu();
  l.attention = AttentionKernel::fused;
  l.tp = 8;
  l.dp = 64;
  const double base = estimate(llama, net, l).time.compute;
  // GELU at the same f: a third fewer MLP FLOPs, so less time.
  ModelShape gelu = llama;
  gelu.swiglu = false;
  CHECK(estimate(gelu, net, l).time.compute < base);
  // RoPE: elementwise time on q and k (forward and backward); without it the layer is faster.
  ModelShape no_rope = llama;
  no_rope.rope = false;
  CHECK(estimate(no_rope, net, l).time.compute < base);
  // The triax runtime's bias fills and column sums exist only with biases.
  l.runtime_copies = true;
  ModelShape biased = llama;
  biased.bias = true;
  CHECK(estimate(biased, net, l).time.compute > estimate(llama, net, l).time.compute);
  // RMSNorm moves the same bytes as LayerNorm: the time is the same.
  l.runtime_copies = false;
  ModelShape layernorm = llama;
  layernorm.rmsnorm = false;
  CHECK(estimate(layernorm, net, l).time.compute == Approx(base));
  // Odd head sizes cannot be rotated.
  ModelShape odd = small_llama();
  odd.hidden = 12;  // 4 heads of 3
  odd.kv_heads = 0;
  CHECK_THROWS_WITH(validate(odd), Catch::Contains("rotary positions need an even head size, got 3"));
}

TEST_CASE("every Llama preset has a layout that fits its cluster") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  struct Case {
    const char* name;
    int tp, pp, dp;
  };
  for (const Case& c : {Case{"llama3.2-1b", 1, 1, 64}, Case{"llama3-8b", 4, 1, 32}, Case{"llama3-70b", 8, 4, 16}}) {
    INFO(c.name);
    Layout l = one_gpu();
    l.attention = AttentionKernel::fused;
    l.tp = c.tp;
    l.pp = c.pp;
    l.dp = c.dp;
    l.sequence_parallel = c.tp > 1;
    l.recompute = Recompute::selective;
    l.zero = 1;
    const Estimate e = estimate(model_preset(c.name), net, l);
    CHECK(e.memory.fits());
    CHECK(e.mfu > 0.2);
    CHECK(e.mfu < 0.8);
  }
}
