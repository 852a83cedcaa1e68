// Training data by global sample index, so every layout sees the same samples: sample i is
// T + 1 consecutive tokens (inputs and next-token targets). Sources: a built-in generated
// learnable dataset, llm.c token shards, or a text file tokenised byte-level.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace triax {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Number of distinct samples of T + 1 tokens (indices wrap around: an epoch).
  virtual int64_t num_samples(int T) const = 0;
  // Writes T + 1 tokens of sample `index` (taken modulo num_samples(T)).
  virtual void sample(int64_t index, int T, int32_t* tokens) const = 0;
  // Every token is below this.
  virtual int vocab() const = 0;
  virtual std::string describe() const = 0;

  // Fills inputs (B, T) and targets (B, T) with samples first, first + 1, ..., first + B - 1.
  void batch(int64_t first, int B, int T, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const;
};

// A learnable generated language: each sequence walks a fixed random successor table of the
// vocabulary (with seed-dependent noise), so a model can drive the loss far below ln(vocab).
// Deterministic in (seed, index); no files.
std::unique_ptr<Dataset> make_synthetic_dataset(int vocab, uint64_t seed = 1234, double noise = 0.1);
// llm.c token shards (one or more files, concatenated in order); IoError naming the file for
// bad shards, and a token >= vocab.
std::unique_ptr<Dataset> make_token_shard_dataset(const std::vector<std::string>& paths, int vocab);
// A text file's bytes as tokens (vocab 256).
std::unique_ptr<Dataset> make_text_dataset(const std::string& path);
// Picks by file: *.bin -> token shards (comma-separated list allowed), anything else -> text;
// "" or "synthetic" -> the generated dataset.
std::unique_ptr<Dataset> open_dataset(const std::string& spec, int vocab, uint64_t seed);

}  // namespace triax
