// safetensors: a hand-built file read byte by byte, the writer's exact bytes, random round trips
// in every float dtype, sub-block reads against index arithmetic, and every malformed input.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "unit/io_test_util.h"
#include "triax/core/dtype.h"
#include "triax/io/safetensors.h"

using namespace triax::io;
using triax::test::append_u16le;
using triax::test::append_u32le;
using triax::test::append_u64le;
using triax::test::io_error_of;
using triax::test::TempDir;
using Catch::Matchers::Contains;

namespace {

// 8-byte little-endian length, the header, then the data bytes.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string s;
  append_u64le(s, header.size());
  return s + header + data;
}

std::string f32_bytes(std::initializer_list<uint32_t> bits) {
  std::string s;
  for (uint32_t b : bits) append_u32le(s, b);
  return s;
}

}  // namespace

TEST_CASE("safetensors: a hand-built file reads back exactly", "[io][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  // a: F32 [2,2] = {1, -2.5, 0.375, 100}; b: BF16 [3] = {1, -3, 0.25};
  // c: F16 [2] = {1, -2}; d: F64 [] = 1/3; e: I64 [2] = {7, -1} (listed, raw only)
  std::string data = f32_bytes({0x3F800000u, 0xC0200000u, 0x3EC00000u, 0x42C80000u});  // [0,16)
  append_u16le(data, 0x3F80);
  append_u16le(data, 0xC040);
  append_u16le(data, 0x3E80);  // [16,22)
  append_u16le(data, 0x3C00);
  append_u16le(data, 0xC000);  // [22,26)
  const double third = 1.0 / 3.0;
  uint64_t third_bits;
  std::memcpy(&third_bits, &third, 8);
  append_u64le(data, third_bits);  // [26,34)
  append_u64le(data, 7);
  append_u64le(data, static_cast<uint64_t>(-1));  // [34,50)
  const std::string header =
      R"({"__metadata__":{"format":"pt","note":"hand"},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
      R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("c":{"dtype":"F16","shape":[2],"data_offsets":[22,26]},)"
      R"("d":{"dtype":"F64","shape":[],"data_offsets":[26,34]},)"
      R"("e":{"dtype":"I64","shape":[2],"data_offsets":[34,50]}}   )";  // trailing spaces are legal padding
  triax::test::write_bytes(path, st_bytes(header, data));

  SafetensorsReader r(path);
  REQUIRE(r.path() == path);
  REQUIRE(r.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"note", "hand"}});
  REQUIRE(r.tensors().size() == 5);
  // storage order, absolute offsets
  const uint64_t base = 8 + header.size();
  REQUIRE(r.tensors()[0].name == "a");
  REQUIRE(r.tensors()[0].offset == base);
  REQUIRE(r.tensors()[1].name == "b");
  REQUIRE(r.tensors()[1].offset == base + 16);
  REQUIRE(r.info("a").dtype == FileDType::f32);
  REQUIRE(r.info("a").shape == Shape{2, 2});
  REQUIRE(r.info("b").dtype == FileDType::bf16);
  REQUIRE(r.info("c").dtype == FileDType::f16);
  REQUIRE(r.info("d").shape.empty());
  REQUIRE(r.info("d").numel() == 1);
  REQUIRE(r.info("e").dtype == FileDType::i64);

  REQUIRE(r.read("a", {2, 2}) == std::vector<float>{1.0f, -2.5f, 0.375f, 100.0f});
  REQUIRE(r.read("b") == std::vector<float>{1.0f, -3.0f, 0.25f});
  REQUIRE(r.read("c") == std::vector<float>{1.0f, -2.0f});
  REQUIRE(r.read("d") == std::vector<float>{static_cast<float>(third)});
  REQUIRE(r.read_rows("a", 1, 2) == std::vector<float>{0.375f, 100.0f});
  REQUIRE(r.read_cols("a", 1, 2) == std::vector<float>{-2.5f, 100.0f});

  const auto raw = r.raw("e");
  REQUIRE(raw.size() == 16);
  int64_t e[2];
  std::memcpy(e, raw.data(), 16);
  REQUIRE(e[0] == 7);
  REQUIRE(e[1] == -1);
  const std::string msg = io_error_of([&] { r.read("e"); });
  CHECK_THAT(msg, Contains(path) && Contains("'e'") && Contains("I64") && Contains("does not convert to float"));
}

TEST_CASE("safetensors: the writer produces the exact expected bytes", "[io][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  SafetensorsWriter w;
  w.add_metadata("format", "pt");
  w.add("w", {2}, std::vector<float>{1.0f, -2.0f});
  w.add("h", {1}, std::vector<float>{1.0f}, FileDType::bf16);
  w.write(path);

  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("h":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}})";
  REQUIRE(w.header_json() == header);
  while (header.size() % 8 != 0) header += ' ';
  std::string data = f32_bytes({0x3F800000u, 0xC0000000u});
  append_u16le(data, 0x3F80);
  REQUIRE(triax::test::read_bytes(path) == st_bytes(header, data));
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  // every tensor 8-byte aligned in the file
  SafetensorsReader r(path);
  for (const auto& t : r.tensors()) CHECK(t.offset % 8 == 0);
}

TEST_CASE("safetensors: random round trip in every float dtype", "[io][safetensors]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");

  const auto a = triax::test::random_floats(37 * 19, rng);
  const auto b = triax::test::random_floats(5 * 7 * 3, rng, 300.0f);
  const auto c = triax::test::random_floats(64, rng, 1000.0f);
  const auto d = triax::test::random_floats(33, rng);
  const auto s = triax::test::random_floats(1, rng);
  SafetensorsWriter w;
  w.add("transformer.h.0.attn.c_attn.weight", {37, 19}, a);
  w.add("bf", {5, 7, 3}, std::span<const float>(b), FileDType::bf16);
  w.add("half", {8, 8}, c, FileDType::f16);
  w.add("dbl", {33}, d, FileDType::f64);
  w.add("scalar", {}, s);
  w.add("empty", {0, 4}, std::vector<float>{});
  w.add_metadata("seed", std::to_string(seed));
  w.write(path);

  SafetensorsReader r(path);
  REQUIRE(r.tensors().size() == 6);
  REQUIRE(r.metadata().at("seed") == std::to_string(seed));
  REQUIRE(r.read("transformer.h.0.attn.c_attn.weight", {37, 19}) == a);  // f32: bit exact
  REQUIRE(r.read("dbl") == d);                                            // float -> double -> float: exact
  REQUIRE(r.read("scalar", {}) == s);
  REQUIRE(r.read("empty", {0, 4}).empty());
  const auto rb = r.read("bf");
  const auto rc = r.read("half");
  for (size_t i = 0; i < b.size(); ++i) {
    REQUIRE(rb[i] == static_cast<float>(triax::bf16(b[i])));
    REQUIRE(std::fabs(rb[i] - b[i]) <= std::ldexp(std::fabs(b[i]), -8));  // bf16: 8 significant bits
  }
  for (size_t i = 0; i < c.size(); ++i) {
    REQUIRE(rc[i] == static_cast<float>(triax::f16(c[i])));
    REQUIRE(std::fabs(rc[i] - c[i]) <= std::ldexp(std::fabs(c[i]), -11));  // f16: 11 significant bits
  }
}

TEST_CASE("safetensors: sub-block reads match index arithmetic on the full tensor", "[io][safetensors]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string path = dir.file("slice.safetensors");
  const int64_t R = 13, C = 29, D0 = 4, D1 = 6, D2 = 10;
  const auto m = triax::test::random_floats(R * C, rng);
  const auto t3 = triax::test::random_floats(D0 * D1 * D2, rng);
  SafetensorsWriter w;
  w.add("m", {R, C}, m);
  w.add("t3", {D0, D1, D2}, t3, FileDType::bf16);
  w.write(path);
  SafetensorsReader r(path);
  const auto full3 = r.read("t3");

  for (int trial = 0; trial < 50; ++trial) {
    std::uniform_int_distribution<int64_t> ur(0, R), uc(0, C);
    int64_t r0 = ur(rng), r1 = ur(rng), c0 = uc(rng), c1 = uc(rng);
    if (r0 > r1) std::swap(r0, r1);
    if (c0 > c1) std::swap(c0, c1);
    CAPTURE(r0, r1, c0, c1);
    const auto rows = r.read_rows("m", r0, r1);
    REQUIRE(rows == std::vector<float>(m.begin() + r0 * C, m.begin() + r1 * C));
    const auto cols = r.read_cols("m", c0, c1);
    REQUIRE(cols.size() == static_cast<size_t>(R * (c1 - c0)));
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = c0; j < c1; ++j) REQUIRE(cols[i * (c1 - c0) + (j - c0)] == m[i * C + j]);
    const auto blk = r.read_slice("m", {{r0, r1}, {c0, c1}});
    REQUIRE(blk.size() == static_cast<size_t>((r1 - r0) * (c1 - c0)));
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = c0; j < c1; ++j) REQUIRE(blk[(i - r0) * (c1 - c0) + (j - c0)] == m[i * C + j]);

    std::uniform_int_distribution<int64_t> u0(0, D0), u1(0, D1), u2(0, D2);
    triax::io::SliceRange s0{u0(rng), u0(rng)}, s1{u1(rng), u1(rng)}, s2{u2(rng), u2(rng)};
    if (s0.begin > s0.end) std::swap(s0.begin, s0.end);
    if (s1.begin > s1.end) std::swap(s1.begin, s1.end);
    if (s2.begin > s2.end) std::swap(s2.begin, s2.end);
    const auto sub = r.read_slice("t3", {s0, s1, s2});
    size_t k = 0;
    for (int64_t i = s0.begin; i < s0.end; ++i)
      for (int64_t j = s1.begin; j < s1.end; ++j)
        for (int64_t l = s2.begin; l < s2.end; ++l) REQUIRE(sub.at(k++) == full3[(i * D1 + j) * D2 + l]);
    REQUIRE(k == sub.size());
  }

  // bad slices
  CHECK_THAT(io_error_of([&] { r.read_rows("m", 3, R + 1); }), Contains(path) && Contains("outside tensor 'm'"));
  CHECK_THAT(io_error_of([&] { r.read_rows("m", 5, 4); }), Contains("outside tensor 'm'"));
  CHECK_THAT(io_error_of([&] { r.read_cols("t3", 0, 1); }), Contains(path) && Contains("not 2-D"));
  CHECK_THAT(io_error_of([&] { r.read_slice("m", {{0, 1}}); }), Contains("1 ranges") && Contains("2 dimensions"));
  CHECK_THAT(io_error_of([&] { r.read_slice("m", {{0, 1}, {0, int64_t{1} << 40}}); }), Contains("outside"));
  std::vector<float> small(3);
  CHECK_THAT(io_error_of([&] { r.read_into("m", small); }), Contains("destination holds 3"));
}

TEST_CASE("safetensors: missing tensors and shape mismatches name the file and the tensor", "[io][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  SafetensorsWriter w;
  w.add("wte", {3, 4}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  w.write(path);
  SafetensorsReader r(path);
  REQUIRE_FALSE(r.contains("wpe"));
  REQUIRE(r.contains("wte"));
  CHECK_THAT(io_error_of([&] { r.read("wpe"); }), Contains(path) && Contains("missing tensor 'wpe'"));
  CHECK_THAT(io_error_of([&] { r.info("wpe"); }), Contains("missing tensor 'wpe'"));
  CHECK_THAT(io_error_of([&] { r.read("wte", {4, 3}); }),
             Contains(path) && Contains("shape mismatch") && Contains("'wte'") && Contains("[3, 4]") &&
                 Contains("expected [4, 3]"));
  CHECK_THAT(io_error_of([&] { r.check_shape("wte", {12}); }), Contains("expected [12]"));
}

TEST_CASE("safetensors: malformed files are rejected with the file and the problem", "[io][safetensors]") {
  TempDir dir;
  int n = 0;
  // Writes bytes to a fresh file and returns the reader's error message.
  auto bad = [&](const std::string& bytes) {
    const std::string path = dir.file("bad" + std::to_string(n++) + ".safetensors");
    triax::test::write_bytes(path, bytes);
    const std::string msg = io_error_of([&] { SafetensorsReader r(path); });
    CHECK_THAT(msg, Contains(path));
    return msg;
  };
  const std::string f8 = f32_bytes({0x3F800000u, 0x40000000u});  // two floats
  auto one = [&](const std::string& entry) { return st_bytes(R"({"a":)" + entry + "}", f8); };

  SECTION("shorter than 8 bytes") {
    CHECK_THAT(bad(""), Contains("0 bytes") && Contains("shorter than the 8-byte"));
    CHECK_THAT(bad("abcde"), Contains("5 bytes") && Contains("shorter than the 8-byte"));
  }
  SECTION("absurd header length") {
    std::string s;
    append_u64le(s, 200'000'000);
    CHECK_THAT(bad(s + "{}"), Contains("absurd header length 200000000"));
    s.clear();
    append_u64le(s, ~uint64_t{0});
    CHECK_THAT(bad(s + "{}"), Contains("absurd header length"));
  }
  SECTION("header length beyond the file") {
    std::string s;
    append_u64le(s, 100);
    CHECK_THAT(bad(s + R"({"a":1})"), Contains("header length 100 exceeds") && Contains("truncated"));
  }
  SECTION("bad JSON") {
    CHECK_THAT(bad(st_bytes(R"({"a": )", "")), Contains("not valid JSON"));
    CHECK_THAT(bad(st_bytes(R"({"a":{}} trailing)", "")), Contains("not valid JSON"));
    CHECK_THAT(bad(st_bytes("", "")), Contains("not valid JSON"));
    CHECK_THAT(bad(st_bytes("{\"a\xff\":{}}", "")), Contains("not valid JSON"));
    CHECK_THAT(bad(st_bytes(R"([1,2])", "")), Contains("not a JSON object"));
  }
  SECTION("missing or mistyped fields") {
    CHECK_THAT(bad(one("3")), Contains("'a'") && Contains("not a JSON object"));
    CHECK_THAT(bad(one(R"({"shape":[2],"data_offsets":[0,8]})")), Contains("'a' has no \"dtype\""));
    CHECK_THAT(bad(one(R"({"dtype":"F32","data_offsets":[0,8]})")), Contains("'a' has no \"shape\""));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2]})")), Contains("'a' has no \"data_offsets\""));
    CHECK_THAT(bad(one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})")), Contains("\"dtype\" is not a string"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})")), Contains("\"shape\" is not an array"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})")),
               Contains("not a non-negative integer"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})")),
               Contains("not a non-negative integer"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":["2"],"data_offsets":[0,8]})")),
               Contains("not a non-negative integer"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0]})")), Contains("not a pair"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,9]})")), Contains("not a pair"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})")), Contains("not a pair"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2],"data_offsets":"0,8"})")), Contains("not a pair"));
  }
  SECTION("unknown dtype") {
    CHECK_THAT(bad(one(R"({"dtype":"F7","shape":[2],"data_offsets":[0,8]})")), Contains("unknown dtype 'F7'"));
    CHECK_THAT(bad(one(R"({"dtype":"f32","shape":[2],"data_offsets":[0,8]})")), Contains("unknown dtype 'f32'"));
  }
  SECTION("data_offsets out of range, reversed, or not matching shape x dtype") {
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})")), Contains("end before they begin"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[4],"data_offsets":[0,16]})")),
               Contains("[0, 16]") && Contains("past the end of the 8-byte data section"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})")),
               Contains("hold 8 bytes but shape [3] of F32 needs 12 bytes"));
    CHECK_THAT(bad(one(R"({"dtype":"BF16","shape":[2],"data_offsets":[0,8]})")),
               Contains("hold 8 bytes but shape [2] of BF16 needs 4 bytes"));
    CHECK_THAT(bad(one(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]})")),
               Contains("absurd"));
    CHECK_THAT(bad(one(R"({"dtype":"F64","shape":[1152921504606846976,8],"data_offsets":[0,8]})")),
               Contains("absurd"));
  }
  SECTION("overlapping data, holes, trailing bytes") {
    CHECK_THAT(bad(st_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            f8)),
               Contains("overlap") && Contains("'a'") && Contains("'b'"));
    CHECK_THAT(bad(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8)),
               Contains("4 bytes of the data section before tensor 'a'") && Contains("no tensor"));
    CHECK_THAT(bad(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f8)),
               Contains("4 bytes after the last tensor"));
  }
  SECTION("duplicate names and bad metadata") {
    CHECK_THAT(bad(st_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                            f8)),
               Contains("names tensor 'a' twice"));
    CHECK_THAT(bad(st_bytes(R"({"__metadata__":[1],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f8)),
               Contains("\"__metadata__\" is not a JSON object"));
    CHECK_THAT(bad(st_bytes(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f8)),
               Contains("value of 'k' is not a string"));
  }
  SECTION("not a file") {
    const std::string missing = dir.file("does_not_exist.safetensors");
    CHECK_THAT(io_error_of([&] { SafetensorsReader r(missing); }), Contains(missing) && Contains("cannot open"));
    CHECK_THAT(io_error_of([&] { SafetensorsReader r(dir.path().string()); }), Contains("not a regular file"));
  }
}

TEST_CASE("safetensors: every truncation and random header corruption is rejected cleanly", "[io][safetensors]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  SafetensorsWriter w;
  w.add_metadata("k", "v");
  w.add("x", {3, 5}, triax::test::random_floats(15, rng));
  w.add("y", {7}, triax::test::random_floats(7, rng), FileDType::bf16);
  w.write(good);
  const std::string bytes = triax::test::read_bytes(good);
  const std::string path = dir.file("cut.safetensors");
  // Every strict prefix breaks either the header or the exact coverage of the data section.
  for (size_t len = 0; len < bytes.size(); ++len) {
    CAPTURE(len);
    triax::test::write_bytes(path, bytes.substr(0, len));
    io_error_of([&] { SafetensorsReader r(path); });
  }
  // One byte longer: trailing bytes belong to no tensor.
  triax::test::write_bytes(path, bytes + "x");
  CHECK_THAT(io_error_of([&] { SafetensorsReader r(path); }), Contains("after the last tensor"));
  // Random byte flips anywhere: either a clean IoError or a file that reads within bounds.
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  std::uniform_int_distribution<size_t> pos(0, 8 + header_len - 1);
  std::uniform_int_distribution<int> val(0, 255);
  for (int trial = 0; trial < 300; ++trial) {
    std::string b = bytes;
    const size_t p = pos(rng);
    b[p] = static_cast<char>(val(rng));
    CAPTURE(trial, p);
    triax::test::write_bytes(path, b);
    try {
      SafetensorsReader r(path);
      for (const auto& t : r.tensors()) {
        REQUIRE(t.offset + t.nbytes <= b.size());
        if (file_dtype_converts_to_float(t.dtype)) (void)r.read(t.name);
      }
    } catch (const triax::IoError&) {
    }
  }
}

TEST_CASE("safetensors: writer rejects bad tensors", "[io][safetensors]") {
  using triax::test::config_error_of;
  SafetensorsWriter w;
  w.add("a", {2}, std::vector<float>{1, 2});
  CHECK_THAT(config_error_of([&] { w.add("a", {1}, std::vector<float>{1}); }), Contains("'a' added twice"));
  CHECK_THAT(config_error_of([&] { w.add("", {1}, std::vector<float>{1}); }), Contains("empty"));
  CHECK_THAT(config_error_of([&] { w.add("__metadata__", {1}, std::vector<float>{1}); }), Contains("reserved"));
  CHECK_THAT(config_error_of([&] { w.add("b", {2, 2}, std::vector<float>{1, 2, 3}); }),
             Contains("'b'") && Contains("needs 4 values, got 3"));
  CHECK_THAT(config_error_of([&] { w.add("c", {-1}, std::vector<float>{}); }), Contains("negative"));
  CHECK_THAT(config_error_of([&] { w.add("d", {1}, std::vector<float>{1}, FileDType::i32); }),
             Contains("cannot be stored as I32"));
  REQUIRE(w.size() == 1);
}
