// The checkpoint manifest and shard readers: a valid manifest round-trips; wrong versions, fields,
// shapes and ranges are refused naming the problem; a seeded mutation loop over the manifest
// text and the shard bytes only ever yields a valid result or an IoError (never another
// exception, a crash or a read outside the buffers).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>

#include "triax/core/error.h"
#include "triax/io/sha256.h"
#include "triax/checkpoint/manifest.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

// A manifest of one file holding two slices of a (4, 3) rows-split tensor at tp 2 (rank 1).
struct Sample {
  CheckpointManifest m;
  std::vector<std::byte> shard;
};

Sample sample() {
  Sample s;
  s.m.model.n_layer = 2, s.m.model.n_head = 2, s.m.model.n_embd = 8, s.m.model.vocab = 10, s.m.model.max_seq = 16;
  s.m.iteration = 7, s.m.consumed_samples = 56, s.m.applied_steps = 6, s.m.skipped_steps = 1, s.m.seed = 99, s.m.seq = 8;
  s.m.schedule = "1f1b";
  s.shard.resize(kCheckpointShardMagic.size());
  std::memcpy(s.shard.data(), kCheckpointShardMagic.data(), kCheckpointShardMagic.size());
  for (int k = 0; k < 2; ++k) {
    CheckpointSlice sl{"w", k == 0 ? StateKind::param : StateKind::exp_avg, {4, 3}, TpSplit::rows, 1, 2, 0, 6,
                       "rank_00001.bin", s.shard.size()};
    for (int i = 0; i < 6; ++i) {
      const float v = static_cast<float>(10 * k + i) + 0.5f;
      const auto* b = reinterpret_cast<const std::byte*>(&v);
      s.shard.insert(s.shard.end(), b, b + 4);
    }
    s.m.slices.push_back(sl);
  }
  s.m.files.push_back({"rank_00001.bin", s.shard.size(), io::sha256_hex(s.shard)});
  return s;
}

}  // namespace

TEST_CASE("checkpoint manifest: round trip and slice values", "[checkpoint]") {
  const Sample s = sample();
  const std::string text = checkpoint_manifest_json(s.m);
  const CheckpointManifest p = parse_checkpoint_manifest(text, "m.json");
  CHECK(p.iteration == 7);
  CHECK(p.consumed_samples == 56);
  CHECK(p.applied_steps == 6);
  CHECK(p.skipped_steps == 1);
  CHECK(p.seed == 99);
  REQUIRE(p.slices.size() == 2);
  CHECK(p.slices[1].kind == StateKind::exp_avg);
  CHECK(p.slices[1].split == TpSplit::rows);
  CHECK(checkpoint_manifest_json(p) == text);
  check_checkpoint_file(s.shard, p.files[0], "rank_00001.bin");
  const auto v = checkpoint_slice_values(s.shard, p.slices[1]);
  REQUIRE(v.size() == 6);
  CHECK(v[0] == 10.5f);
  CHECK(v[5] == 15.5f);
}

TEST_CASE("checkpoint manifest: bad manifests and files are refused with the reason", "[checkpoint]") {
  const Sample s = sample();
  auto edit = [&](auto f) {
    CheckpointManifest m = s.m;
    f(m);
    return checkpoint_manifest_json(m);
  };
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.format_version = 2; }), "m.json"),
                    Contains("m.json: format version 2 is newer than this build of triax reads (up to 1)"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.slices[0].end = 7; }), "m.json"),
                    Contains("slices[0].end = 7 is out of range [1, 6]"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.slices[0].tp_size = 3; }), "m.json"),
                    Contains("cannot be split over tp 3"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.slices[1].offset = 40; }), "m.json"),
                    Contains("lie outside file 'rank_00001.bin'"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.slices[1].file = "x.bin"; }), "m.json"),
                    Contains("slices[1].file 'x.bin' is not in the list of files"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(edit([](auto& m) { m.files[0].name = "../x"; }), "m.json"),
                    Contains("is not a plain file name"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest("{\"format\": \"triax-checkpoint\"}", "m.json"),
                    Contains("m.json: manifest has no field 'format_version'"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest("{", "m.json"), Contains("m.json: not valid JSON"));

  std::vector<std::byte> cut(s.shard.begin(), s.shard.end() - 3);
  CHECK_THROWS_WITH(check_checkpoint_file(cut, s.m.files[0], "f.bin"), Contains("f.bin: 53 bytes, but the manifest lists 56 bytes (truncated)"));
  std::vector<std::byte> flipped = s.shard;
  flipped[20] ^= std::byte{0x10};
  CHECK_THROWS_WITH(check_checkpoint_file(flipped, s.m.files[0], "f.bin"), Contains("f.bin: SHA-256 mismatch"));
}

TEST_CASE("checkpoint manifest: seeded mutation fuzz of the manifest and shard readers", "[checkpoint][fuzz]") {
  const Sample s = sample();
  const std::string text = checkpoint_manifest_json(s.m);
  std::mt19937_64 rng(20261201);
  int parsed = 0, refused = 0;
  const char tokens[] = "{}[]\",:0123456789-e.tfn ";
  for (int round = 0; round < 4000; ++round) {
    std::string t = text;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (t.size() + 1);
      switch (rng() % 4) {
        case 0: if (at < t.size()) t[at] = tokens[rng() % (sizeof tokens - 1)]; break;
        case 1: t.insert(at, 1, tokens[rng() % (sizeof tokens - 1)]); break;
        case 2: if (at < t.size()) t.erase(at, 1 + rng() % 8); break;
        default: t.resize(at); break;  // truncated
      }
    }
    try {
      const CheckpointManifest m = parse_checkpoint_manifest(t, "fuzz.json");
      ++parsed;
      // Whatever parsed must describe only reads inside the shard it names, or be refused by it.
      for (const auto& f : m.files) {
        try {
          check_checkpoint_file(s.shard, f, f.name);
        } catch (const IoError&) {
          continue;
        }
        for (const auto& sl : m.slices)
          if (sl.file == f.name) CHECK(checkpoint_slice_values(s.shard, sl).size() == static_cast<size_t>(sl.end - sl.begin));
      }
    } catch (const IoError& e) {
      ++refused;
      CHECK_THAT(e.what(), Contains("fuzz.json: "));
    }
  }
  CHECK(parsed > 0);
  CHECK(refused > 2000);
  // Shard bytes: every mutation of size or content is caught before a value is read.
  for (int round = 0; round < 500; ++round) {
    std::vector<std::byte> b = s.shard;
    if (rng() % 2) {
      size_t n = rng() % (b.size() + 8);
      if (n == b.size()) ++n;
      b.resize(n);
    }
    else b[rng() % b.size()] ^= std::byte{static_cast<unsigned char>(1 + rng() % 255)};
    CHECK_THROWS_AS(check_checkpoint_file(b, s.m.files[0], "f.bin"), IoError);
  }
}
