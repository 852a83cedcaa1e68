// The shape of a decoder-only Transformer of the GPT-2 or the Llama family, read by model/ and the
// layers above it (pipeline, config, train, checkpoint); the planner, a layer below, describes
// shapes with plan/model_shape.h. One block whose norm, MLP, position and attention-group choices
// are fields here (docs/LLAMA.md): GPT-2 is LayerNorm + GELU + learned positions + biases + tied
// head; Llama is RMSNorm + SwiGLU + RoPE + grouped-query attention, no biases, untied head.
// Presets for GPT-2 124M..1.5B, Llama 3 / 3.2 and tiny test shapes; validation against a
// tensor-parallel size with errors that show the numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "triax/core/enum_names.h"

namespace triax {

// Megatron's spellings (--normalization, --position-embedding-type).
enum class Norm { layernorm, rmsnorm };
template <>
struct EnumNames<Norm> {
  static constexpr std::string_view what = "normalization";
  static constexpr std::array<EnumName<Norm>, 2> table{{{"LayerNorm", Norm::layernorm}, {"RMSNorm", Norm::rmsnorm}}};
};
enum class PositionEmbedding { learned_absolute, rope };
template <>
struct EnumNames<PositionEmbedding> {
  static constexpr std::string_view what = "position embedding type";
  static constexpr std::array<EnumName<PositionEmbedding>, 2> table{
      {{"learned_absolute", PositionEmbedding::learned_absolute}, {"rope", PositionEmbedding::rope}}};
};

// Llama 3.1's rotary frequency scaling (HF rope_scaling with rope_type "llama3"): wavelengths
// longer than original_max_positions / low_freq_factor are divided by factor, shorter than
// original_max_positions / high_freq_factor kept, and those between interpolated smoothly.
struct RopeScaling {
  bool llama3 = false;  // false: no scaling
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_positions = 8192;
};

struct GptConfig {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;        // C
  int ffn = 0;             // hidden size of the MLP; 0 means 4*C
  int vocab = 50257;       // real vocabulary
  int max_seq = 1024;      // position-embedding rows (block size)
  int vocab_pad_to = 128;  // padded vocab is a multiple of this (and of tp)
  bool tied_embeddings = true;
  // The block's choices (GPT-2's by default).
  int n_kv_head = 0;                   // key/value heads (grouped-query attention); 0 means n_head
  Norm norm = Norm::layernorm;         // LayerNorm (weight and bias) or RMSNorm (weight only)
  double norm_eps = 1e-5;
  bool swiglu = false;                 // MLP down(silu(gate(x)) * up(x)) instead of c_proj(gelu(c_fc(x)))
  PositionEmbedding positions = PositionEmbedding::learned_absolute;
  double rope_theta = 10000.0;         // RoPE base
  RopeScaling rope_scaling;
  bool bias = true;                    // biases on the linear layers (Megatron's --disable-bias-linear: false)

  int ffn_size() const { return ffn > 0 ? ffn : 4 * n_embd; }
  int head_dim() const { return n_embd / n_head; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Output width of the fused QKV projection: n_head + 2 n_kv_head heads of head_dim.
  int qkv_width() const { return n_embd + 2 * kv_heads() * head_dim(); }
  // The GPT-2 block exactly (every existing name, file format and test assumes it).
  bool is_gpt2() const {
    return kv_heads() == n_head && norm == Norm::layernorm && !swiglu &&
           positions == PositionEmbedding::learned_absolute && bias;
  }
  // Store (and HF) names of the token embedding and of the LM head's matrix (the embedding's own
  // name when tied): GPT-2's "transformer.wte.weight", or the Llama family's
  // "model.embed_tokens.weight" and "lm_head.weight" (docs/LLAMA.md lists every name).
  std::string embedding_param() const { return is_gpt2() ? "transformer.wte.weight" : "model.embed_tokens.weight"; }
  std::string lm_head_param() const { return tied_embeddings ? embedding_param() : "lm_head.weight"; }
  bool norm_kind_has_bias() const { return norm == Norm::layernorm; }  // LayerNorm's bias (RMSNorm has none)
  // RoPE's inverse frequencies theta^(-2i/D), i < D/2, with rope_scaling applied (HF's
  // _compute_llama3_parameters), in double.
  std::vector<double> rope_inv_freq() const;
  // Padded vocabulary: a multiple of lcm(vocab_pad_to, tp). Padded rows are excluded from the
  // softmax and the loss, and initialised to zero, so they never change the math.
  int padded_vocab(int tp = 1) const;
  // Parameters (with the padded vocab of tp=1, tied embedding counted once).
  int64_t num_params() const;
  // Throws ConfigError naming the problem (heads or ffn not divisible by tp, C % heads, ...).
  void validate(int tp = 1) const;
  std::string describe() const;

  // "nano", "tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama-nano",
  // "llama-tiny", "llama3.2-1b", "llama3-8b", "llama3-70b"; ConfigError otherwise.
  static GptConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

}  // namespace triax
