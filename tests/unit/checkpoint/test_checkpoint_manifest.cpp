// The checkpoint manifest and shard readers: a valid manifest round-trips; wrong versions, fields,
// shapes, ranges and structure (alignment, tiling, coverage, scalars) are refused naming the
// problem; the manifest digest; checkpoint directories of any width; a seeded mutation loop over
// the manifest text and the shard bytes only ever yields a valid result or an IoError (never
// another exception, a crash or a read outside the buffers).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "manifest_sample.h"
#include "support/llama_checks.h"
#include "triax/config/batch.h"

using namespace triax;
using namespace triax::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string edit(const ManifestSample& s, const std::function<void(CheckpointManifest&)>& f) {
  CheckpointManifest m = s.m;
  f(m);
  return checkpoint_manifest_json(m);
}

// A fresh empty directory under the system's temporary directory, removed at scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / fmt::format("triax_{}_{}", tag, ::getpid());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("checkpoint manifest: round trip and slice values", "[checkpoint]") {
  const ManifestSample s = manifest_sample();
  const std::string text = checkpoint_manifest_json(s.m);
  const CheckpointManifest p = parse_checkpoint_manifest(text, "m.json");
  CHECK(p.format_version == 3);
  CHECK(p.iteration == 7);
  CHECK(p.consumed_samples == 56);
  CHECK(p.applied_steps == 6);
  CHECK(p.skipped_steps == 1);
  CHECK(p.seed == 99);
  REQUIRE(p.batch);
  CHECK(p.batch->global_batch == 8);
  CHECK(p.batch->micro_batch == 2);
  CHECK(!p.batch->rampup);
  REQUIRE(p.slices.size() == 12);
  CHECK(p.slices[1].kind == StateKind::exp_avg);
  CHECK(p.slices[1].split == TpSplit::rows);
  CHECK(checkpoint_manifest_json(p) == text);
  const auto& shard = s.files.at("rank_00000.bin");
  check_checkpoint_file(shard, p.files[0], "rank_00000.bin");
  const auto v = checkpoint_slice_values(shard, p.slices[1]);  // w, exp_avg, elements [0, 4) of tp rank 0
  REQUIRE(v.size() == 4);
  CHECK(v[0] == 4.25f);
  CHECK(v[3] == 7.25f);
  const auto st = load_sample(text, s);
  REQUIRE(st);
  CHECK(st->tensors.at({"w", 0})[0] == 0.25f);
}

TEST_CASE("checkpoint manifest: bad manifests and files are refused with the reason", "[checkpoint]") {
  const ManifestSample s = manifest_sample();
  auto refused = [&](const std::function<void(CheckpointManifest&)>& f, const std::string& why) {
    CHECK_THROWS_WITH(parse_checkpoint_manifest(edit(s, f), "m.json"), Contains("m.json: ") && Contains(why));
  };
  refused([](auto& m) { m.format_version = 4; }, "format version 4 is newer than this build of triax reads (up to 3)");
  refused([](auto& m) { m.format_version = 1; }, "a version 1 manifest has no field 'batch'");
  refused([](auto& m) { m.slices[0].end = 7; }, "slices[0].end = 7 is out of range [1, 6]");
  refused([](auto& m) { m.slices[0].tp_size = 3; }, "cannot be split over tp 3");
  refused([](auto& m) { m.slices[1].offset = 400; }, "lie outside file 'rank_00000.bin'");
  refused([](auto& m) { m.slices[1].file = "x.bin"; }, "slices[1].file 'x.bin' is not in the list of files");
  refused([](auto& m) { m.files[0].name = "../x"; }, "is not a plain file name");
  // Structure: alignment, tiling, coverage, one file per rank.
  refused([](auto& m) { m.slices[1].offset += 2; }, "slices[1].offset 26 is not a multiple of 4");
  refused([](auto& m) { m.slices[1].offset += 4; }, "file 'rank_00000.bin': a gap at byte 24");
  refused([](auto& m) { m.slices[1].offset -= 4; }, "file 'rank_00000.bin': two slices overlap at byte 20");
  refused([](auto& m) { m.files[0].bytes += 4; }, "slices must tile the file");
  refused([](auto& m) { m.slices[0].tp_rank = 1; }, "tensor 'w' (param) of tp rank 0: no slice holds the elements at element 0");
  refused([](auto& m) { m.tp = 1; }, "2 files for the layout tp 1 x pp 1 x dp 1 = 1 ranks");
  refused([](auto& m) { std::swap(m.files[0], m.files[1]); }, "files[0] is 'rank_00001.bin', expected 'rank_00000.bin'");
  refused([](auto& m) { m.slices.erase(m.slices.end() - 3, m.slices.end()); }, "slices must tile the file");
  // Scalars.
  refused([](auto& m) { m.iteration = 8; }, "applied_steps 6 + skipped_steps 1 != iteration 8");
  refused([](auto& m) { m.consumed_samples = 64; }, "consumed_samples 64 != 56 (from 0 samples at iteration 0 and 7 more");
  refused([](auto& m) { m.batch->global_batch = 16; }, "batch: global_batch 16 != micro_batch 2 x dp 1 x num_micro_batches 4");
  refused([](auto& m) { m.batch->since_iteration = 3; }, "batch: since_iteration 3 and since_consumed_samples 0 do not fit");
  refused([](auto& m) { m.seq = 17; }, "seq_length 17 exceeds the model's max_seq 16");
  CHECK_THROWS_WITH(parse_checkpoint_manifest("{\"format\": \"triax-checkpoint\"}", "m.json"),
                    Contains("m.json: manifest has no field 'format_version'"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest("{", "m.json"), Contains("m.json: not valid JSON"));
  // Intact, but another run's: refused by the comparison with the run.
  const CheckpointManifest m = parse_checkpoint_manifest(checkpoint_manifest_json(s.m), "m.json");
  GptConfig other = s.m.model;
  other.n_layer = 3;
  CHECK_THROWS_WITH(check_checkpoint_matches_run(m, other, 99, 8, "ck"), Contains("ck: a checkpoint of another model"));
  CHECK_THROWS_WITH(check_checkpoint_matches_run(m, s.m.model, 98, 8, "ck"), Contains("written with --seed 99"));

  const auto& shard = s.files.at("rank_00001.bin");
  std::vector<std::byte> cut(shard.begin(), shard.end() - 3);
  CHECK_THROWS_WITH(check_checkpoint_file(cut, s.m.files[1], "f.bin"),
                    Contains("f.bin: 77 bytes, but the manifest lists 80 bytes (truncated)"));
  std::vector<std::byte> flipped = shard;
  flipped[20] ^= std::byte{0x10};
  CHECK_THROWS_WITH(check_checkpoint_file(flipped, s.m.files[1], "f.bin"), Contains("f.bin: SHA-256 mismatch"));
}

TEST_CASE("checkpoint manifest: consumed samples follow the batch ramp-up as the trainer adds them", "[checkpoint]") {
  ManifestSample s = manifest_sample();
  const BatchRampup ramp{2, 2, 40};
  s.m.batch->rampup = ramp;
  // The trainer: each step adds the global batch the schedule gives at the samples consumed so far.
  const BatchSchedule sched(BatchPlan{8, 2, 4, 1}, ramp);
  int64_t consumed = 12;  // the settings began at iteration 2 with 12 samples consumed
  for (int it = 2; it < 7; ++it) consumed += sched.global_batch(consumed);
  s.m.batch->since_iteration = 2, s.m.batch->since_consumed_samples = 12;
  s.m.consumed_samples = consumed;
  CHECK(consumed == 12 + 2 + 4 + 4 + 4 + 4);  // batches 2, then 4 from 14 samples (40 / 3 per step of the ramp)
  CHECK_NOTHROW(parse_checkpoint_manifest(checkpoint_manifest_json(s.m), "m.json"));
  s.m.consumed_samples = consumed - 2;
  CHECK_THROWS_WITH(parse_checkpoint_manifest(checkpoint_manifest_json(s.m), "m.json"),
                    Contains("consumed_samples 28 != 30"));
  s.m.consumed_samples = consumed;
  s.m.batch->rampup->samples = 60;  // a longer ramp gives another count
  CHECK_THROWS_WITH(parse_checkpoint_manifest(checkpoint_manifest_json(s.m), "m.json"), Contains("with its ramp-up"));
}

TEST_CASE("checkpoint manifest: the digest in manifest.sha256", "[checkpoint]") {
  const ManifestSample s = manifest_sample();
  TempDir tmp("ckdigest");
  const fs::path dir = tmp.path / "iter_0000007";
  const std::string text = checkpoint_manifest_json(s.m);
  write(dir / "manifest.json", text);
  write(dir / "manifest.sha256", checkpoint_manifest_digest(text));
  CHECK(checkpoint_manifest_digest(text).size() == 64 + 2 + 13 + 1);
  bool checked = false;
  CHECK(read_checkpoint_manifest(dir.string(), 7, &checked).iteration == 7);
  CHECK(checked);
  CHECK_THROWS_WITH(read_checkpoint_manifest(dir.string(), 8), Contains("iteration 7, but the directory is named for iteration 8"));
  // One digit of an offset changed: the digest refuses it before anything is parsed.
  std::string changed = text;
  const size_t at = changed.find("\"offset\": 24");
  REQUIRE(at != std::string::npos);
  changed[at + 11] = '8';
  write(dir / "manifest.json", changed);
  CHECK_THROWS_WITH(read_checkpoint_manifest(dir.string(), 7), Contains("manifest.sha256: SHA-256 mismatch: manifest.json hashes to"));
  write(dir / "manifest.sha256", "not a digest\n");
  CHECK_THROWS_WITH(read_checkpoint_manifest(dir.string(), 7), Contains("not a manifest digest"));
  // Version 3 without its digest: refused. Version 1 (written before digests): accepted, unchecked.
  write(dir / "manifest.json", text);
  fs::remove(dir / "manifest.sha256");
  CHECK_THROWS_WITH(read_checkpoint_manifest(dir.string(), 7), Contains("manifest.sha256: missing: a version 3 checkpoint"));
  write(dir / "manifest.json", edit(s, [](auto& m) { m.format_version = 1, m.batch.reset(); }));
  checked = true;
  CHECK(read_checkpoint_manifest(dir.string(), 7, &checked).format_version == 1);
  CHECK(!checked);
}

TEST_CASE("checkpoint manifest: checkpoint directories of any width are listed", "[checkpoint]") {
  TempDir tmp("cklist");
  for (const char* n : {"iter_0000042", "iter_10000000", "iter_123456789012", "iter_0000007", "iter_42",
                        "iter_0000009.tmp", "iter_0000005.refused", "iter_-000001", "iter_abc", "iter_"})
    write(tmp.path / n / "manifest.json", "{}");
  fs::create_directories(tmp.path / "iter_0000003");  // no manifest: incomplete
  std::vector<int64_t> its;
  for (const auto& [it, dir] : list_checkpoints(tmp.path.string())) {
    its.push_back(it);
    CHECK(dir == (tmp.path / checkpoint_dir_name(it)).string());
  }
  CHECK(its == std::vector<int64_t>{123456789012, 10000000, 42, 7});
  CHECK(checkpoint_dir_name(10000000) == "iter_10000000");
  CHECK(checkpoint_dir_name(42) == "iter_0000042");
}

TEST_CASE("checkpoint manifest: --load names a checkpoint root or one iter_N directory", "[checkpoint]") {
  TempDir tmp("ckload");
  for (const char* n : {"iter_0000002", "iter_0000004"}) write(tmp.path / n / "manifest.json", "{}");
  fs::create_directories(tmp.path / "iter_0000006");  // no manifest: incomplete
  const auto iterations = [](const std::vector<std::pair<int64_t, std::string>>& v) {
    std::vector<int64_t> out;
    for (const auto& [it, dir] : v) out.push_back(it);
    return out;
  };
  CHECK(iterations(checkpoints_to_load(tmp.path.string())) == std::vector<int64_t>{4, 2});
  // One checkpoint directory: exactly it (with or without a trailing slash), not the newest.
  for (const std::string d : {(tmp.path / "iter_0000002").string(), (tmp.path / "iter_0000002").string() + "/"}) {
    const auto one = checkpoints_to_load(d);
    REQUIRE(one.size() == 1);
    CHECK(one[0].first == 2);
    CHECK(fs::equivalent(one[0].second, tmp.path / "iter_0000002"));
  }
  // An incomplete one holds no checkpoint: nothing to load, as for an empty root.
  CHECK(checkpoints_to_load((tmp.path / "iter_0000006").string()).empty());
}

TEST_CASE("checkpoint manifest: seeded mutation fuzz of the manifest and shard readers", "[checkpoint][fuzz]") {
  const ManifestSample s = manifest_sample();
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
        auto it = s.files.find(f.name);
        if (it == s.files.end()) continue;
        try {
          check_checkpoint_file(it->second, f, f.name);
        } catch (const IoError&) {
          continue;
        }
        for (const auto& sl : m.slices)
          if (sl.file == f.name) CHECK(checkpoint_slice_values(it->second, sl).size() == static_cast<size_t>(sl.end - sl.begin));
      }
    } catch (const IoError& e) {
      ++refused;
      CHECK_THAT(e.what(), Contains("fuzz.json: "));
    }
  }
  CHECK(parsed > 0);
  CHECK(refused > 2000);
  // Shard bytes: every mutation of size or content is caught before a value is read.
  const auto& shard = s.files.at("rank_00000.bin");
  for (int round = 0; round < 500; ++round) {
    std::vector<std::byte> b = shard;
    if (rng() % 2) {
      size_t n = rng() % (b.size() + 8);
      if (n == b.size()) ++n;
      b.resize(n);
    }
    else b[rng() % b.size()] ^= std::byte{static_cast<unsigned char>(1 + rng() % 255)};
    CHECK_THROWS_AS(check_checkpoint_file(b, s.m.files[0], "f.bin"), IoError);
  }
}

// ---- the model's block (format version 3, issue 26) ----

namespace {

// The Llama block on the sample's shape: 2 query heads over 1 key/value head, RMSNorm, SwiGLU,
// RoPE with llama3 scaling, no biases, an untied head; every value unlike GPT-2's.
GptConfig llama_block(GptConfig c) {
  c.n_kv_head = 1;
  c.norm = Norm::rmsnorm;
  c.norm_eps = 1e-6;
  c.swiglu = true;
  c.positions = PositionEmbedding::rope;
  c.rope_theta = 500000.0;
  c.rope_scaling = RopeScaling{true, 32.0, 0.5, 3.0, 4096};
  c.bias = false;
  c.tied_embeddings = false;
  return c;
}

}  // namespace

TEST_CASE("checkpoint manifest: the model's block round-trips (version 3)", "[checkpoint][llama]") {
  ManifestSample s = manifest_sample();
  s.m.model = llama_block(s.m.model);
  const std::string text = checkpoint_manifest_json(s.m);
  const CheckpointManifest p = parse_checkpoint_manifest(text, "m.json");
  const GptConfig& c = p.model;
  check_llama_block(c, {.kv_heads = 1, .norm_eps = 1e-6, .rope_theta = 500000.0,
                        .rope_scaling = {true, 32.0, 0.5, 3.0, 4096}, .tied_embeddings = false});
  CHECK(checkpoint_manifest_json(p) == text);
  CHECK_NOTHROW(check_checkpoint_matches_run(p, s.m.model, 99, 8, "ck"));
  CHECK(load_sample(text, s));
  // GPT-2's block is written out too (rope_scaling null), and reads back as GPT-2's.
  const ManifestSample g = manifest_sample();
  const auto j = nlohmann::json::parse(checkpoint_manifest_json(g.m));
  CHECK(j["model"]["norm"] == "LayerNorm");
  CHECK(j["model"]["positions"] == "learned_absolute");
  CHECK(j["model"]["n_kv_head"] == 2);
  CHECK(j["model"]["rope_scaling"].is_null());
  CHECK(parse_checkpoint_manifest(checkpoint_manifest_json(g.m), "m.json").model.is_gpt2());
}

TEST_CASE("checkpoint manifest: resuming with another block is refused naming the field", "[checkpoint][llama]") {
  ManifestSample s = manifest_sample();
  s.m.model = llama_block(s.m.model);
  const CheckpointManifest m = parse_checkpoint_manifest(checkpoint_manifest_json(s.m), "m.json");
  const std::pair<const char*, std::function<void(GptConfig&)>> changes[] = {
      {"n_kv_head (--num-query-groups): 1 in the checkpoint, 2 in this run", [](GptConfig& c) { c.n_kv_head = 2; }},
      {"norm (--normalization): RMSNorm in the checkpoint, LayerNorm in this run",
       [](GptConfig& c) { c.norm = Norm::layernorm; }},
      {"norm_eps (--norm-epsilon): 1e-06 in the checkpoint, 1e-05 in this run", [](GptConfig& c) { c.norm_eps = 1e-5; }},
      {"swiglu (--swiglu): true in the checkpoint, false in this run", [](GptConfig& c) { c.swiglu = false; }},
      {"positions (--position-embedding-type): rope in the checkpoint, learned_absolute in this run",
       [](GptConfig& c) { c.positions = PositionEmbedding::learned_absolute; }},
      {"rope_theta (--rotary-base): 500000 in the checkpoint, 10000 in this run",
       [](GptConfig& c) { c.rope_theta = 10000.0; }},
      {"rope_scaling (--use-rope-scaling, --rope-scaling-factor): llama3 factor 32 low 0.5 high 3 original 4096 in "
       "the checkpoint, none in this run", [](GptConfig& c) { c.rope_scaling.llama3 = false; }},
      {"rope_scaling (--use-rope-scaling, --rope-scaling-factor): llama3 factor 32 low 0.5 high 3 original 4096 in "
       "the checkpoint, llama3 factor 8 low 0.5 high 3 original 4096 in this run",
       [](GptConfig& c) { c.rope_scaling.factor = 8.0; }},
      {"bias (--disable-bias-linear): false in the checkpoint, true in this run", [](GptConfig& c) { c.bias = true; }},
      {"tied_embeddings (--untie-embeddings-and-output-weights): false in the checkpoint, true in this run",
       [](GptConfig& c) { c.tied_embeddings = true; }},
  };
  for (const auto& [why, change] : changes) {
    INFO(why);
    GptConfig run = s.m.model;
    change(run);
    CHECK_THROWS_WITH(check_checkpoint_matches_run(m, run, 99, 8, "ck"),
                      Contains("ck: a checkpoint of another model: ") && Contains(why));
  }
  // Every field of the manifest's block is one the comparison reads: a forged manifest with
  // another value (digest rewritten) is refused by the resume.
  for (const char* field : {"n_kv_head", "norm_eps", "rope_theta", "swiglu", "bias"}) {
    INFO(field);
    auto j = nlohmann::json::parse(checkpoint_manifest_json(s.m));
    auto& v = j["model"][field];
    if (v.is_boolean()) v = !v.get<bool>();
    else if (v.is_number_integer()) v = 2;
    else v = v.get<double>() * 2;
    CHECK(!load_sample(j.dump(1), s));
  }
}

TEST_CASE("checkpoint manifest: an older manifest holds GPT-2's block; a version edited down is refused",
          "[checkpoint][llama]") {
  const ManifestSample s = manifest_sample();
  for (const int version : {1, 2}) {
    INFO(version);
    const std::string text = edit(s, [&](auto& m) {
      m.format_version = version;
      if (version == 1) m.batch.reset();
    });
    const auto j = nlohmann::json::parse(text);
    CHECK(!j["model"].contains("norm"));  // what a triax before version 3 wrote
    const CheckpointManifest p = parse_checkpoint_manifest(text, "m.json");
    CHECK(p.model.is_gpt2());
    CHECK(p.model.tied_embeddings);
    CHECK(p.model.norm_eps == 1e-5);
    CHECK(p.model.positions == PositionEmbedding::learned_absolute);
    CHECK_NOTHROW(check_checkpoint_matches_run(p, s.m.model, 99, 8, "ck"));
    // A Llama run refuses it, naming what differs.
    CHECK_THROWS_WITH(check_checkpoint_matches_run(p, llama_block(s.m.model), 99, 8, "ck"),
                      Contains("norm (--normalization): LayerNorm in the checkpoint, RMSNorm in this run") &&
                          Contains("swiglu (--swiglu): false in the checkpoint, true in this run"));
    // A block field in a version 1 or 2 manifest: a format_version edited down.
    for (const char* field : {"n_kv_head", "norm", "rope_scaling", "bias"}) {
      INFO(field);
      auto k = j;
      k["model"][field] = nullptr;
      CHECK_THROWS_WITH(parse_checkpoint_manifest(k.dump(1), "m.json"),
                        Contains(fmt::format("m.json: a version {} manifest has no field 'model.{}' (edited "
                                             "format_version?)", version, field)));
    }
  }
  // Version 3: every field of the block present, of its type and range.
  ManifestSample l = manifest_sample();
  l.m.model = llama_block(l.m.model);
  const auto j = nlohmann::json::parse(checkpoint_manifest_json(l.m));
  const std::pair<std::function<void(nlohmann::json&)>, const char*> bad[] = {
      {[](auto& m) { m.erase("norm_eps"); }, "model has no field 'norm_eps'"},
      {[](auto& m) { m.erase("rope_scaling"); }, "model has no field 'rope_scaling'"},
      {[](auto& m) { m["norm"] = "rmsnorm"; }, "model.norm 'rmsnorm' is not one of LayerNorm, RMSNorm"},
      {[](auto& m) { m["positions"] = "alibi"; }, "model.positions 'alibi' is not one of learned_absolute, rope"},
      {[](auto& m) { m["norm_eps"] = "1e-5"; }, "model.norm_eps is not a number"},
      {[](auto& m) { m["swiglu"] = 1; }, "model.swiglu is not true or false"},
      {[](auto& m) { m["n_kv_head"] = 0; }, "model.n_kv_head = 0 is out of range"},
      {[](auto& m) { m["n_kv_head"] = 3; }, "the model is not valid"},
      {[](auto& m) { m["norm_eps"] = -1.0; }, "the model is not valid: norm epsilon must be positive"},
      {[](auto& m) { m["rope_theta"] = 0.5; }, "the model is not valid: rotary base must be greater than 1"},
      {[](auto& m) { m["rope_scaling"]["high_freq_factor"] = 0.25; }, "the model is not valid: llama3 rope scaling"},
      {[](auto& m) { m["rope_scaling"].erase("factor"); }, "model.rope_scaling has no field 'factor'"},
      {[](auto& m) { m["rope_scaling"]["original_max_positions"] = 0; }, "original_max_positions = 0 is out of range"},
  };
  for (const auto& [change, why] : bad) {
    INFO(why);
    auto k = j;
    change(k["model"]);
    CHECK_THROWS_WITH(parse_checkpoint_manifest(k.dump(1), "m.json"), Contains("m.json: ") && Contains(why));
  }
}

TEST_CASE("checkpoint manifest: the ZeRO level round-trips; zero1 stays for old readers; old manifests read",
          "[checkpoint][zero]") {
  const ManifestSample s = manifest_sample();
  for (const int level : {0, 1, 2, 3}) {
    INFO(level);
    const std::string text = edit(s, [&](auto& m) { m.zero = level; });
    const auto j = nlohmann::json::parse(text);
    CHECK(j["layout"]["zero"] == level);
    CHECK(j["layout"]["zero1"] == (level >= 1));  // what a reader before ZeRO-2/3 looks at
    const CheckpointManifest p = parse_checkpoint_manifest(text, "m.json");
    CHECK(p.zero == level);
    CHECK(p.zero1 == (level >= 1));
    CHECK(checkpoint_manifest_json(p) == text);
  }
  // Written before ZeRO-2/3: no "zero", the level follows zero1.
  for (const bool zero1 : {false, true}) {
    auto j = nlohmann::json::parse(checkpoint_manifest_json(s.m));
    j["layout"].erase("zero");
    j["layout"]["zero1"] = zero1;
    CHECK(parse_checkpoint_manifest(j.dump(1), "m.json").zero == (zero1 ? 1 : 0));
  }
  const auto j = nlohmann::json::parse(edit(s, [](auto& m) { m.zero = 2; }));
  const std::pair<std::function<void(nlohmann::json&)>, const char*> bad[] = {
      {[](auto& l) { l["zero"] = 4; }, "layout.zero = 4 is out of range [0, 3]"},
      {[](auto& l) { l["zero"] = -1; }, "layout.zero = -1 is out of range [0, 3]"},
      {[](auto& l) { l["zero"] = "2"; }, "layout.zero is not an integer"},
      {[](auto& l) { l["zero1"] = false; }, "layout.zero1 = false contradicts layout.zero = 2"},
      {[](auto& l) { l["zero"] = 0; }, "layout.zero1 = true contradicts layout.zero = 0"},
  };
  for (const auto& [change, why] : bad) {
    INFO(why);
    auto k = j;
    change(k["layout"]);
    CHECK_THROWS_WITH(parse_checkpoint_manifest(k.dump(1), "m.json"), Contains("m.json: ") && Contains(why));
  }
}
