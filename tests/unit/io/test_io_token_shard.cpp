// llm.c token shards: a hand-built shard, random round trips, batch k = tokens
// [k·B·T, k·B·T + B·T + 1) against index arithmetic, the exact-fit boundary, and bad shards.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "unit/io_test_util.h"
#include "triax/io/token_shard.h"

using namespace triax::io;
using triax::test::config_error_of;
using triax::test::io_error_of;
using triax::test::TempDir;
using Catch::Matchers::Contains;

namespace {

std::string shard_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& toks) {
  std::string s;
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = count;
  for (int32_t v : h) triax::test::append_u32le(s, static_cast<uint32_t>(v));
  for (uint16_t t : toks) triax::test::append_u16le(s, t);
  return s;
}

std::vector<uint16_t> random_tokens(size_t n, std::mt19937_64& rng, uint16_t vocab) {
  std::uniform_int_distribution<int> u(0, vocab - 1);
  std::vector<uint16_t> v(n);
  for (auto& t : v) t = static_cast<uint16_t>(u(rng));
  return v;
}

}  // namespace

TEST_CASE("token shard: a hand-built shard reads back", "[io][tokens]") {
  TempDir dir;
  const std::string path = dir.file("hand.bin");
  triax::test::write_bytes(path, shard_bytes(20240520, 1, 5, {50256, 0, 1, 65535, 42}));
  TokenShard s(path);
  REQUIRE(s.path() == path);
  REQUIRE(s.size() == 5);
  REQUIRE(std::vector<uint16_t>(s.tokens().begin(), s.tokens().end()) ==
          std::vector<uint16_t>{50256, 0, 1, 65535, 42});
  // B=1, T=2: batch 0 = tokens [0,3), batch 1 = [2,5)
  REQUIRE(s.num_batches(1, 2) == 2);
  std::vector<int32_t> in(2), tg(2);
  s.batch(1, 1, 2, in, tg);
  REQUIRE(in == std::vector<int32_t>{1, 65535});
  REQUIRE(tg == std::vector<int32_t>{65535, 42});
}

TEST_CASE("token shard: random round trip and batches against index arithmetic", "[io][tokens]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string path = dir.file("rt.bin");
  const int64_t B = 3, T = 7, K = 5;
  const auto toks = random_tokens(K * B * T + 1, rng, 50257);  // exactly K batches
  write_token_shard(path, toks);
  REQUIRE(std::filesystem::file_size(path) == 1024 + 2 * toks.size());
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));

  TokenShard s(path, 50257);
  REQUIRE(std::vector<uint16_t>(s.tokens().begin(), s.tokens().end()) == toks);
  REQUIRE(s.num_batches(B, T) == K);
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int64_t k = 0; k < K; ++k) {
    s.batch(k, B, T, in, tg);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        REQUIRE(in[b * T + t] == toks[k * B * T + b * T + t]);
        REQUIRE(tg[b * T + t] == toks[k * B * T + b * T + t + 1]);
      }
    const auto span = s.batch_tokens(k, B, T);
    REQUIRE(span.size() == static_cast<size_t>(B * T + 1));
    REQUIRE(span.data() == s.tokens().data() + k * B * T);
  }
  // batch K would need one token more than the shard holds
  const std::string msg = io_error_of([&] { s.batch(K, B, T, in, tg); });
  CHECK_THAT(msg, Contains(path) && Contains("batch 5") && Contains("B=3") && Contains("T=7") &&
                      Contains("[105, 127)") && Contains("holds 106 tokens") && Contains("5 whole batches"));
  CHECK_THAT(io_error_of([&] { s.batch_tokens(int64_t{1} << 62, 1 << 20, 1 << 20); }),
             Contains(path) && Contains("overflows"));
  // caller mistakes
  CHECK_THAT(config_error_of([&] { s.batch_tokens(-1, B, T); }), Contains("negative"));
  CHECK_THAT(config_error_of([&] { s.num_batches(0, T); }), Contains("must be positive"));
  std::vector<int32_t> small(B * T - 1);
  CHECK_THAT(config_error_of([&] { s.batch(0, B, T, small, tg); }), Contains("needs 21 each"));
}

TEST_CASE("token shard: malformed shards are rejected with the file and the problem", "[io][tokens]") {
  TempDir dir;
  int n = 0;
  auto bad = [&](const std::string& bytes, int64_t vocab = 0) {
    const std::string path = dir.file("bad" + std::to_string(n++) + ".bin");
    triax::test::write_bytes(path, bytes);
    const std::string msg = io_error_of([&] { TokenShard s(path, vocab); });
    CHECK_THAT(msg, Contains(path));
    return msg;
  };
  const std::vector<uint16_t> t4{1, 2, 3, 4};
  CHECK_THAT(bad(""), Contains("0 bytes") && Contains("shorter than the 1024-byte"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 4, t4).substr(0, 512)), Contains("512 bytes"));
  CHECK_THAT(bad(shard_bytes(777, 1, 4, t4)), Contains("bad magic 777") && Contains("20240520"));
  CHECK_THAT(bad(shard_bytes(20240326, 3, 4, t4)), Contains("bad magic 20240326") && Contains("model checkpoint"));
  CHECK_THAT(bad(shard_bytes(20240520, 2, 4, t4)), Contains("unsupported token shard version 2"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 0, {})), Contains("claims 0 tokens"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, -5, t4)), Contains("claims -5 tokens"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 5, t4)), Contains("claims 5 tokens") && Contains("1034 bytes") &&
                                                         Contains("file is 1032 bytes") && Contains("truncated"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 3, t4)), Contains("claims 3 tokens") && Contains("file is 1032 bytes"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 0x7fffffff, t4)), Contains("claims 2147483647 tokens"));
  CHECK_THAT(bad(shard_bytes(20240520, 1, 4, {1, 2, 50257, 4}), 50257),
             Contains("token 50257 at position 2") && Contains("vocab size 50257"));
  // the same shard is fine without a vocab, and with a big enough one
  const std::string path = dir.file("ok.bin");
  triax::test::write_bytes(path, shard_bytes(20240520, 1, 4, {1, 2, 50257, 4}));
  REQUIRE(TokenShard(path).size() == 4);
  REQUIRE(TokenShard(path, 50258).size() == 4);
}

TEST_CASE("token shard: writer refuses empty shards", "[io][tokens]") {
  TempDir dir;
  CHECK_THAT(config_error_of([&] { write_token_shard(dir.file("e.bin"), {}); }), Contains("empty"));
}
