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

ModelShape model_preset(std::string_view name) {
  std::string names;
  for (const auto& m : model_presets()) {
    if (m.name == name) return m;
    names += names.empty() ? m.name : ", " + m.name;
  }
  TRIAX_THROW(ConfigError, "unknown model preset '{}'; known presets: {}", name, names);
}

double layer_parameters(const ModelShape& m) {
  const double h = m.hidden, f = m.ffn_hidden(), q = m.qkv_width();
  // QKV (h q + q; 3h^2 + 3h without GQA), projection (h^2 + h), MLP (2hf + f + h), two LayerNorms (4h).
  return h * q + q + h * h + 2 * h * f + 6 * h + f;
}

double embedding_parameters(const ModelShape& m) {
  const double h = m.hidden;
  double p = double(m.vocab) * h + 2 * h;  // token table + final LayerNorm
  if (m.learned_positions) p += double(m.seq) * h;
  if (!m.tied_embeddings) p += double(m.vocab) * h;
  return p;
}

double total_parameters(const ModelShape& m) {
  return m.layers * layer_parameters(m) + embedding_parameters(m);
}

double layer_forward_flops_per_sequence(const ModelShape& m) {
  const double h = m.hidden, f = m.ffn_hidden(), s = m.seq, q = m.qkv_width();
  return s * (2 * h * q + 2 * h * h + 4 * h * f) + attention_core_flops_per_sequence(m);
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
