// Model-shape presets, validation, and parameter / FLOP counts.
#include "triax/plan/model_shape.h"

#include <fmt/format.h>

#include "triax/core/error.h"

namespace triax::plan {

void validate(const ModelShape& m) {
  auto positive = [&](const char* field, long v) {
    if (v <= 0) TRIAX_THROW(ConfigError, "model '{}': {} must be positive, got {}", m.name, field, v);
  };
  positive("layers", m.layers);
  positive("hidden", m.hidden);
  positive("heads", m.heads);
  positive("vocab", m.vocab);
  positive("seq", m.seq);
  positive("global_batch", m.global_batch);
  if (m.ffn < 0) TRIAX_THROW(ConfigError, "model '{}': ffn must be >= 0 (0 = 4*hidden), got {}", m.name, m.ffn);
  if (m.kv_heads < 0 || (m.kv_heads > 0 && m.heads % m.kv_heads != 0))
    TRIAX_THROW(ConfigError, "model '{}': kv_heads {} must divide heads {} (0 = heads)", m.name, m.kv_heads, m.heads);
  if (m.hidden % m.heads != 0)
    TRIAX_THROW(ConfigError, "model '{}': hidden {} is not a multiple of heads {}", m.name, m.hidden, m.heads);
  if (m.rope && m.head_dim() % 2 != 0)
    TRIAX_THROW(ConfigError, "model '{}': rotary positions need an even head size, got {} (hidden {} / heads {})",
                m.name, m.head_dim(), m.hidden, m.heads);
}

namespace {
ModelShape make(const char* name, int layers, int hidden, int heads, int vocab, int seq, long batch) {
  ModelShape m;
  m.name = name;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.vocab = vocab;
  m.seq = seq;
  m.global_batch = batch;
  return m;
}

// The Llama block: RMSNorm, SwiGLU, rotary positions (no position table), grouped-query attention,
// no linear biases; untied head unless `tied`. Vocabulary 128256 and sequence 8192 (Llama 3's
// pre-training context); global batch 512 sequences = 4M tokens (the batch Llama 2 trained with and
// Llama 3 405B's pre-training started from).
ModelShape llama(const char* name, int layers, int hidden, int heads, int kv_heads, int ffn, bool tied) {
  ModelShape m = make(name, layers, hidden, heads, 128256, 8192, 512);
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.tied_embeddings = tied;
  m.learned_positions = false;
  m.swiglu = true;
  m.rmsnorm = true;
  m.bias = false;
  m.rope = true;
  return m;
}
}  // namespace

const std::vector<ModelShape>& model_presets() {
  // GPT-2 (Radford et al. 2019) sizes; the Megatron-LM SC21 Table 1 family (Narayanan et al.
  // 2021: vocabulary 51200, sequence 2048, its batch sizes); GPT-3 175B (Brown et al. 2020) with
  // Megatron's padded vocabulary. "tiny" is a CPU-sized model for the cpu-local preset.
  static const std::vector<ModelShape> presets = {
      make("tiny", 4, 256, 4, 4096, 256, 16),
      make("gpt2-small", 12, 768, 12, 50257, 1024, 512),
      make("gpt2-medium", 24, 1024, 16, 50257, 1024, 512),
      make("gpt2-large", 36, 1280, 20, 50257, 1024, 512),
      make("gpt2-xl", 48, 1600, 25, 50257, 1024, 512),
      make("megatron-1.7b", 24, 2304, 24, 51200, 2048, 512),
      make("megatron-3.6b", 30, 3072, 32, 51200, 2048, 512),
      make("megatron-7.5b", 36, 4096, 32, 51200, 2048, 512),
      make("megatron-18b", 40, 6144, 48, 51200, 2048, 1024),
      make("megatron-39b", 48, 8192, 64, 51200, 2048, 1536),
      make("megatron-76b", 60, 10240, 80, 51200, 2048, 1792),
      make("megatron-145b", 80, 12288, 96, 51200, 2048, 2304),
      make("megatron-310b", 96, 16384, 128, 51200, 2048, 2160),
      make("megatron-530b", 105, 20480, 128, 51200, 2048, 2520),
      make("megatron-1t", 128, 25600, 160, 51200, 2048, 3072),
      make("gpt3-175b", 96, 12288, 96, 51200, 2048, 1536),
  };
  return presets;
}

const std::vector<ModelShape>& llama_presets() {
  static const std::vector<ModelShape> presets = {
      // Meta's config.json of each model on the Hugging Face Hub (num_hidden_layers, hidden_size,
      // num_attention_heads, num_key_value_heads, intermediate_size, tie_word_embeddings; all three
      // have vocab_size 128256, rope_theta 500000, rms_norm_eps 1e-5, no biases):
      //   meta-llama/Meta-Llama-3-8B   32, 4096, 32, 8, 14336, false  (model card: 8.03B parameters)
      //   meta-llama/Meta-Llama-3-70B  80, 8192, 64, 8, 28672, false  (70.6B)
      //   meta-llama/Llama-3.2-1B      16, 2048, 32, 8,  8192, true   (1.24B; head_dim 64)
      llama("llama3.2-1b", 16, 2048, 32, 8, 8192, true),
      llama("llama3-8b", 32, 4096, 32, 8, 14336, false),
      llama("llama3-70b", 80, 8192, 64, 8, 28672, false),
  };
  return presets;
}

ModelShape model_preset(std::string_view name) {
  std::string names;
  for (const auto* list : {&model_presets(), &llama_presets()}) {
    for (const auto& m : *list) {
      if (m.name == name) return m;
      names += names.empty() ? m.name : ", " + m.name;
    }
  }
  TRIAX_THROW(ConfigError, "unknown model preset '{}'; known presets: {}", name, names);
}

std::string block_choices(const ModelShape& m) {
  std::string out;
  auto add = [&](bool on, const char* what) {
    if (on) out += out.empty() ? what : std::string(", ") + what;
  };
  add(m.swiglu, "SwiGLU");
  add(m.rmsnorm, "RMSNorm");
  add(m.rope, "RoPE");
  add(!m.learned_positions && !m.rope, "no position table");
  add(!m.bias, "no biases");
  add(!m.tied_embeddings, "untied head");
  return out;
}

double layer_parameters(const ModelShape& m) {
  const double h = m.hidden, f = m.ffn_hidden(), q = m.qkv_width();
  // Matrices: QKV (h q; 3h^2 without GQA), projection (h^2), MLP (2hf; 3hf with SwiGLU). Biases:
  // q + h + f + h (2f with SwiGLU's gate and up). Two norms (4h LayerNorm, 2h RMSNorm). GPT-2:
  // h q + q + h^2 + 2hf + 6h + f.
  const double matrices = h * q + h * h + (m.swiglu ? 3 : 2) * h * f;
  const double biases = m.bias ? q + h + m.fc1_width() + h : 0;
  return matrices + biases + 2 * m.norm_parameters();
}

double embedding_parameters(const ModelShape& m) {
  const double h = m.hidden;
  double p = double(m.vocab) * h + m.norm_parameters();  // token table + final norm
  if (m.learned_positions) p += double(m.seq) * h;
  if (!m.tied_embeddings) p += double(m.vocab) * h;
  return p;
}

double total_parameters(const ModelShape& m) {
  return m.layers * layer_parameters(m) + embedding_parameters(m);
}

double layer_forward_flops_per_sequence(const ModelShape& m) {
  const double h = m.hidden, f = m.ffn_hidden(), s = m.seq, q = m.qkv_width();
  const double mlp = (m.swiglu ? 6 : 4) * h * f;  // fc1 and fc2, or gate, up and down
  return s * (2 * h * q + 2 * h * h + mlp) + attention_core_flops_per_sequence(m);
}

double attention_core_flops_per_sequence(const ModelShape& m) {
  const double h = m.hidden, s = m.seq;
  return 4 * s * s * h;
}

double head_forward_flops_per_sequence(const ModelShape& m) {
  return 2.0 * m.seq * m.hidden * double(m.vocab);
}

double megatron_eq3_flops(const ModelShape& m) {
  const double B = m.global_batch, s = m.seq, l = m.layers, h = m.hidden, V = m.vocab;
  return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
}

}  // namespace triax::plan
