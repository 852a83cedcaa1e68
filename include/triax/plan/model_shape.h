// The shape of a decoder-only Transformer as the planner sees it: sizes and the block's choices
// (GPT-2's LayerNorm + GELU MLP + learned positions + biases + tied head, or Llama's RMSNorm +
// SwiGLU + RoPE + grouped-query attention, no biases, untied head), no weights. Presets name
// published models; parameter and FLOP counts follow from the shape alone.
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
  // The Llama block's choices (GPT-2's by default; Megatron's flags in the comments).
  bool swiglu = false;   // --swiglu: down(silu(gate x) * up x), three f x h matrices (Shazeer 2020)
  bool rmsnorm = false;  // --normalization RMSNorm: a weight only (LayerNorm: weight and bias)
  bool bias = true;      // biases on the linear layers (--disable-bias-linear: false)
  bool rope = false;     // --position-embedding-type rope: q and k rotated (Su et al. 2021)

  int ffn_hidden() const { return ffn > 0 ? ffn : 4 * hidden; }
  int head_dim() const { return heads > 0 ? hidden / heads : 0; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  // Output width of the fused QKV projection: h queries + 2 x kv_heads x head_dim keys and values
  // (3h without grouped-query attention).
  double qkv_width() const { return hidden + 2.0 * kv_head_count() * head_dim(); }
  // Output width of the first MLP GEMM: f, or 2f for SwiGLU's fused gate and up projections.
  double fc1_width() const { return (swiglu ? 2.0 : 1.0) * ffn_hidden(); }
  // Parameters of one norm: h (RMSNorm) or 2h (LayerNorm's weight and bias).
  double norm_parameters() const { return (rmsnorm ? 1.0 : 2.0) * hidden; }
};

// Throws ConfigError naming the field and the value when the shape is unusable.
void validate(const ModelShape& m);

// Built-in presets of the GPT block (GPT-2 small, the Megatron-LM SC21 Table 1 family, GPT-3
// 175B): LayerNorm, GELU MLP of 4h, learned positions, biases, tied head, so Megatron's closed-form
// parameter and FLOP counts hold for every one of them.
const std::vector<ModelShape>& model_presets();
// Built-in presets of the Llama block (Llama 3.2 1B, Llama 3 8B and 70B).
const std::vector<ModelShape>& llama_presets();
// A preset of either list. Throws ConfigError listing the known names when `name` is none of them.
ModelShape model_preset(std::string_view name);

// The block's choices that differ from GPT-2's, comma-separated ("SwiGLU, RMSNorm, RoPE, no
// biases, untied head" for Llama 3 8B); empty for the GPT block. Key/value heads are not included.
std::string block_choices(const ModelShape& m);

// Parameters of one Transformer layer: QKV (h x qkv_width), projection, two MLP matrices (three
// with SwiGLU), their biases (unless bias is false), 2 norms.
double layer_parameters(const ModelShape& m);
// Input embedding (+ position table), final norm, and the LM head when it is not tied.
double embedding_parameters(const ModelShape& m);
double total_parameters(const ModelShape& m);

// Forward-pass matmul FLOPs of one layer for one sequence: 2 FLOPs per multiply-add,
// 2h q + 2h^2 + 4hf + 4sh per token, q = qkv_width() (8h^2 + 4hf + 4sh without GQA: QKV,
// projection, MLP, QK^T and AV over the full s x s square, as Megatron counts them); SwiGLU's
// three MLP GEMMs make the MLP term 6hf. Elementwise work (norms, activations, RoPE) is not counted.
double layer_forward_flops_per_sequence(const ModelShape& m);
// Forward FLOPs of the LM head for one sequence: 2 s h V.
double head_forward_flops_per_sequence(const ModelShape& m);
// The attention core (QK^T and AV) of one layer, forward, one sequence: 4 s^2 h.
double attention_core_flops_per_sequence(const ModelShape& m);

// Narayanan et al. SC21 Eq. 3: 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), FLOPs of one iteration with
// full recomputation. Only meaningful for ffn = 4h; kept verbatim to check the general counts.
double megatron_eq3_flops(const ModelShape& m);

}  // namespace triax::plan
