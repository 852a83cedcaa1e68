// A corpus of tokens on disk, memory-mapped and never copied whole: llm.c token shards (many
// files, by list or glob), a Megatron indexed dataset (.bin + .idx, with document boundaries) or
// a text file's bytes. Reads copy only the tokens asked for and check them against the vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace triax {

class TokenCorpus {
 public:
  virtual ~TokenCorpus() = default;
  // Tokens in the corpus (all files, in order).
  virtual int64_t size() const = 0;
  // Copies tokens [begin, begin + n) (possibly across files) into out. IoError naming the file
  // and the token's byte offset in it for a token outside [0, vocab); ConfigError for a range
  // outside [0, size()).
  virtual void read(int64_t begin, int n, int32_t* out) const = 0;
  // Documents with known boundaries (0 when the format has none, e.g. llm.c shards).
  virtual int64_t num_documents() const { return 0; }
  // Token range [begin, end) of document d, in corpus offsets.
  virtual std::pair<int64_t, int64_t> document(int64_t d) const;
  virtual int vocab() const = 0;
  virtual std::string describe() const = 0;
};

// Splits a comma-separated list and expands each element as a glob (sorted), so
// "data/fineweb_train_*.bin" names every shard. IoError naming the pattern when an element
// matches no file.
std::vector<std::string> expand_data_paths(const std::string& spec);

// llm.c shards, concatenated in order. Each header is validated at open (magic, version, count
// against the file size: IoError naming the file); token values are checked when read.
std::unique_ptr<TokenCorpus> open_llmc_corpus(const std::vector<std::string>& paths, int vocab);
// Megatron indexed dataset PREFIX.bin + PREFIX.idx (io/indexed_dataset.h).
std::unique_ptr<TokenCorpus> open_indexed_corpus(const std::string& prefix, int vocab);
// A file's bytes as tokens (vocab 256).
std::unique_ptr<TokenCorpus> open_text_corpus(const std::string& path);
// By name: PREFIX.idx, or X.bin with X.idx beside it -> Megatron; other *.bin and globs -> llm.c
// shards; anything else -> a text file.
std::unique_ptr<TokenCorpus> open_corpus(const std::string& spec, int vocab);

}  // namespace triax
