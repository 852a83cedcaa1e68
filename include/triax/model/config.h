// The shape of a GPT-2-family model, read by model/ and the layers above it (pipeline, config,
// train, checkpoint); the planner, a layer below, describes shapes with plan/model_shape.h. Presets for GPT-2 124M..1.5B and tiny test shapes; validation against a
// tensor-parallel size with errors that show the numbers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace triax {

struct GptConfig {
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;        // C
  int ffn = 0;             // hidden size of the MLP; 0 means 4*C
  int vocab = 50257;       // real vocabulary
  int max_seq = 1024;      // position-embedding rows (block size)
  int vocab_pad_to = 128;  // padded vocab is a multiple of this (and of tp)
  bool tied_embeddings = true;

  int ffn_size() const { return ffn > 0 ? ffn : 4 * n_embd; }
  int head_dim() const { return n_embd / n_head; }
  // Padded vocabulary: a multiple of lcm(vocab_pad_to, tp). Padded rows are excluded from the
  // softmax and the loss, and initialised to zero, so they never change the math.
  int padded_vocab(int tp = 1) const;
  // Parameters (with the padded vocab of tp=1, tied embedding counted once).
  int64_t num_params() const;
  // Throws ConfigError naming the problem (heads or ffn not divisible by tp, C % heads, ...).
  void validate(int tp = 1) const;
  std::string describe() const;

  // "tiny", "nano", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"; ConfigError otherwise.
  static GptConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
};

}  // namespace triax
