// llm.c GPT-2 checkpoint: the layout against llm.c's parameter count formula, a hand-built file
// whose every value is predictable, fp32 and bf16 round trips, layer/TP-shard reads, bad files.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "unit/io_test_util.h"
#include "triax/core/dtype.h"
#include "triax/io/llmc.h"

using namespace triax::io;
using triax::test::config_error_of;
using triax::test::io_error_of;
using triax::test::TempDir;
using Catch::Matchers::Contains;

namespace {

const LlmcGpt2Config kTiny{.max_seq_len = 8, .vocab_size = 10, .padded_vocab_size = 16, .num_layers = 2,
                           .num_heads = 2, .channels = 4};

// Parameter count by GPT-2's formula: embeddings + L * (12 C^2 + 13 C) + final LayerNorm.
int64_t gpt2_param_count(const LlmcGpt2Config& c) {
  const int64_t C = c.channels;
  return int64_t{c.padded_vocab_size} * C + int64_t{c.max_seq_len} * C + c.num_layers * (12 * C * C + 13 * C) + 2 * C;
}

std::string header_bytes(std::initializer_list<int32_t> first) {
  std::vector<int32_t> h(256, 0);
  size_t i = 0;
  for (int32_t v : first) h[i++] = v;
  std::string s;
  for (int32_t v : h) triax::test::append_u32le(s, static_cast<uint32_t>(v));
  return s;
}

std::string header_of(const LlmcGpt2Config& c, int32_t version = 3, int32_t magic = kLlmcModelMagic) {
  return header_bytes({magic, version, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.channels,
                       c.padded_vocab_size});
}

// Parameter i (in file order) has the value i * 0.25 - 100, exact in fp32.
std::string tiny_file_bytes(const LlmcGpt2Config& c) {
  std::string s = header_of(c);
  for (int64_t i = 0; i < gpt2_param_count(c); ++i) {
    const float v = static_cast<float>(i) * 0.25f - 100.0f;
    triax::test::append_raw(s, v);
  }
  return s;
}

}  // namespace

TEST_CASE("llmc: the layout is llm.c's, in its order, with GPT-2's parameter count", "[io][llmc]") {
  const auto layout = llmc_gpt2_layout(kTiny);
  const std::vector<std::string> names{"wte",  "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",    "attprojw", "attprojb",
                                       "ln2w", "ln2b",     "fcw",  "fcb",  "fcprojw", "fcprojb", "lnfw",  "lnfb"};
  REQUIRE(layout.size() == names.size());
  int64_t total = 0;
  for (size_t i = 0; i < layout.size(); ++i) {
    CHECK(layout[i].name == names[i]);
    int64_t n = 1;
    for (auto d : layout[i].shape) n *= d;
    total += n;
  }
  REQUIRE(total == gpt2_param_count(kTiny));
  CHECK(layout[0].shape == Shape{16, 4});
  CHECK(layout[1].shape == Shape{8, 4});
  CHECK(layout[4].shape == Shape{2, 12, 4});
  CHECK(layout[10].shape == Shape{2, 16, 4});
  CHECK(layout[12].shape == Shape{2, 4, 16});
  CHECK(layout[15].shape == Shape{4});
  // GPT-2 124M with llm.c's padded vocab: 124,475,904 parameters
  const LlmcGpt2Config g124{.max_seq_len = 1024, .vocab_size = 50257, .padded_vocab_size = 50304, .num_layers = 12,
                            .num_heads = 12, .channels = 768};
  int64_t n124 = 0;
  for (const auto& t : llmc_gpt2_layout(g124)) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    n124 += n;
  }
  CHECK(n124 == 124475904);
}

TEST_CASE("llmc: a hand-built checkpoint reads back value by value", "[io][llmc]") {
  TempDir dir;
  const std::string path = dir.file("tiny.bin");
  triax::test::write_bytes(path, tiny_file_bytes(kTiny));
  LlmcGpt2Reader r(path);
  REQUIRE(r.config() == kTiny);
  REQUIRE(r.version() == 3);
  REQUIRE(r.dtype() == FileDType::f32);
  REQUIRE(r.tensors().size() == 16);
  int64_t flat = 0;  // running index of the first element of each tensor in the file
  for (const auto& t : llmc_gpt2_layout(kTiny)) {
    CAPTURE(t.name);
    const auto v = r.read(t.name, t.shape);
    for (size_t i = 0; i < v.size(); ++i) REQUIRE(v[i] == static_cast<float>(flat + int64_t(i)) * 0.25f - 100.0f);
    REQUIRE(r.info(t.name).offset == 1024 + 4 * static_cast<uint64_t>(flat));
    flat += static_cast<int64_t>(v.size());
  }
  // layer 1 of qkvw: flat index = offset(qkvw) + 1*3C*C + (row*C + col)
  const int64_t C = 4;
  const int64_t qkvw0 = 16 * C + 8 * C + 2 * 2 * C;  // after wte (Vp,C), wpe (maxT,C), ln1w, ln1b (L,C)
  const auto layer1 = r.read_rows("qkvw", 1, 2);
  REQUIRE(layer1.size() == static_cast<size_t>(3 * C * C));
  for (int64_t i = 0; i < 3 * C * C; ++i) REQUIRE(layer1[i] == static_cast<float>(qkvw0 + 3 * C * C + i) * 0.25f - 100.0f);
  // the K rows of layer 1, columns [2,4): a TP-style shard
  const auto k = r.read_slice("qkvw", {{1, 2}, {C, 2 * C}, {2, 4}});
  REQUIRE(k.size() == static_cast<size_t>(C * 2));
  for (int64_t row = 0; row < C; ++row)
    for (int64_t col = 0; col < 2; ++col)
      REQUIRE(k[row * 2 + col] ==
              static_cast<float>(qkvw0 + 3 * C * C + (C + row) * C + 2 + col) * 0.25f - 100.0f);
}

TEST_CASE("llmc: fp32 and bf16 round trips with random weights", "[io][llmc]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const LlmcGpt2Config cfg{.max_seq_len = 16, .vocab_size = 50, .padded_vocab_size = 64, .num_layers = 3,
                           .num_heads = 4, .channels = 8};
  LlmcGpt2Writer w32(cfg), w16(cfg, FileDType::bf16);
  std::map<std::string, std::vector<float>> ref;
  for (const auto& t : w32.layout()) {
    int64_t n = 1;
    for (auto d : t.shape) n *= d;
    ref[t.name] = triax::test::random_floats(static_cast<size_t>(n), rng);
    w32.set(t.name, ref[t.name]);
    w16.set(t.name, std::span<const float>(ref[t.name]));
  }
  w32.write(dir.file("m32.bin"));
  w16.write(dir.file("m16.bin"));
  REQUIRE(std::filesystem::file_size(dir.file("m32.bin")) == 1024 + 4 * static_cast<uint64_t>(gpt2_param_count(cfg)));
  REQUIRE(std::filesystem::file_size(dir.file("m16.bin")) == 1024 + 2 * static_cast<uint64_t>(gpt2_param_count(cfg)));

  LlmcGpt2Reader r32(dir.file("m32.bin")), r16(dir.file("m16.bin"));
  REQUIRE(r32.config() == cfg);
  REQUIRE(r16.config() == cfg);
  REQUIRE(r32.version() == 3);
  REQUIRE(r16.version() == 5);
  REQUIRE(r16.dtype() == FileDType::bf16);
  for (const auto& [name, v] : ref) {
    CAPTURE(name);
    REQUIRE(r32.read(name) == v);
    const auto b = r16.read(name);
    REQUIRE(b.size() == v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      REQUIRE(b[i] == static_cast<float>(triax::bf16(v[i])));
      REQUIRE(std::fabs(b[i] - v[i]) <= std::ldexp(std::fabs(v[i]), -8));
    }
  }
  // header ints are llm.c's
  const std::string bytes = triax::test::read_bytes(dir.file("m16.bin"));
  int32_t h[8];
  std::memcpy(h, bytes.data(), sizeof(h));
  REQUIRE(std::vector<int32_t>(h, h + 8) == std::vector<int32_t>{20240326, 5, 16, 50, 3, 4, 8, 64});
}

TEST_CASE("llmc: malformed checkpoints are rejected with the file and the problem", "[io][llmc]") {
  TempDir dir;
  int n = 0;
  auto bad = [&](const std::string& bytes) {
    const std::string path = dir.file("bad" + std::to_string(n++) + ".bin");
    triax::test::write_bytes(path, bytes);
    const std::string msg = io_error_of([&] { LlmcGpt2Reader r(path); });
    CHECK_THAT(msg, Contains(path));
    return msg;
  };
  const std::string good = tiny_file_bytes(kTiny);
  const std::string params = good.substr(1024);

  CHECK_THAT(bad(""), Contains("0 bytes") && Contains("shorter than the 1024-byte"));
  CHECK_THAT(bad(good.substr(0, 1000)), Contains("1000 bytes") && Contains("shorter"));
  CHECK_THAT(bad(header_of(kTiny, 3, 12345) + params), Contains("bad magic 12345") && Contains("20240326"));
  CHECK_THAT(bad(header_of(kTiny, 1, 20240520) + params), Contains("bad magic 20240520") && Contains("token shard"));
  CHECK_THAT(bad(header_of(kTiny, 1) + params), Contains("unsupported llm.c checkpoint version 1"));
  CHECK_THAT(bad(header_of(kTiny, 4) + params), Contains("version 4"));
  auto with = [&](auto edit) {
    LlmcGpt2Config c = kTiny;
    edit(c);
    return header_of(c) + params;
  };
  CHECK_THAT(bad(with([](auto& c) { c.channels = 0; })), Contains("non-positive") && Contains("channels=0"));
  CHECK_THAT(bad(with([](auto& c) { c.num_layers = -3; })), Contains("non-positive") && Contains("num_layers=-3"));
  CHECK_THAT(bad(with([](auto& c) { c.num_heads = 3; })), Contains("channels=4 is not divisible by num_heads=3"));
  CHECK_THAT(bad(with([](auto& c) { c.padded_vocab_size = 8; })), Contains("padded_vocab_size=8 is smaller"));
  CHECK_THAT(bad(with([](auto& c) {
               c.channels = 0x7fffffff;
               c.num_heads = 1;
               c.num_layers = 0x7fffffff;
               c.padded_vocab_size = 0x7fffffff;
             })),
             Contains("absurd") && Contains("overflows"));
  CHECK_THAT(bad(with([](auto& c) { c.channels = 1 << 20; c.num_heads = 1; })),
             Contains("needs") && Contains("truncated"));
  CHECK_THAT(bad(good.substr(0, good.size() - 4)),
             Contains(std::to_string(good.size() - 4) + " bytes") && Contains("needs " + std::to_string(good.size())) &&
                 Contains("truncated"));
  CHECK_THAT(bad(good + "junk"), Contains("needs " + std::to_string(good.size())));

  const std::string ok = dir.file("ok.bin");
  triax::test::write_bytes(ok, good);
  LlmcGpt2Reader r(ok);
  CHECK_THAT(io_error_of([&] { r.read("h.0.attn.c_attn.weight"); }),
             Contains(ok) && Contains("missing tensor 'h.0.attn.c_attn.weight'"));
  CHECK_THAT(io_error_of([&] { r.read("qkvw", {2, 4, 12}); }),
             Contains("shape mismatch") && Contains("[2, 12, 4]") && Contains("expected [2, 4, 12]"));
  CHECK_THAT(io_error_of([&] { r.read_rows("qkvw", 2, 3); }), Contains("outside tensor 'qkvw'"));
}

TEST_CASE("llmc: writer rejects bad configs, names and sizes", "[io][llmc]") {
  LlmcGpt2Config bad = kTiny;
  bad.num_heads = 3;
  CHECK_THAT(config_error_of([&] { LlmcGpt2Writer w(bad); }), Contains("not divisible"));
  CHECK_THAT(config_error_of([&] { LlmcGpt2Writer w(kTiny, FileDType::f16); }), Contains("not F16"));
  LlmcGpt2Writer w(kTiny);
  CHECK_THAT(config_error_of([&] { w.set("transformer.wte.weight", std::vector<float>(64)); }),
             Contains("no tensor named 'transformer.wte.weight'"));
  CHECK_THAT(config_error_of([&] { w.set("wte", std::vector<float>(63)); }),
             Contains("'wte'") && Contains("[16, 4]") && Contains("needs 64 values, got 63"));
  w.set("wte", std::vector<float>(64, 1.0f));
  TempDir dir;
  const std::string path = dir.file("partial.bin");
  CHECK_THAT(config_error_of([&] { w.write(path); }), Contains("not set: wpe, ln1w") && Contains("lnfb"));
  REQUIRE_FALSE(std::filesystem::exists(path));
}
