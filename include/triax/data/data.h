// Training data by global sample index, so every layout sees the same samples: sample i is
// T + 1 consecutive tokens (inputs and next-token targets). Sources: a built-in generated
// learnable dataset, or a memory-mapped corpus (llm.c shards, Megatron indexed dataset, a text
// file's bytes: data/token_corpus.h) visited in a seeded per-epoch shuffle (data/sample_order.h).
#pragma once
#include <atomic>
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
  // Samples batch() has read on this rank (tests check that each DP rank reads only its share
  // and middle pipeline stages read nothing).
  int64_t samples_read() const { return samples_read_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<int64_t> samples_read_{0};
};

// A learnable generated language: each sequence walks a fixed random successor table of the
// vocabulary (with seed-dependent noise), so a model can drive the loss far below ln(vocab).
// Deterministic in (seed, index); no files.
std::unique_ptr<Dataset> make_synthetic_dataset(int vocab, uint64_t seed = 1234, double noise = 0.1);
class TokenCorpus;

// How samples are cut from a corpus and visited.
struct DataOptions {
  // Visit the samples of each epoch in a seeded permutation (by (seed, epoch)); false: file order.
  bool shuffle = true;
  // Samples never cross a document boundary (needs a format with documents: Megatron's): each
  // document of L tokens gives (L - 1) / T samples, the tail shorter than a sample is skipped.
  // Costs 8 bytes per document of memory (a prefix sum). false: the corpus is one token stream
  // and sample r is tokens [r*T, r*T + T + 1), O(1) memory.
  bool respect_eod = false;
  // With respect_eod on a corpus without documents: ConfigError (true) or one token stream (false,
  // for a validation set in another format than the training data).
  bool eod_required = true;
};

// Samples of T + 1 tokens cut from a corpus. ConfigError for respect_eod on a corpus without
// documents; the first num_samples/sample call with a corpus shorter than one sample throws
// IoError naming the corpus, its token count and the sample size.
std::unique_ptr<Dataset> make_corpus_dataset(std::unique_ptr<TokenCorpus> corpus, uint64_t seed,
                                             const DataOptions& opt = {});
// llm.c token shards (one or more files, concatenated in order); IoError naming the file for
// bad shards, and (when read) a token >= vocab. File order, no shuffle.
std::unique_ptr<Dataset> make_token_shard_dataset(const std::vector<std::string>& paths, int vocab);
// A text file's bytes as tokens (vocab 256), file order.
std::unique_ptr<Dataset> make_text_dataset(const std::string& path);
// "" or "synthetic" -> the generated dataset; anything else -> open_corpus (token_corpus.h:
// Megatron prefix/.idx, llm.c shards by list or glob, or a text file) cut by opt.
std::unique_ptr<Dataset> open_dataset(const std::string& spec, int vocab, uint64_t seed, const DataOptions& opt = {});

}  // namespace triax
