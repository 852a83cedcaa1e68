// llm.c's token shards, triax's training data: 256 int32 header (magic 20240520, version 1,
// token count) then uint16 tokens. A validating mmap reader with bounds-checked batch extraction
// (batch k of B×T takes tokens [k·B·T, k·B·T + B·T + 1): inputs and next-token targets) and a writer.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "triax/io/mapped_file.h"

namespace triax::io {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int kTokenShardHeaderInts = 256;  // 1024 bytes

class TokenShard {
 public:
  // vocab_size > 0 also checks every token id is < vocab_size. IoError naming the file and the
  // problem for: a file shorter than the header, wrong magic (with a hint when it is a model
  // file), wrong version, a non-positive token count, a file size other than header + 2·count,
  // a token id >= vocab_size (with its position).
  explicit TokenShard(std::string path, int64_t vocab_size = 0);

  const std::string& path() const { return file_.path(); }
  const MappedFile& file() const { return file_; }
  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  std::span<const uint16_t> tokens() const { return tokens_; }

  // Whole batches available: (size - 1) / (B·T). ConfigError unless B, T > 0.
  int64_t num_batches(int64_t B, int64_t T) const;
  // The B·T + 1 tokens of batch k. IoError naming the file, k, B, T, the tokens needed and the
  // tokens held when the shard is too short; ConfigError for k < 0 or B, T <= 0.
  std::span<const uint16_t> batch_tokens(int64_t k, int64_t B, int64_t T) const;
  // inputs = tokens [s, s+B·T), targets = tokens [s+1, s+B·T+1), s = k·B·T, each (B, T)
  // row-major. ConfigError unless inputs and targets hold B·T each.
  void batch(int64_t k, int64_t B, int64_t T, std::span<int32_t> inputs, std::span<int32_t> targets) const;

 private:
  MappedFile file_;
  std::span<const uint16_t> tokens_;  // (count) inside the mapping
};

// Atomic write (atomic_file.h). ConfigError for an empty shard or more than INT32_MAX tokens.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace triax::io
