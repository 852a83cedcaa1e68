// Datasets by global sample index.
#include "triax/train/data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "triax/core/error.h"
#include "triax/io/token_shard.h"

namespace triax {

void Dataset::batch(int64_t first, int B, int T, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(B) * T);
  targets.resize(static_cast<size_t>(B) * T);
  std::vector<int32_t> buf(static_cast<size_t>(T) + 1);
  for (int b = 0; b < B; ++b) {
    sample(first + b, T, buf.data());
    std::copy(buf.begin(), buf.begin() + T, inputs.begin() + static_cast<ptrdiff_t>(b) * T);
    std::copy(buf.begin() + 1, buf.end(), targets.begin() + static_cast<ptrdiff_t>(b) * T);
  }
}

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int vocab, uint64_t seed, double noise) : vocab_(vocab), seed_(seed), noise_(noise) {
    if (vocab < 2) TRIAX_THROW(ConfigError, "synthetic dataset needs a vocabulary of at least 2, got {}", vocab);
    if (!(noise >= 0 && noise <= 1)) TRIAX_THROW(ConfigError, "synthetic dataset noise {} outside [0, 1]", noise);
    next_.resize(static_cast<size_t>(vocab));
    for (int v = 0; v < vocab; ++v) next_[static_cast<size_t>(v)] = static_cast<int32_t>(mix(seed ^ (v * 7919ull)) % vocab);
  }
  int64_t num_samples(int) const override { return int64_t{1} << 40; }
  void sample(int64_t index, int T, int32_t* t) const override {
    uint64_t s = mix(seed_ * 31 + static_cast<uint64_t>(index));
    t[0] = static_cast<int32_t>(s % vocab_);
    for (int i = 1; i <= T; ++i) {
      s = mix(s);
      const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
      t[i] = u < noise_ ? static_cast<int32_t>(mix(s) % vocab_) : next_[static_cast<size_t>(t[i - 1])];
    }
  }
  int vocab() const override { return vocab_; }
  std::string describe() const override {
    return fmt::format("synthetic successor language (vocab {}, noise {}, seed {})", vocab_, noise_, seed_);
  }

 private:
  int vocab_;
  uint64_t seed_;
  double noise_;
  std::vector<int32_t> next_;
};

// A flat token sequence; sample i is tokens [i*T, i*T + T + 1).
class TokenSequenceDataset final : public Dataset {
 public:
  TokenSequenceDataset(std::vector<int32_t> tokens, int vocab, std::string what)
      : tokens_(std::move(tokens)), vocab_(vocab), what_(std::move(what)) {}
  int64_t num_samples(int T) const override {
    return tokens_.size() > static_cast<size_t>(T) ? static_cast<int64_t>((tokens_.size() - 1) / static_cast<size_t>(T)) : 0;
  }
  void sample(int64_t index, int T, int32_t* t) const override {
    const int64_t n = num_samples(T);
    if (n == 0)
      TRIAX_THROW(ConfigError, "{} has {} tokens, fewer than one sample of {} + 1", what_, tokens_.size(), T);
    const size_t off = static_cast<size_t>(index % n) * static_cast<size_t>(T);
    std::copy_n(tokens_.begin() + static_cast<ptrdiff_t>(off), T + 1, t);
  }
  int vocab() const override { return vocab_; }
  std::string describe() const override { return fmt::format("{} ({} tokens)", what_, tokens_.size()); }

 private:
  std::vector<int32_t> tokens_;
  int vocab_;
  std::string what_;
};

}  // namespace

std::unique_ptr<Dataset> make_synthetic_dataset(int vocab, uint64_t seed, double noise) {
  return std::make_unique<SyntheticDataset>(vocab, seed, noise);
}

std::unique_ptr<Dataset> make_token_shard_dataset(const std::vector<std::string>& paths, int vocab) {
  if (paths.empty()) TRIAX_THROW(ConfigError, "no token shard given");
  std::vector<int32_t> all;
  for (const auto& p : paths) {
    io::TokenShard shard(p, vocab);
    const auto t = shard.tokens();
    all.insert(all.end(), t.begin(), t.end());
  }
  return std::make_unique<TokenSequenceDataset>(std::move(all), vocab,
                                                fmt::format("llm.c token shards [{}]", fmt::join(paths, ", ")));
}

std::unique_ptr<Dataset> make_text_dataset(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    TRIAX_THROW(IoError, "--data {}: is a directory; expected llm.c token shards (a.bin,b.bin), a text file, or "
                "synthetic", path);
  std::ifstream f(path, std::ios::binary);
  if (!f) TRIAX_THROW(IoError, "--data {}: cannot open the text file: {}", path, std::strerror(errno));
  std::vector<int32_t> tokens;
  char c;
  while (f.get(c)) tokens.push_back(static_cast<unsigned char>(c));
  if (f.bad()) TRIAX_THROW(IoError, "--data {}: reading the text file failed: {}", path, std::strerror(errno));
  if (tokens.size() < 2) TRIAX_THROW(IoError, "--data {}: the text file has {} bytes, too few to train on", path, tokens.size());
  return std::make_unique<TokenSequenceDataset>(std::move(tokens), 256, fmt::format("text file {} (bytes)", path));
}

std::unique_ptr<Dataset> open_dataset(const std::string& spec, int vocab, uint64_t seed) {
  if (spec.empty() || spec == "synthetic") return make_synthetic_dataset(vocab, seed);
  // A comma list is token shards; every entry must be a .bin file (a trailing comma is a typo).
  std::vector<std::string> parts;
  std::stringstream ss(spec + ",");
  for (std::string p; std::getline(ss, p, ',');) parts.push_back(p);
  for (const auto& p : parts)
    if (p.empty())
      TRIAX_THROW(ConfigError, "--data '{}': an empty entry in the comma list (a stray comma?); expected token shards "
                  "a.bin,b.bin", spec);
  if (parts.size() > 1 || spec.ends_with(".bin")) {
    for (const auto& p : parts)
      if (!p.ends_with(".bin"))
        TRIAX_THROW(ConfigError, "--data '{}': '{}' is not a .bin token shard; a comma list holds llm.c token shards "
                    "only", spec, p);
    return make_token_shard_dataset(parts, vocab);
  }
  if (vocab < 256)
    TRIAX_THROW(ConfigError, "text data is byte-level (256 tokens) but the model's vocabulary is {}", vocab);
  return make_text_dataset(spec);
}

}  // namespace triax
