// Datasets by global sample index.
#include "triax/data/data.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <mutex>
#include <optional>

#include "triax/core/error.h"
#include "triax/core/hash.h"
#include "triax/data/sample_order.h"
#include "triax/data/token_corpus.h"

namespace triax {

void Dataset::batch(int64_t first, int B, int T, std::vector<int32_t>& inputs, std::vector<int32_t>& targets) const {
  inputs.resize(static_cast<size_t>(B) * T);
  targets.resize(static_cast<size_t>(B) * T);
  std::vector<int32_t> buf(static_cast<size_t>(T) + 1);
  samples_read_.fetch_add(B, std::memory_order_relaxed);
  for (int b = 0; b < B; ++b) {
    sample(first + b, T, buf.data());
    std::copy(buf.begin(), buf.begin() + T, inputs.begin() + static_cast<ptrdiff_t>(b) * T);
    std::copy(buf.begin() + 1, buf.end(), targets.begin() + static_cast<ptrdiff_t>(b) * T);
  }
}

namespace {

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(int vocab, uint64_t seed, double noise) : vocab_(vocab), seed_(seed), noise_(noise) {
    if (vocab < 2) TRIAX_THROW(ConfigError, "synthetic dataset needs a vocabulary of at least 2, got {}", vocab);
    if (!(noise >= 0 && noise <= 1)) TRIAX_THROW(ConfigError, "synthetic dataset noise {} outside [0, 1]", noise);
    next_.resize(static_cast<size_t>(vocab));
    for (int v = 0; v < vocab; ++v) next_[static_cast<size_t>(v)] = static_cast<int32_t>(splitmix64(seed ^ (v * 7919ull)) % vocab);
  }
  int64_t num_samples(int) const override { return int64_t{1} << 40; }
  void sample(int64_t index, int T, int32_t* t) const override {
    uint64_t s = splitmix64(seed_ * 31 + static_cast<uint64_t>(index));
    t[0] = static_cast<int32_t>(s % vocab_);
    for (int i = 1; i <= T; ++i) {
      s = splitmix64(s);
      const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
      t[i] = u < noise_ ? static_cast<int32_t>(splitmix64(s) % vocab_) : next_[static_cast<size_t>(t[i - 1])];
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

// Samples cut from a mapped corpus; only the T + 1 tokens of a sample are ever copied.
class CorpusDataset final : public Dataset {
 public:
  CorpusDataset(std::unique_ptr<TokenCorpus> c, uint64_t seed, DataOptions opt)
      : corpus_(std::move(c)), seed_(seed), opt_(opt) {
    if (opt_.respect_eod && corpus_->num_documents() == 0 && !opt_.eod_required) opt_.respect_eod = false;
    if (opt_.respect_eod && corpus_->num_documents() == 0)
      TRIAX_THROW(ConfigError, "{} has no document boundaries: samples cannot respect them (use a Megatron indexed "
                  "dataset, or turn respecting EOD off)", corpus_->describe());
  }
  int64_t num_samples(int T) const override { return layout(T).n; }
  void sample(int64_t index, int T, int32_t* t) const override {
    const Layout& l = layout(T);
    if (l.n == 0)
      TRIAX_THROW(IoError, "{}: {} tokens{}, fewer than one sample of {} + 1 tokens", corpus_->describe(),
                  corpus_->size(), opt_.respect_eod ? " and no document that long" : "", T);
    const int64_t r = (*l.order)(index);
    int64_t start = r * T;
    if (opt_.respect_eod) {
      const auto d = static_cast<size_t>(std::upper_bound(l.cum.begin(), l.cum.end(), r) - l.cum.begin()) - 1;
      start = corpus_->document(static_cast<int64_t>(d)).first + (r - l.cum[d]) * T;
    }
    corpus_->read(start, T + 1, t);
  }
  int vocab() const override { return corpus_->vocab(); }
  std::string describe() const override {
    return fmt::format("{}{}{}", corpus_->describe(), opt_.shuffle ? ", shuffled per epoch" : ", in file order",
                       opt_.respect_eod ? ", samples inside documents" : "");
  }

 private:
  struct Layout {
    int T = -1;
    int64_t n = 0;
    std::vector<int64_t> cum;  // respect_eod: (documents + 1) samples before document d
    std::optional<SampleOrder> order;
  };
  const Layout& layout(int T) const {
    require(T >= 1, "sample length {} must be positive", T);
    std::lock_guard<std::mutex> lock(mu_);
    if (layout_.T == T) return layout_;
    Layout l;
    l.T = T;
    if (opt_.respect_eod) {
      const int64_t D = corpus_->num_documents();
      l.cum.reserve(static_cast<size_t>(D) + 1);
      l.cum.push_back(0);
      for (int64_t d = 0; d < D; ++d) {
        const auto [b, e] = corpus_->document(d);
        l.cum.push_back(l.cum.back() + (e - b > T ? (e - b - 1) / T : 0));
      }
      l.n = l.cum.back();
    } else {
      l.n = corpus_->size() > T ? (corpus_->size() - 1) / T : 0;
    }
    if (l.n > 0) l.order.emplace(l.n, seed_, opt_.shuffle);
    layout_ = std::move(l);
    return layout_;
  }
  std::unique_ptr<TokenCorpus> corpus_;
  uint64_t seed_;
  DataOptions opt_;
  mutable std::mutex mu_;
  mutable Layout layout_;
};

}  // namespace

std::unique_ptr<Dataset> make_synthetic_dataset(int vocab, uint64_t seed, double noise) {
  return std::make_unique<SyntheticDataset>(vocab, seed, noise);
}

std::unique_ptr<Dataset> make_corpus_dataset(std::unique_ptr<TokenCorpus> corpus, uint64_t seed,
                                             const DataOptions& opt) {
  return std::make_unique<CorpusDataset>(std::move(corpus), seed, opt);
}

std::unique_ptr<Dataset> make_token_shard_dataset(const std::vector<std::string>& paths, int vocab) {
  return make_corpus_dataset(open_llmc_corpus(paths, vocab), 0, DataOptions{false, false});
}

std::unique_ptr<Dataset> make_text_dataset(const std::string& path) {
  return make_corpus_dataset(open_text_corpus(path), 0, DataOptions{false, false});
}

std::unique_ptr<Dataset> open_dataset(const std::string& spec, int vocab, uint64_t seed, const DataOptions& opt) {
  if (spec.empty() || spec == "synthetic") return make_synthetic_dataset(vocab, seed);
  auto corpus = open_corpus(spec, vocab);
  if (corpus->vocab() > vocab)
    TRIAX_THROW(ConfigError, "{} is byte-level ({} tokens) but the model's vocabulary is {}", corpus->describe(),
                corpus->vocab(), vocab);
  return make_corpus_dataset(std::move(corpus), seed, opt);
}

}  // namespace triax
