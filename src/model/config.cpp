// GPT config presets and validation.
#include "triax/model/config.h"

#include <fmt/ranges.h>

#include <numeric>

#include "triax/core/error.h"

namespace triax {

int GptConfig::padded_vocab(int tp) const {
  const int m = std::lcm(vocab_pad_to > 0 ? vocab_pad_to : 1, tp > 0 ? tp : 1);
  return (vocab + m - 1) / m * m;
}

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd, V = padded_vocab(1), F = ffn_size(), L = n_layer, T = max_seq;
  const int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
  return V * C + T * C + L * per_layer + 2 * C + (tied_embeddings ? 0 : V * C);
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
}

std::string GptConfig::describe() const {
  return fmt::format("layers={} heads={} hidden={} ffn={} vocab={} (padded {}) seq={} tied={} params={:.2f}M", n_layer,
                     n_head, n_embd, ffn_size(), vocab, padded_vocab(1), max_seq, tied_embeddings,
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
  TRIAX_THROW(ConfigError, "unknown model preset '{}' (known: {})", name, fmt::join(preset_names(), ", "));
}

std::vector<std::string> GptConfig::preset_names() {
  return {"nano", "tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"};
}

}  // namespace triax
