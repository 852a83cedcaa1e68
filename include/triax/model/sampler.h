// Drawing the next token from a model's logits, for looking at what a model learned
// (gpt_eval --sample): temperature, top-k and a seeded generator, so a run is reproducible.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>

namespace triax {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the largest logit)
  int top_k = 0;             // keep the k largest logits (0: all)
  // ConfigError for a negative temperature or top_k.
  void validate() const;
};

// A token drawn from softmax(logits / temperature) over the top_k largest logits (ties: the lower
// token id first). logits (V) must be finite. Deterministic in the generator's state.
int sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng);

// Byte-level tokens as text (token t < 256 is byte t); other ids are written as "<id>".
std::string decode_bytes(std::span<const int> tokens);

}  // namespace triax
