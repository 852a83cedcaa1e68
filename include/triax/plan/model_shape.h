// The shape of a GPT-style decoder-only Transformer as the planner sees it: sizes only, no
// weights. Presets name published models; parameter and FLOP counts follow from the shape alone.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace triax::plan {

struct ModelShape {
  std::string name = "custom";
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;  // key/value heads (grouped-query attention, Ainslie et al. 2023); 0 means heads
  int ffn = 0;  // MLP inner width; 0 means 4 * hidden
  int vocab = 0;
  int seq = 0;
  long global_batch = 0;         // sequences per iteration
  bool tied_embeddings = true;   // LM head shares the input embedding (GPT-2, Megatron GPT)
  bool learned_positions = true; // absolute position table of seq x hidden (GPT-2, Megatron 2021)

  int ffn_hidden() const { return ffn > 0 ? ffn : 4 * hidden; }
  int head_dim() const { return heads > 0 ? hidden / heads : 0; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  // Output width of the fused QKV projection: h queries + 2 x kv_heads x head_dim keys and values
  // (3h without grouped-query attention).
  double qkv_width() const { return hidden + 2.0 * kv_head_count() * head_dim(); }
};

// Throws ConfigError naming the field and the value when the shape is unusable.
void validate(const ModelShape& m);

// Built-in presets (GPT-2 small, the Megatron-LM SC21 Table 1 family, GPT-3 175B).
const std::vector<ModelShape>& model_presets();
// Throws ConfigError listing the known names when `name` is none of them.
ModelShape model_preset(std::string_view name);

// Parameters of one Transformer layer: QKV (h x qkv_width), projection, two MLP matrices, their
// biases, 2 LayerNorms.
double layer_parameters(const ModelShape& m);
// Input embedding (+ position table), final LayerNorm, and the LM head when it is not tied.
double embedding_parameters(const ModelShape& m);
double total_parameters(const ModelShape& m);

// Forward-pass matmul FLOPs of one layer for one sequence: 2 FLOPs per multiply-add,
// 2h q + 2h^2 + 4hf + 4sh per token, q = qkv_width() (8h^2 + 4hf + 4sh without GQA: QKV,
// projection, MLP, QK^T and AV over the full s x s square, as Megatron counts them).
double layer_forward_flops_per_sequence(const ModelShape& m);
// Forward FLOPs of the LM head for one sequence: 2 s h V.
double head_forward_flops_per_sequence(const ModelShape& m);
// The attention core (QK^T and AV) of one layer, forward, one sequence: 4 s^2 h.
double attention_core_flops_per_sequence(const ModelShape& m);

// Narayanan et al. SC21 Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), FLOPs of one iteration with
// full recomputation. Only meaningful for ffn = 4h; kept verbatim to check the general counts.
double megatron_eq3_flops(const ModelShape& m);

}  // namespace triax::plan
