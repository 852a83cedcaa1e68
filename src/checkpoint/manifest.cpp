// manifest.json of a checkpoint: writing, and a reader that trusts nothing in the file.
#include "triax/checkpoint/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "triax/core/error.h"
#include "triax/io/sha256.h"
#include "triax/model/param_shards.h"

namespace triax {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kSplitNames[] = {"none", "rows", "cols", "qkv_rows"};
constexpr int64_t kMaxDim = int64_t{1} << 32;
constexpr int64_t kMaxNumel = int64_t{1} << 40;

std::string_view split_name(TpSplit s) { return kSplitNames[static_cast<int>(s)]; }

// Typed field access that names the source and the field on every failure.
struct Reader {
  const std::string& source;
  [[noreturn]] void fail(const std::string& what) const { TRIAX_THROW(IoError, "{}: {}", source, what); }
  const json& field(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(fmt::format("{} is not a JSON object", where));
    auto it = obj.find(key);
    if (it == obj.end()) fail(fmt::format("{} has no field '{}'", where, key));
    return *it;
  }
  int64_t integer(const json& obj, const char* key, const std::string& where, int64_t lo, int64_t hi) const {
    const json& v = field(obj, key, where);
    if (!v.is_number_integer()) fail(fmt::format("{}.{} is not an integer", where, key));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(fmt::format("{}.{} = {} is out of range [{}, {}]", where, key, v.get<uint64_t>(), lo, hi));
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(fmt::format("{}.{} = {} is out of range [{}, {}]", where, key, x, lo, hi));
    return x;
  }
  uint64_t uinteger(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
      fail(fmt::format("{}.{} is not a non-negative integer", where, key));
    return v.get<uint64_t>();
  }
  std::string string(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail(fmt::format("{}.{} is not a string", where, key));
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_boolean()) fail(fmt::format("{}.{} is not true or false", where, key));
    return v.get<bool>();
  }
  const json& array(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_array()) fail(fmt::format("{}.{} is not an array", where, key));
    return v;
  }
};

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

}  // namespace

std::string_view state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::param: return "param";
    case StateKind::exp_avg: return "exp_avg";
    case StateKind::exp_avg_sq: return "exp_avg_sq";
  }
  return "?";
}

std::string checkpoint_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string checkpoint_manifest_json(const CheckpointManifest& m) {
  json j;
  j["format"] = "triax-checkpoint";
  j["format_version"] = m.format_version;
  j["iteration"] = m.iteration;
  j["consumed_samples"] = m.consumed_samples;
  j["applied_steps"] = m.applied_steps;
  j["skipped_steps"] = m.skipped_steps;
  j["seed"] = m.seed;
  j["seq_length"] = m.seq;
  j["loss_scaler"] = m.loss_scaler;
  j["model"] = {{"n_layer", m.model.n_layer}, {"n_head", m.model.n_head}, {"n_embd", m.model.n_embd},
                {"ffn", m.model.ffn_size()},  {"vocab", m.model.vocab},   {"max_seq", m.model.max_seq},
                {"vocab_pad_to", m.model.vocab_pad_to}, {"tied_embeddings", m.model.tied_embeddings}};
  j["layout"] = {{"tp", m.tp}, {"pp", m.pp}, {"dp", m.dp}, {"vpp", m.vpp}, {"zero1", m.zero1},
                 {"schedule", m.schedule}};
  j["config"] = m.config_toml;
  json files = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"sha256", f.sha256}});
  j["files"] = std::move(files);
  json slices = json::array();
  for (const auto& s : m.slices)
    slices.push_back({{"name", s.name}, {"kind", state_kind_name(s.kind)}, {"dtype", "F32"},
                      {"full_shape", s.full_shape}, {"split", split_name(s.split)}, {"tp_rank", s.tp_rank},
                      {"tp_size", s.tp_size}, {"begin", s.begin}, {"end", s.end}, {"file", s.file},
                      {"offset", s.offset}});
  j["slices"] = std::move(slices);
  return j.dump(1);
}

CheckpointManifest parse_checkpoint_manifest(std::string_view text, const std::string& source) {
  const Reader r{source};
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    r.fail(fmt::format("not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) r.fail("the manifest is not a JSON object");
  if (r.string(j, "format", "manifest") != "triax-checkpoint") r.fail("field 'format' is not \"triax-checkpoint\"");
  CheckpointManifest m;
  const int64_t version = r.integer(j, "format_version", "manifest", 1, std::numeric_limits<int>::max());
  if (version > kCheckpointFormatVersion)
    r.fail(fmt::format("format version {} is newer than this build of triax reads (up to {}); use a newer triax",
                       version, kCheckpointFormatVersion));
  m.format_version = static_cast<int>(version);
  constexpr int64_t kI64 = std::numeric_limits<int64_t>::max();
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  m.iteration = r.integer(j, "iteration", "manifest", 0, kI64);
  m.consumed_samples = r.integer(j, "consumed_samples", "manifest", 0, kI64);
  m.applied_steps = r.integer(j, "applied_steps", "manifest", 0, kI64);
  m.skipped_steps = r.integer(j, "skipped_steps", "manifest", 0, kI64);
  m.seed = r.uinteger(j, "seed", "manifest");
  m.seq = static_cast<int>(r.integer(j, "seq_length", "manifest", 1, kInt));
  m.loss_scaler = r.string(j, "loss_scaler", "manifest");
  const json& mo = r.field(j, "model", "manifest");
  m.model.n_layer = static_cast<int>(r.integer(mo, "n_layer", "model", 1, 1 << 20));
  m.model.n_head = static_cast<int>(r.integer(mo, "n_head", "model", 1, 1 << 20));
  m.model.n_embd = static_cast<int>(r.integer(mo, "n_embd", "model", 1, 1 << 24));
  m.model.ffn = static_cast<int>(r.integer(mo, "ffn", "model", 1, 1 << 26));
  m.model.vocab = static_cast<int>(r.integer(mo, "vocab", "model", 2, 1 << 28));
  m.model.max_seq = static_cast<int>(r.integer(mo, "max_seq", "model", 1, 1 << 24));
  m.model.vocab_pad_to = static_cast<int>(r.integer(mo, "vocab_pad_to", "model", 1, 1 << 20));
  m.model.tied_embeddings = r.boolean(mo, "tied_embeddings", "model");
  try {
    m.model.validate(1);
  } catch (const ConfigError& e) {
    r.fail(fmt::format("the model is not valid: {}", e.what()));
  }
  const json& lo = r.field(j, "layout", "manifest");
  m.tp = static_cast<int>(r.integer(lo, "tp", "layout", 1, 1 << 20));
  m.pp = static_cast<int>(r.integer(lo, "pp", "layout", 1, 1 << 20));
  m.dp = static_cast<int>(r.integer(lo, "dp", "layout", 1, 1 << 24));
  m.vpp = static_cast<int>(r.integer(lo, "vpp", "layout", 1, 1 << 20));
  m.zero1 = r.boolean(lo, "zero1", "layout");
  m.schedule = r.string(lo, "schedule", "layout");
  m.config_toml = r.string(j, "config", "manifest");

  std::map<std::string, size_t> file_index;
  const json& files = r.array(j, "files", "manifest");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = fmt::format("files[{}]", i);
    CheckpointFileInfo f;
    f.name = r.string(files[i], "name", where);
    if (f.name.empty() || f.name.find('/') != std::string::npos || f.name == "." || f.name == "..")
      r.fail(fmt::format("{}.name '{}' is not a plain file name", where, f.name));
    f.bytes = r.uinteger(files[i], "bytes", where);
    f.sha256 = r.string(files[i], "sha256", where);
    if (f.sha256.size() != 64 || f.sha256.find_first_not_of("0123456789abcdef") != std::string::npos)
      r.fail(fmt::format("{}.sha256 is not 64 lowercase hex digits", where));
    if (!file_index.emplace(f.name, i).second) r.fail(fmt::format("file '{}' is listed twice", f.name));
    m.files.push_back(std::move(f));
  }
  const json& slices = r.array(j, "slices", "manifest");
  for (size_t i = 0; i < slices.size(); ++i) {
    const std::string where = fmt::format("slices[{}]", i);
    const json& e = slices[i];
    CheckpointSlice s;
    s.name = r.string(e, "name", where);
    const std::string kind = r.string(e, "kind", where);
    if (kind == "param") s.kind = StateKind::param;
    else if (kind == "exp_avg") s.kind = StateKind::exp_avg;
    else if (kind == "exp_avg_sq") s.kind = StateKind::exp_avg_sq;
    else r.fail(fmt::format("{}.kind '{}' is not param, exp_avg or exp_avg_sq", where, kind));
    if (r.string(e, "dtype", where) != "F32") r.fail(fmt::format("{}.dtype is not F32 (format version 1)", where));
    const json& shape = r.array(e, "full_shape", where);
    if (shape.empty() || shape.size() > 4) r.fail(fmt::format("{}.full_shape has {} dimensions, expected 1 to 4", where, shape.size()));
    int64_t numel = 1;
    for (const auto& d : shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > kMaxDim)
        r.fail(fmt::format("{}.full_shape has a dimension that is not an integer in [1, {}]", where, kMaxDim));
      s.full_shape.push_back(d.get<int64_t>());
      numel *= s.full_shape.back();
      if (numel > kMaxNumel) r.fail(fmt::format("{}.full_shape has more than {} elements", where, kMaxNumel));
    }
    const std::string split = r.string(e, "split", where);
    const auto sp = std::find(std::begin(kSplitNames), std::end(kSplitNames), split);
    if (sp == std::end(kSplitNames)) r.fail(fmt::format("{}.split '{}' is not none, rows, cols or qkv_rows", where, split));
    s.split = static_cast<TpSplit>(sp - std::begin(kSplitNames));
    if (s.split == TpSplit::cols && s.full_shape.size() < 2)
      r.fail(fmt::format("{}: split cols needs 2 dimensions, full_shape has 1", where));
    s.tp_size = static_cast<int>(r.integer(e, "tp_size", where, 1, 1 << 20));
    s.tp_rank = static_cast<int>(r.integer(e, "tp_rank", where, 0, s.tp_size - 1));
    int64_t local = 0;
    try {
      local = numel_of(shard_shape(s.full_shape, s.split, s.tp_size, s.name));
    } catch (const ConfigError& err) {
      r.fail(fmt::format("{}: tensor '{}' cannot be split over tp {}: {}", where, s.name, s.tp_size, err.what()));
    }
    s.begin = r.integer(e, "begin", where, 0, local - 1);
    s.end = r.integer(e, "end", where, s.begin + 1, local);
    s.file = r.string(e, "file", where);
    auto fi = file_index.find(s.file);
    if (fi == file_index.end()) r.fail(fmt::format("{}.file '{}' is not in the list of files", where, s.file));
    s.offset = r.uinteger(e, "offset", where);
    const uint64_t bytes = static_cast<uint64_t>(s.end - s.begin) * 4;
    const uint64_t fsize = m.files[fi->second].bytes;
    if (s.offset < kCheckpointShardMagic.size() || s.offset > fsize || bytes > fsize - s.offset)
      r.fail(fmt::format("{}: bytes [{}, {}) lie outside file '{}' of {} bytes", where, s.offset, s.offset + bytes,
                         s.file, fsize));
    m.slices.push_back(std::move(s));
  }
  return m;
}

void check_checkpoint_file(std::span<const std::byte> bytes, const CheckpointFileInfo& f, const std::string& where) {
  if (bytes.size() != f.bytes)
    TRIAX_THROW(IoError, "{}: {} bytes, but the manifest lists {} bytes ({})", where, bytes.size(), f.bytes,
                bytes.size() < f.bytes ? "truncated" : "extra bytes");
  if (bytes.size() < kCheckpointShardMagic.size() ||
      std::memcmp(bytes.data(), kCheckpointShardMagic.data(), kCheckpointShardMagic.size()) != 0)
    TRIAX_THROW(IoError, "{}: does not start with the shard magic '{}'", where, kCheckpointShardMagic);
  const std::string h = io::sha256_hex(bytes);
  if (h != f.sha256)
    TRIAX_THROW(IoError, "{}: SHA-256 mismatch: the file hashes to {}, the manifest lists {} (a corrupted file)",
                where, h, f.sha256);
}

std::vector<std::byte> read_checkpoint_file(const std::string& dir, const CheckpointFileInfo& f) {
  const std::string path = (fs::path(dir) / f.name).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) TRIAX_THROW(IoError, "{}: missing shard file (listed in the manifest, cannot be opened)", path);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::streamoff>(in.tellg());
  if (size < 0) TRIAX_THROW(IoError, "{}: cannot determine the file size", path);
  if (static_cast<uint64_t>(size) != f.bytes)
    TRIAX_THROW(IoError, "{}: {} bytes, but the manifest lists {} bytes ({})", path, size, f.bytes,
                static_cast<uint64_t>(size) < f.bytes ? "truncated" : "extra bytes");
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) TRIAX_THROW(IoError, "{}: read failed", path);
  check_checkpoint_file(bytes, f, path);
  return bytes;
}

std::vector<float> checkpoint_slice_values(std::span<const std::byte> file_bytes, const CheckpointSlice& s) {
  const size_t n = static_cast<size_t>(s.end - s.begin);
  if (s.offset > file_bytes.size() || n * 4 > file_bytes.size() - s.offset)
    TRIAX_THROW(IoError, "slice of '{}' ({}) lies outside its file '{}'", s.name, state_kind_name(s.kind), s.file);
  std::vector<float> v(n);
  std::memcpy(v.data(), file_bytes.data() + s.offset, n * 4);
  return v;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("iter_") || n.size() != 12) continue;
    int64_t it = 0;
    const auto [p, err] = std::from_chars(n.data() + 5, n.data() + n.size(), it);
    if (err != std::errc() || p != n.data() + n.size()) continue;
    if (!fs::is_regular_file(e.path() / "manifest.json", ec)) continue;
    out.emplace_back(it, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace triax
