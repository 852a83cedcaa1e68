// GPT config presets and validation.
#include "triax/model/config.h"

#include <fmt/ranges.h>

#include <cmath>
#include <numeric>

#include "triax/core/error.h"

namespace triax {

int GptConfig::padded_vocab(int tp) const {
  const int m = std::lcm(vocab_pad_to > 0 ? vocab_pad_to : 1, tp > 0 ? tp : 1);
  return (vocab + m - 1) / m * m;
}

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd, V = padded_vocab(1), F = ffn_size(), L = n_layer, Q = qkv_width();
  const int64_t b = bias ? 1 : 0;
  const int64_t norm = (norm_kind_has_bias() ? 2 : 1) * C;  // weight (+ bias)
  const int64_t mlp = (swiglu ? 3 : 2) * F * C + b * ((swiglu ? 2 : 1) * F + C);
  const int64_t per_layer = 2 * norm + (Q * C + b * Q) + (C * C + b * C) + mlp;
  const int64_t pos = positions == PositionEmbedding::learned_absolute ? static_cast<int64_t>(max_seq) * C : 0;
  return V * C + pos + L * per_layer + norm + (tied_embeddings ? 0 : V * C);
}

std::vector<double> GptConfig::rope_inv_freq() const {
  const int D = head_dim();
  std::vector<double> f(static_cast<size_t>(D / 2));
  constexpr double kTwoPi = 6.283185307179586;
  const auto& s = rope_scaling;
  const double low_wavelen = s.original_max_positions / s.low_freq_factor;
  const double high_wavelen = s.original_max_positions / s.high_freq_factor;
  for (int i = 0; i < D / 2; ++i) {
    double inv = 1.0 / std::pow(rope_theta, (2.0 * i) / D);
    if (s.llama3) {
      const double wavelen = kTwoPi / inv;
      if (wavelen > low_wavelen) {
        inv /= s.factor;  // long wavelengths: interpolated by the factor
      } else if (wavelen >= high_wavelen) {
        const double smooth =
            (s.original_max_positions / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
      }
    }
    f[static_cast<size_t>(i)] = inv;
  }
  return f;
}

void GptConfig::validate(int tp) const {
  if (n_layer < 1 || n_head < 1 || n_embd < 1 || vocab < 2 || max_seq < 1)
    TRIAX_THROW(ConfigError, "model shape must be positive: layers={} heads={} hidden={} vocab={} seq={}", n_layer,
                n_head, n_embd, vocab, max_seq);
  if (tp < 1) TRIAX_THROW(ConfigError, "tensor-parallel size must be at least 1, got {}", tp);
  if (n_embd % n_head != 0)
    TRIAX_THROW(ConfigError, "hidden size {} is not divisible by the number of heads {}", n_embd, n_head);
  if (n_head % tp != 0)
    TRIAX_THROW(ConfigError, "{} attention heads cannot be split over tp={} (heads must be divisible by tp)", n_head,
                tp);
  if (ffn_size() % tp != 0)
    TRIAX_THROW(ConfigError, "MLP hidden size {} cannot be split over tp={} (ffn must be divisible by tp)",
                ffn_size(), tp);
  if (vocab_pad_to < 1) TRIAX_THROW(ConfigError, "vocab_pad_to must be at least 1, got {}", vocab_pad_to);
  const int kv = kv_heads();
  if (n_kv_head < 0 || n_head % kv != 0)
    TRIAX_THROW(ConfigError, "{} query heads cannot be grouped over {} key/value heads (--num-query-groups must divide "
                "the heads)", n_head, n_kv_head);
  if (kv % tp != 0)
    TRIAX_THROW(ConfigError, "{} key/value heads (query groups) cannot be split over tp={} (tp must divide "
                "--num-query-groups)", kv, tp);
  if (!(norm_eps > 0) || !std::isfinite(norm_eps))
    TRIAX_THROW(ConfigError, "norm epsilon must be positive, got {}", norm_eps);
  if (positions == PositionEmbedding::rope) {
    if (head_dim() % 2 != 0)
      TRIAX_THROW(ConfigError, "rotary position embeddings need an even head size, got {} ({} / {} heads)", head_dim(),
                  n_embd, n_head);
    if (!(rope_theta > 1) || !std::isfinite(rope_theta))
      TRIAX_THROW(ConfigError, "rotary base must be greater than 1, got {}", rope_theta);
    const auto& s = rope_scaling;
    if (s.llama3 && (!(s.factor >= 1) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
                     s.original_max_positions < 1))
      TRIAX_THROW(ConfigError, "llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                  "original_max_position_embeddings >= 1; got factor={} low={} high={} original={}", s.factor,
                  s.low_freq_factor, s.high_freq_factor, s.original_max_positions);
  }
}

std::string GptConfig::describe() const {
  std::string block;
  if (!is_gpt2())
    block = fmt::format(" kv_heads={} norm={} mlp={} positions={}{} bias={}", kv_heads(), enum_name(norm),
                        swiglu ? "swiglu" : "gelu", enum_name(positions),
                        positions == PositionEmbedding::rope ? fmt::format(" theta={:g}{}", rope_theta,
                                                                            rope_scaling.llama3 ? " (llama3 scaling)" : "")
                                                             : std::string(),
                        bias);
  return fmt::format("layers={} heads={} hidden={} ffn={} vocab={} (padded {}) seq={} tied={}{} params={:.2f}M", n_layer,
                     n_head, n_embd, ffn_size(), vocab, padded_vocab(1), max_seq, tied_embeddings, block,
                     static_cast<double>(num_params()) / 1e6);
}

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "gpt2-124m") return c;
  if (name == "gpt2-350m") { c.n_layer = 24; c.n_head = 16; c.n_embd = 1024; return c; }
  if (name == "gpt2-774m") { c.n_layer = 36; c.n_head = 20; c.n_embd = 1280; return c; }
  if (name == "gpt2-1.5b") { c.n_layer = 48; c.n_head = 25; c.n_embd = 1600; return c; }
  if (name == "tiny") {
    // Byte-level vocabulary; 8 layers so pp x vpp up to 8 splits evenly; trains in seconds.
    c.n_layer = 8; c.n_head = 4; c.n_embd = 64; c.vocab = 256; c.max_seq = 64; c.vocab_pad_to = 64;
    return c;
  }
  if (name == "nano") {
    // Unit-test shape: a vocabulary not divisible by 2 or 4, padded only to tp.
    c.n_layer = 2; c.n_head = 4; c.n_embd = 32; c.vocab = 67; c.max_seq = 16; c.vocab_pad_to = 1;
    return c;
  }
  if (name.starts_with("llama")) {
    // The Llama block: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases, untied head.
    c.norm = Norm::rmsnorm;
    c.swiglu = true;
    c.positions = PositionEmbedding::rope;
    c.bias = false;
    c.tied_embeddings = false;
    c.rope_theta = 500000.0;
    c.vocab = 128256;
    c.max_seq = 8192;
    if (name == "llama3-8b") {  // Meta-Llama-3-8B config.json
      c.n_layer = 32; c.n_head = 32; c.n_kv_head = 8; c.n_embd = 4096; c.ffn = 14336;
      return c;
    }
    if (name == "llama3-70b") {  // Meta-Llama-3-70B config.json
      c.n_layer = 80; c.n_head = 64; c.n_kv_head = 8; c.n_embd = 8192; c.ffn = 28672;
      return c;
    }
    if (name == "llama3.2-1b") {  // Llama-3.2-1B config.json: tied head, llama3 rope scaling
      c.n_layer = 16; c.n_head = 32; c.n_kv_head = 8; c.n_embd = 2048; c.ffn = 8192; c.max_seq = 131072;
      c.tied_embeddings = true;
      c.rope_scaling = RopeScaling{true, 32.0, 1.0, 4.0, 8192};
      return c;
    }
    if (name == "llama-tiny") {
      // The "tiny" of the Llama family: byte vocabulary, 8 layers, 2 query heads per KV head.
      c.n_layer = 8; c.n_head = 4; c.n_kv_head = 2; c.n_embd = 64; c.ffn = 176; c.vocab = 256; c.max_seq = 64;
      c.vocab_pad_to = 64; c.rope_theta = 10000.0;
      return c;
    }
    if (name == "llama-nano") {
      // Unit-test shape: 8 heads over 4 KV heads (tp 1, 2, 4 all split them), head size 4.
      c.n_layer = 2; c.n_head = 8; c.n_kv_head = 4; c.n_embd = 32; c.ffn = 48; c.vocab = 67; c.max_seq = 16;
      c.vocab_pad_to = 1; c.rope_theta = 10000.0;
      return c;
    }
  }
  TRIAX_THROW(ConfigError, "unknown model preset '{}' (known: {})", name, fmt::join(preset_names(), ", "));
}

std::vector<std::string> GptConfig::preset_names() {
  return {"nano",       "tiny",        "gpt2-124m", "gpt2-350m",  "gpt2-774m", "gpt2-1.5b",
          "llama-nano", "llama-tiny", "llama3.2-1b", "llama3-8b", "llama3-70b"};
}

}  // namespace triax
