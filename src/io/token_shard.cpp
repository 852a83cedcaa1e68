// llm.c token shards: validating reader with bounds-checked batches, atomic writer (see token_shard.h).
#include "triax/io/token_shard.h"

#include <cstring>
#include <limits>
#include <vector>

#include "triax/core/error.h"
#include "triax/io/atomic_file.h"

namespace triax::io {
namespace {
constexpr uint64_t kHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);
constexpr int32_t kModelMagic = 20240326;  // llm.c's model file, for a helpful hint
}  // namespace

TokenShard::TokenShard(std::string path, int64_t vocab_size) : file_(std::move(path)) {
  const std::string& p = file_.path();
  const auto bytes = file_.bytes();
  if (bytes.size() < kHeaderBytes) {
    TRIAX_THROW(IoError, "{}: file is {} bytes, shorter than the {}-byte token shard header", p, bytes.size(),
                kHeaderBytes);
  }
  int32_t h[3];
  std::memcpy(h, bytes.data(), sizeof(h));
  if (h[0] != kTokenShardMagic) {
    TRIAX_THROW(IoError, "{}: bad magic {} (expected {} for an llm.c token shard{})", p, h[0], kTokenShardMagic,
                h[0] == kModelMagic ? "; this looks like an llm.c model checkpoint" : "");
  }
  if (h[1] != 1) TRIAX_THROW(IoError, "{}: unsupported token shard version {} (expected 1)", p, h[1]);
  if (h[2] <= 0) TRIAX_THROW(IoError, "{}: header claims {} tokens (must be positive)", p, h[2]);
  const uint64_t count = static_cast<uint64_t>(h[2]);
  const uint64_t expected = kHeaderBytes + 2 * count;
  if (bytes.size() != expected) {
    TRIAX_THROW(IoError, "{}: header claims {} tokens ({} bytes with the header) but the file is {} bytes{}", p, count,
                expected, bytes.size(), bytes.size() < expected ? ": truncated" : "");
  }
  // The mapping is page-aligned and the header is 1024 bytes, so the tokens are 2-byte aligned.
  tokens_ = {reinterpret_cast<const uint16_t*>(bytes.data() + kHeaderBytes), static_cast<size_t>(count)};
  if (vocab_size > 0) {
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (tokens_[i] >= vocab_size) {
        TRIAX_THROW(IoError, "{}: token {} at position {} is out of range for vocab size {}", p, tokens_[i], i,
                    vocab_size);
      }
    }
  }
}

int64_t TokenShard::num_batches(int64_t B, int64_t T) const {
  require(B > 0 && T > 0, "{}: batch size B={} and sequence length T={} must be positive", path(), B, T);
  int64_t bt = 0;
  if (__builtin_mul_overflow(B, T, &bt)) return 0;
  return (size() - 1) / bt;
}

std::span<const uint16_t> TokenShard::batch_tokens(int64_t k, int64_t B, int64_t T) const {
  require(B > 0 && T > 0, "{}: batch size B={} and sequence length T={} must be positive", path(), B, T);
  require(k >= 0, "{}: batch index {} is negative", path(), k);
  int64_t bt = 0, start = 0, end = 0;
  if (__builtin_mul_overflow(B, T, &bt) || __builtin_mul_overflow(k, bt, &start) ||
      __builtin_add_overflow(start, bt + 1, &end)) {
    TRIAX_THROW(IoError, "{}: batch {} of B={} x T={} starts past any possible token (the index overflows); the shard "
                "holds {} tokens", path(), k, B, T, size());
  }
  if (end > size()) {
    TRIAX_THROW(IoError,
                "{}: batch {} of B={} x T={} needs tokens [{}, {}) but the shard holds {} tokens ({} whole batches)",
                path(), k, B, T, start, end, size(), num_batches(B, T));
  }
  return tokens_.subspan(static_cast<size_t>(start), static_cast<size_t>(bt + 1));
}

void TokenShard::batch(int64_t k, int64_t B, int64_t T, std::span<int32_t> inputs, std::span<int32_t> targets) const {
  const auto toks = batch_tokens(k, B, T);
  const size_t n = toks.size() - 1;
  require(inputs.size() == n && targets.size() == n,
          "{}: batch buffers hold {} inputs and {} targets, B={} x T={} needs {} each", path(), inputs.size(),
          targets.size(), B, T, n);
  for (size_t i = 0; i < n; ++i) {
    inputs[i] = toks[i];
    targets[i] = toks[i + 1];
  }
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  require(!tokens.empty(), "token shard {}: refusing to write an empty shard", path);
  require(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
          "token shard {}: {} tokens do not fit the int32 count of the header", path, tokens.size());
  int32_t h[kTokenShardHeaderInts] = {};
  h[0] = kTokenShardMagic;
  h[1] = 1;
  h[2] = static_cast<int32_t>(tokens.size());
  AtomicFile out(path);
  out.write_values(std::span<const int32_t>(h));
  out.write_values(tokens);
  out.commit();
}

}  // namespace triax::io
