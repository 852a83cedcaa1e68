// Memory-mapped token corpora (see token_corpus.h).
#include "triax/data/token_corpus.h"

#include <fmt/ranges.h>
#include <glob.h>

#include <filesystem>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "triax/core/error.h"
#include "triax/io/indexed_dataset.h"
#include "triax/io/mapped_file.h"
#include "triax/io/token_shard.h"

namespace triax {

std::pair<int64_t, int64_t> TokenCorpus::document(int64_t d) const {
  TRIAX_THROW(ConfigError, "{} has no document boundaries (document {} asked for)", describe(), d);
}

namespace {

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

void check_range(const TokenCorpus& c, int64_t begin, int n) {
  if (begin < 0 || n < 0 || begin + n > c.size())
    TRIAX_THROW(ConfigError, "{}: tokens [{}, {}) asked for, the corpus holds {}", c.describe(), begin, begin + n,
                c.size());
}

[[noreturn]] void bad_token(const std::string& file, int64_t value, int64_t pos, uint64_t byte, int vocab) {
  TRIAX_THROW(IoError, "{}: token {} at position {} (byte offset {}) is outside the vocabulary [0, {})", file, value,
              pos, byte, vocab);
}

class LlmcCorpus final : public TokenCorpus {
 public:
  LlmcCorpus(const std::vector<std::string>& paths, int vocab) : vocab_(vocab) {
    if (paths.empty()) TRIAX_THROW(ConfigError, "no token shard given");
    starts_.push_back(0);
    for (const auto& p : paths) {
      shards_.emplace_back(p, 0);  // no token scan at open: a shard may hold billions
      shards_.back().file().advise_random();
      starts_.push_back(starts_.back() + shards_.back().size());
    }
    paths_ = paths;
  }
  int64_t size() const override { return starts_.back(); }
  void read(int64_t begin, int n, int32_t* out) const override {
    check_range(*this, begin, n);
    size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    for (int i = 0; i < n; ++f) {
      const auto toks = shards_[f].tokens();
      const int64_t j0 = begin + i - starts_[f];
      constexpr uint64_t kHeader = io::kTokenShardHeaderInts * 4;
      int64_t j = j0;
      for (; j < static_cast<int64_t>(toks.size()) && i < n; ++j, ++i) {
        const uint16_t t = toks[static_cast<size_t>(j)];
        if (t >= vocab_) bad_token(shards_[f].path(), t, j, kHeader + 2 * static_cast<uint64_t>(j), vocab_);
        out[i] = t;
      }
      shards_[f].file().release_pages(kHeader + 2 * static_cast<size_t>(j0), 2 * static_cast<size_t>(j - j0));
    }
  }
  int vocab() const override { return vocab_; }
  std::string describe() const override {
    if (paths_.size() <= 3) return fmt::format("llm.c token shards [{}] ({} tokens)", fmt::join(paths_, ", "), size());
    return fmt::format("llm.c token shards [{}, ..., {}] ({} files, {} tokens)", paths_.front(), paths_.back(),
                       paths_.size(), size());
  }

 private:
  std::vector<io::TokenShard> shards_;
  std::vector<std::string> paths_;
  std::vector<int64_t> starts_;  // (files + 1) corpus offset of each shard's first token
  int vocab_;
};

class IndexedCorpus final : public TokenCorpus {
 public:
  IndexedCorpus(const std::string& prefix, int vocab) : ds_(prefix), vocab_(vocab) { ds_.bin_file().advise_random(); }
  int64_t size() const override { return ds_.num_tokens(); }
  void read(int64_t begin, int n, int32_t* out) const override {
    check_range(*this, begin, n);
    for (int i = 0; i < n; ++i) {
      const int64_t t = ds_.token(begin + i);
      if (t < 0 || t >= vocab_)
        bad_token(ds_.bin_path(), t, begin + i, static_cast<uint64_t>(begin + i) * ds_.token_bytes(), vocab_);
      out[i] = static_cast<int32_t>(t);
    }
    ds_.bin_file().release_pages(static_cast<size_t>(begin) * ds_.token_bytes(), static_cast<size_t>(n) * ds_.token_bytes());
  }
  int64_t num_documents() const override { return ds_.num_documents(); }
  std::pair<int64_t, int64_t> document(int64_t d) const override { return ds_.document_range(d); }
  int vocab() const override { return vocab_; }
  std::string describe() const override {
    return fmt::format("Megatron indexed dataset {} ({} tokens, {} documents)", ds_.prefix(), size(),
                       ds_.num_documents());
  }

 private:
  io::IndexedDataset ds_;
  int vocab_;
};

class TextCorpus final : public TokenCorpus {
 public:
  explicit TextCorpus(const std::string& path) : file_(path) { file_.advise_random(); }
  int64_t size() const override { return static_cast<int64_t>(file_.size()); }
  void read(int64_t begin, int n, int32_t* out) const override {
    check_range(*this, begin, n);
    const auto b = file_.bytes();
    for (int i = 0; i < n; ++i) out[i] = static_cast<int32_t>(b[static_cast<size_t>(begin + i)]);
    file_.release_pages(static_cast<size_t>(begin), static_cast<size_t>(n));
  }
  int vocab() const override { return 256; }
  std::string describe() const override { return fmt::format("text file {} (bytes, {} tokens)", file_.path(), size()); }

 private:
  io::MappedFile file_;
};

}  // namespace

std::vector<std::string> expand_data_paths(const std::string& spec) {
  std::vector<std::string> out;
  std::stringstream ss(spec);
  for (std::string p; std::getline(ss, p, ',');) {
    if (p.empty())
      TRIAX_THROW(ConfigError, "'{}': an empty entry in the comma list (a stray comma?); expected token shards "
                  "a.bin,b.bin", spec);
    if (p.find_first_of("*?[") == std::string::npos) {
      if (!file_exists(p)) TRIAX_THROW(IoError, "{}: no such file", p);
      out.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0) {
      ::globfree(&g);
      TRIAX_THROW(IoError, "{}: the pattern matches no file", p);
    }
    std::vector<std::string> m(g.gl_pathv, g.gl_pathv + g.gl_pathc);
    ::globfree(&g);
    std::sort(m.begin(), m.end());
    out.insert(out.end(), m.begin(), m.end());
  }
  if (spec.ends_with(","))
    TRIAX_THROW(ConfigError, "'{}': an empty entry in the comma list (a stray comma?); expected token shards "
                "a.bin,b.bin", spec);
  if (out.empty()) TRIAX_THROW(ConfigError, "data '{}' names no file", spec);
  return out;
}

std::unique_ptr<TokenCorpus> open_llmc_corpus(const std::vector<std::string>& paths, int vocab) {
  return std::make_unique<LlmcCorpus>(paths, vocab);
}
std::unique_ptr<TokenCorpus> open_indexed_corpus(const std::string& prefix, int vocab) {
  return std::make_unique<IndexedCorpus>(prefix, vocab);
}
std::unique_ptr<TokenCorpus> open_text_corpus(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    TRIAX_THROW(IoError, "{}: is a directory; expected llm.c token shards (a.bin,b.bin or a glob), a Megatron "
                "indexed dataset (PREFIX), a text file, or synthetic", path);
  auto c = std::make_unique<TextCorpus>(path);
  if (c->size() < 2) TRIAX_THROW(IoError, "{}: the text file has {} bytes, too few to train on", path, c->size());
  return c;
}

std::unique_ptr<TokenCorpus> open_corpus(const std::string& spec, int vocab) {
  const auto stem = [](const std::string& s, const char* ext) { return s.substr(0, s.size() - std::strlen(ext)); };
  if (file_exists(spec + ".idx")) return open_indexed_corpus(spec, vocab);
  if (spec.ends_with(".idx")) return open_indexed_corpus(stem(spec, ".idx"), vocab);
  if (spec.ends_with(".bin") && spec.find_first_of(",*?[") == std::string::npos && file_exists(stem(spec, ".bin") + ".idx"))
    return open_indexed_corpus(stem(spec, ".bin"), vocab);
  if (spec.find_first_of(",*?[") != std::string::npos || spec.ends_with(".bin"))
    return open_llmc_corpus(expand_data_paths(spec), vocab);
  return open_text_corpus(spec);
}

}  // namespace triax
