// manifest.json of a checkpoint: writing, and a reader that trusts nothing in the file: its
// digest, every field's type and range, and the structure the writer always produces.
#include "triax/checkpoint/manifest.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <tuple>

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
constexpr int64_t kMaxBatch = int64_t{1} << 40;
constexpr int64_t kMaxRampSteps = int64_t{1} << 24;  // increments of a batch ramp (real ones: tens)
constexpr int64_t kI64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt = std::numeric_limits<int>::max();
constexpr uint64_t kF32 = 4;  // bytes per element (format versions 1 and 2 hold F32 only)

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
  double real(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_number()) fail(fmt::format("{}.{} is not a number", where, key));
    const double x = v.get<double>();
    if (!std::isfinite(x)) fail(fmt::format("{}.{} is not finite", where, key));
    return x;
  }
  template <class E>
  E enumeration(const json& obj, const char* key, const std::string& where) const {
    const std::string v = string(obj, key, where);
    const std::optional<E> e = find_enum<E>(v);
    if (!e) fail(fmt::format("{}.{} '{}' is not one of {}", where, key, v, enum_choices<E>()));
    return *e;
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

// ---- parsing, part by part

// Version 3's fields of the block (GptConfig's choices beyond GPT-2's); versions 1 and 2 have none
// (and may not: a version edited down is refused) and hold GPT-2's block.
constexpr const char* kBlockFields[] = {"n_kv_head", "norm", "norm_eps", "swiglu", "positions", "rope_theta",
                                        "rope_scaling", "bias"};

void parse_block(const Reader& r, const json& mo, CheckpointManifest& m) {
  GptConfig& c = m.model;
  if (m.format_version < 3) {
    for (const char* k : kBlockFields)
      if (mo.contains(k))
        r.fail(fmt::format("a version {} manifest has no field 'model.{}' (edited format_version?)", m.format_version, k));
    return;
  }
  c.n_kv_head = static_cast<int>(r.integer(mo, "n_kv_head", "model", 1, 1 << 20));
  c.norm = r.enumeration<Norm>(mo, "norm", "model");
  c.norm_eps = r.real(mo, "norm_eps", "model");
  c.swiglu = r.boolean(mo, "swiglu", "model");
  c.positions = r.enumeration<PositionEmbedding>(mo, "positions", "model");
  c.rope_theta = r.real(mo, "rope_theta", "model");
  const json& rs = r.field(mo, "rope_scaling", "model");
  if (!rs.is_null()) {
    RopeScaling& s = c.rope_scaling;
    s.llama3 = true;
    s.factor = r.real(rs, "factor", "model.rope_scaling");
    s.low_freq_factor = r.real(rs, "low_freq_factor", "model.rope_scaling");
    s.high_freq_factor = r.real(rs, "high_freq_factor", "model.rope_scaling");
    s.original_max_positions =
        static_cast<int>(r.integer(rs, "original_max_positions", "model.rope_scaling", 1, 1 << 30));
  }
  c.bias = r.boolean(mo, "bias", "model");
}

void parse_scalars(const Reader& r, const json& j, CheckpointManifest& m) {
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
  parse_block(r, mo, m);
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
  if (lo.contains("cp")) m.cp = static_cast<int>(r.integer(lo, "cp", "layout", 1, 1 << 20));
  m.zero1 = r.boolean(lo, "zero1", "layout");
  m.zero = m.zero1 ? 1 : 0;  // before ZeRO-2/3 the manifest had only zero1
  if (lo.contains("zero")) {
    m.zero = static_cast<int>(r.integer(lo, "zero", "layout", 0, 3));
    if (m.zero1 != (m.zero >= 1))
      r.fail(fmt::format("layout.zero1 = {} contradicts layout.zero = {} (zero1 is true exactly for zero >= 1)",
                         m.zero1, m.zero));
  }
  m.schedule = r.string(lo, "schedule", "layout");
  m.config_toml = r.string(j, "config", "manifest");
}

// Version 2's "batch"; version 1 has none (and may not: a version edited down is refused).
void parse_batch(const Reader& r, const json& j, CheckpointManifest& m) {
  if (m.format_version < 2) {
    if (j.contains("batch")) r.fail("a version 1 manifest has no field 'batch' (edited format_version?)");
    return;
  }
  const json& b = r.field(j, "batch", "manifest");
  CheckpointBatch c;
  c.global_batch = r.integer(b, "global_batch", "batch", 1, kMaxBatch);
  c.micro_batch = r.integer(b, "micro_batch", "batch", 1, kMaxBatch);
  c.num_micro_batches = r.integer(b, "num_micro_batches", "batch", 1, kMaxBatch);
  const json& ramp = r.field(b, "rampup", "batch");
  if (!ramp.is_null()) {
    BatchRampup u;
    u.start = r.integer(ramp, "start", "batch.rampup", 1, kMaxBatch);
    u.increment = r.integer(ramp, "increment", "batch.rampup", 1, kMaxBatch);
    u.samples = r.integer(ramp, "samples", "batch.rampup", 0, kI64);
    c.rampup = u;
  }
  c.since_iteration = r.integer(b, "since_iteration", "batch", 0, kI64);
  c.since_consumed_samples = r.integer(b, "since_consumed_samples", "batch", 0, kI64);
  if (b.contains("dp_microbatches")) {
    const json& s = b.at("dp_microbatches");
    if (!s.is_array()) r.fail("batch.dp_microbatches: expected an array of micro-batch counts");
    for (const json& v : s) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxBatch)
        r.fail(fmt::format("batch.dp_microbatches: {} is not a micro-batch count in [1, {}]", v.dump(), kMaxBatch));
      c.dp_microbatches.push_back(v.get<int64_t>());
    }
  }
  m.batch = c;
}

void parse_files(const Reader& r, const json& j, CheckpointManifest& m) {
  std::set<std::string> names;
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
    if (!names.insert(f.name).second) r.fail(fmt::format("file '{}' is listed twice", f.name));
    m.files.push_back(std::move(f));
  }
}

CheckpointSlice parse_slice(const Reader& r, const json& e, const std::string& where, const CheckpointManifest& m) {
  CheckpointSlice s;
  s.name = r.string(e, "name", where);
  const std::string kind = r.string(e, "kind", where);
  if (kind == "param") s.kind = StateKind::param;
  else if (kind == "exp_avg") s.kind = StateKind::exp_avg;
  else if (kind == "exp_avg_sq") s.kind = StateKind::exp_avg_sq;
  else r.fail(fmt::format("{}.kind '{}' is not param, exp_avg or exp_avg_sq", where, kind));
  if (r.string(e, "dtype", where) != "F32") r.fail(fmt::format("{}.dtype is not F32", where));
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
  const auto fi = std::find_if(m.files.begin(), m.files.end(), [&](const auto& f) { return f.name == s.file; });
  if (fi == m.files.end()) r.fail(fmt::format("{}.file '{}' is not in the list of files", where, s.file));
  s.offset = r.uinteger(e, "offset", where);
  const uint64_t bytes = static_cast<uint64_t>(s.end - s.begin) * kF32;
  if (s.offset < kCheckpointShardMagic.size() || s.offset > fi->bytes || bytes > fi->bytes - s.offset)
    r.fail(fmt::format("{}: bytes [{}, {}) lie outside file '{}' of {} bytes", where, s.offset, s.offset + bytes,
                       s.file, fi->bytes));
  if (s.offset % kF32 != 0)
    r.fail(fmt::format("{}.offset {} is not a multiple of {} (the size of an F32)", where, s.offset, kF32));
  return s;
}

// ---- structure

// Each file: its slices back to back from the magic to its last byte.
void check_tiling(const Reader& r, const CheckpointManifest& m) {
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> runs;  // file -> (offset, bytes)
  for (const auto& s : m.slices) runs[s.file].emplace_back(s.offset, static_cast<uint64_t>(s.end - s.begin) * kF32);
  for (const auto& f : m.files) {
    auto& v = runs[f.name];
    std::sort(v.begin(), v.end());
    uint64_t at = kCheckpointShardMagic.size();
    for (const auto& [off, n] : v) {
      if (off != at)
        r.fail(fmt::format("file '{}': {} at byte {} (a slice starts at {}; slices must tile the file)", f.name,
                           off < at ? "two slices overlap" : "a gap", std::min(off, at), off));
      at += n;
    }
    if (at != f.bytes)
      r.fail(fmt::format("file '{}' has {} bytes but its slices end at byte {} (slices must tile the file)", f.name,
                         f.bytes, at));
  }
}

// Every tensor: one shape, split and tp size (the layout's); each kind of each tp rank that holds
// it covered exactly once.
void check_coverage(const Reader& r, const CheckpointManifest& m) {
  std::map<std::string, const CheckpointSlice*> first;
  std::map<std::tuple<std::string, int, int>, std::vector<std::pair<int64_t, int64_t>>> cover;
  for (const auto& s : m.slices) {
    const auto* f = first.emplace(s.name, &s).first->second;
    if (s.full_shape != f->full_shape || s.split != f->split || s.tp_size != f->tp_size)
      r.fail(fmt::format("the slices of tensor '{}' disagree on its shape, split or tp size", s.name));
    if (s.tp_size != m.tp)
      r.fail(fmt::format("tensor '{}' is sliced for tp {}, the layout says tp {}", s.name, s.tp_size, m.tp));
    if (s.split == TpSplit::none && s.tp_rank != 0)
      r.fail(fmt::format("tensor '{}' is not split but has a slice of tp rank {} (only tp rank 0 writes it)", s.name,
                         s.tp_rank));
    cover[{s.name, static_cast<int>(s.kind), s.tp_rank}].emplace_back(s.begin, s.end);
  }
  for (const auto& [name, s] : first) {
    const int64_t local = numel_of(shard_shape(s->full_shape, s->split, s->tp_size, name));
    const int ranks = s->split == TpSplit::none ? 1 : s->tp_size;
    for (const StateKind k : {StateKind::param, StateKind::exp_avg, StateKind::exp_avg_sq})
      for (int tr = 0; tr < ranks; ++tr) {
        auto it = cover.find({name, static_cast<int>(k), tr});
        if (it == cover.end())
          r.fail(fmt::format("tensor '{}' ({}) has no slice of tp rank {}", name, state_kind_name(k), tr));
        auto& v = it->second;
        std::sort(v.begin(), v.end());
        int64_t at = 0;
        for (const auto& [b, e] : v) {
          if (b != at)
            r.fail(fmt::format("tensor '{}' ({}) of tp rank {}: {} at element {}", name, state_kind_name(k), tr,
                               b < at ? "two slices overlap" : "no slice holds the elements", std::min(b, at)));
          at = e;
        }
        if (at != local)
          r.fail(fmt::format("tensor '{}' ({}) of tp rank {}: elements [{}, {}) are in no slice", name,
                             state_kind_name(k), tr, at, local));
      }
  }
}

// The consumed samples after `steps` steps from `consumed` with batch settings b (the trainer adds
// the ramp's global batch at the samples consumed so far each step); nullopt past int64.
std::optional<int64_t> consumed_after(int64_t consumed, int64_t steps, const CheckpointBatch& b) {
  const BatchSchedule sched(BatchPlan{b.global_batch, 1, b.global_batch, 1}, b.rampup);  // the ramp's arithmetic only
  const auto& u = b.rampup;
  const int64_t incs = sched.num_increments();
  while (steps > 0) {
    const int64_t g = sched.global_batch(consumed);
    int64_t n = steps;  // steps at this global batch
    if (u && incs > 0 && u->samples > 0 && consumed < u->samples) {
      // Increment k lasts until consumed x incs >= (k + 1) x samples.
      const __int128 k = static_cast<__int128>(consumed) * incs / u->samples;
      const __int128 next = ((k + 1) * u->samples + incs - 1) / incs;
      n = static_cast<int64_t>(std::min<__int128>(steps, (next - consumed + g - 1) / g));
    }
    const __int128 c = static_cast<__int128>(consumed) + static_cast<__int128>(n) * g;
    if (c > kI64) return std::nullopt;
    consumed = static_cast<int64_t>(c);
    steps -= n;
  }
  return consumed;
}

void check_scalars(const Reader& r, const CheckpointManifest& m) {
  if (m.applied_steps > kI64 - m.skipped_steps || m.applied_steps + m.skipped_steps != m.iteration)
    r.fail(fmt::format("applied_steps {} + skipped_steps {} != iteration {} (one optimizer step per iteration)",
                       m.applied_steps, m.skipped_steps, m.iteration));
  if ((m.iteration == 0) != (m.consumed_samples == 0) || m.consumed_samples < m.iteration)
    r.fail(fmt::format("consumed_samples {} does not fit iteration {} (every iteration consumes at least one sample)",
                       m.consumed_samples, m.iteration));
  if (m.seq > m.model.max_seq)
    r.fail(fmt::format("seq_length {} exceeds the model's max_seq {}", m.seq, m.model.max_seq));
  if (static_cast<int64_t>(m.pp) * m.vpp > m.model.n_layer)
    r.fail(fmt::format("layout pp {} x vpp {} exceeds the model's {} layers", m.pp, m.vpp, m.model.n_layer));
  if (!m.batch) return;
  const CheckpointBatch& b = *m.batch;
  if (!b.dp_microbatches.empty()) {
    __int128 sum = 0;
    for (int64_t v : b.dp_microbatches) sum += v;
    if (static_cast<int>(b.dp_microbatches.size()) != m.dp || sum * b.micro_batch != b.global_batch)
      r.fail(fmt::format("batch: dp_microbatches [{}] are not dp {} counts with micro_batch {} x their sum = "
                         "global_batch {}", fmt::join(b.dp_microbatches, ", "), m.dp, b.micro_batch, b.global_batch));
  }
  const __int128 prod = static_cast<__int128>(b.micro_batch) * m.dp * b.num_micro_batches;
  if (b.dp_microbatches.empty() && prod != b.global_batch)
    r.fail(fmt::format("batch: global_batch {} != micro_batch {} x dp {} x num_micro_batches {}", b.global_batch,
                       b.micro_batch, m.dp, b.num_micro_batches));
  if (b.rampup && (b.global_batch - b.rampup->start) / b.rampup->increment > kMaxRampSteps)
    r.fail(fmt::format("batch.rampup has more than {} increments", kMaxRampSteps));
  if (b.since_iteration > m.iteration || b.since_consumed_samples > m.consumed_samples ||
      (b.since_iteration == 0) != (b.since_consumed_samples == 0))
    r.fail(fmt::format("batch: since_iteration {} and since_consumed_samples {} do not fit iteration {} and "
                       "consumed_samples {}", b.since_iteration, b.since_consumed_samples, m.iteration,
                       m.consumed_samples));
  std::optional<int64_t> want;
  try {
    want = consumed_after(b.since_consumed_samples, m.iteration - b.since_iteration, b);
  } catch (const ConfigError& e) {
    r.fail(fmt::format("batch.rampup is not valid: {}", e.what()));
  }
  if (want != m.consumed_samples)
    r.fail(fmt::format("consumed_samples {} != {} (from {} samples at iteration {} and {} more iterations at global "
                       "batch {}{})", m.consumed_samples, want ? fmt::format("{}", *want) : "an overflow",
                       b.since_consumed_samples, b.since_iteration, m.iteration - b.since_iteration, b.global_batch,
                       b.rampup ? " with its ramp-up" : ""));
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

std::string read_checkpoint_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TRIAX_THROW(IoError, "{}: cannot be opened", path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) TRIAX_THROW(IoError, "{}: read failed", path);
  return ss.str();
}

std::string checkpoint_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }
std::string checkpoint_shard_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

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
  if (m.format_version >= 3) {  // the block (an older version's manifest, which tests write, has GPT-2's)
    const GptConfig& c = m.model;
    const RopeScaling& s = c.rope_scaling;
    json scaling = nullptr;
    if (s.llama3)
      scaling = {{"factor", s.factor}, {"low_freq_factor", s.low_freq_factor}, {"high_freq_factor", s.high_freq_factor},
                 {"original_max_positions", s.original_max_positions}};
    j["model"].update({{"n_kv_head", c.kv_heads()}, {"norm", enum_name(c.norm)}, {"norm_eps", c.norm_eps},
                       {"swiglu", c.swiglu}, {"positions", enum_name(c.positions)}, {"rope_theta", c.rope_theta},
                       {"rope_scaling", std::move(scaling)}, {"bias", c.bias}});
  }
  j["layout"] = {{"tp", m.tp}, {"cp", m.cp}, {"pp", m.pp}, {"dp", m.dp}, {"vpp", m.vpp}, {"zero", m.zero}, {"zero1", m.zero >= 1},
                 {"schedule", m.schedule}};
  if (m.batch) {
    const CheckpointBatch& b = *m.batch;
    json ramp = nullptr;
    if (b.rampup) ramp = {{"start", b.rampup->start}, {"increment", b.rampup->increment}, {"samples", b.rampup->samples}};
    j["batch"] = {{"global_batch", b.global_batch}, {"micro_batch", b.micro_batch},
                  {"num_micro_batches", b.num_micro_batches}, {"rampup", std::move(ramp)},
                  {"since_iteration", b.since_iteration}, {"since_consumed_samples", b.since_consumed_samples}};
    if (!b.dp_microbatches.empty()) j["batch"]["dp_microbatches"] = b.dp_microbatches;
  }
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
  CheckpointManifest m = parse_checkpoint_part(text, source);
  check_checkpoint_manifest_structure(m, source);
  return m;
}

CheckpointManifest parse_checkpoint_part(std::string_view text, const std::string& source) {
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
  const int64_t version = r.integer(j, "format_version", "manifest", 1, kInt);
  if (version > kCheckpointFormatVersion)
    r.fail(fmt::format("format version {} is newer than this build of triax reads (up to {}); use a newer triax",
                       version, kCheckpointFormatVersion));
  m.format_version = static_cast<int>(version);
  parse_scalars(r, j, m);
  parse_batch(r, j, m);
  parse_files(r, j, m);
  const json& slices = r.array(j, "slices", "manifest");
  for (size_t i = 0; i < slices.size(); ++i) m.slices.push_back(parse_slice(r, slices[i], fmt::format("slices[{}]", i), m));
  return m;
}

void check_checkpoint_manifest_structure(const CheckpointManifest& m, const std::string& source) {
  const Reader r{source};
  const int64_t world = static_cast<int64_t>(m.tp) * m.cp * m.pp * m.dp;
  if (static_cast<int64_t>(m.files.size()) != world)
    r.fail(fmt::format("{} files for the layout tp {}{} x pp {} x dp {} = {} ranks (one file per rank)", m.files.size(),
                       m.tp, m.cp > 1 ? fmt::format(" x cp {}", m.cp) : std::string(), m.pp, m.dp, world));
  for (size_t k = 0; k < m.files.size(); ++k)
    if (m.files[k].name != checkpoint_shard_name(static_cast<int>(k)))
      r.fail(fmt::format("files[{}] is '{}', expected '{}'", k, m.files[k].name, checkpoint_shard_name(static_cast<int>(k))));
  check_tiling(r, m);
  check_coverage(r, m);
  check_scalars(r, m);
}

std::string checkpoint_manifest_digest(std::string_view manifest_text) {
  return fmt::format("{}  {}\n", io::sha256_hex(std::as_bytes(std::span<const char>(manifest_text))), kManifestName);
}

void check_checkpoint_manifest_digest(std::string_view manifest_text, std::string_view digest_text,
                                      const std::string& where) {
  const std::string want = checkpoint_manifest_digest(manifest_text);
  if (digest_text == want) return;
  const std::string_view listed = digest_text.substr(0, 64);
  if (digest_text.size() != want.size() || digest_text.substr(64) != std::string_view(want).substr(64) ||
      listed.find_first_not_of("0123456789abcdef") != std::string_view::npos)
    TRIAX_THROW(IoError, "{}: not a manifest digest (expected one line '<64 hex digits>  {}')", where, kManifestName);
  TRIAX_THROW(IoError, "{}: SHA-256 mismatch: {} hashes to {}, the digest lists {} (the manifest was edited or "
                       "corrupted)", where, kManifestName, want.substr(0, 64), listed);
}

CheckpointManifest read_checkpoint_manifest(const std::string& dir, int64_t dir_iteration, bool* digest_checked) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  const std::string digest_path = (fs::path(dir) / kManifestDigestName).string();
  const std::string text = read_checkpoint_text(path);
  std::error_code ec;
  const bool has_digest = fs::exists(digest_path, ec);
  if (has_digest) check_checkpoint_manifest_digest(text, read_checkpoint_text(digest_path), digest_path);
  CheckpointManifest m = parse_checkpoint_manifest(text, path);
  if (!has_digest && m.format_version >= 2)
    TRIAX_THROW(IoError, "{}: missing: a version {} checkpoint always has its manifest's digest there (removed, or "
                         "not copied)", digest_path, m.format_version);
  if (dir_iteration >= 0 && m.iteration != dir_iteration)
    TRIAX_THROW(IoError, "{}: iteration {}, but the directory is named for iteration {}", path, m.iteration,
                dir_iteration);
  if (digest_checked) *digest_checked = has_digest;
  return m;
}

namespace {

// The fields of two models that differ, each with the flag that sets it: "norm (--normalization):
// RMSNorm in the checkpoint, LayerNorm in this run".
std::vector<std::string> model_differences(const GptConfig& h, const GptConfig& b) {
  std::vector<std::string> out;
  auto cmp = [&](const char* field, const char* flag, const auto& x, const auto& y) {
    if (x != y) out.push_back(fmt::format("{} ({}): {} in the checkpoint, {} in this run", field, flag, x, y));
  };
  auto scaling = [](const RopeScaling& s) {
    return s.llama3 ? fmt::format("llama3 factor {} low {} high {} original {}", s.factor, s.low_freq_factor,
                                  s.high_freq_factor, s.original_max_positions)
                    : std::string("none");
  };
  cmp("n_layer", "--num-layers", h.n_layer, b.n_layer);
  cmp("n_head", "--num-attention-heads", h.n_head, b.n_head);
  cmp("n_embd", "--hidden-size", h.n_embd, b.n_embd);
  cmp("ffn", "--ffn-hidden-size", h.ffn_size(), b.ffn_size());
  cmp("vocab", "--vocab-size", h.vocab, b.vocab);
  cmp("max_seq", "--max-position-embeddings", h.max_seq, b.max_seq);
  cmp("tied_embeddings", "--untie-embeddings-and-output-weights", h.tied_embeddings, b.tied_embeddings);
  cmp("n_kv_head", "--num-query-groups", h.kv_heads(), b.kv_heads());
  cmp("norm", "--normalization", enum_name(h.norm), enum_name(b.norm));
  cmp("norm_eps", "--norm-epsilon", h.norm_eps, b.norm_eps);
  cmp("swiglu", "--swiglu", h.swiglu, b.swiglu);
  cmp("positions", "--position-embedding-type", enum_name(h.positions), enum_name(b.positions));
  cmp("rope_theta", "--rotary-base", h.rope_theta, b.rope_theta);
  cmp("rope_scaling", "--use-rope-scaling, --rope-scaling-factor", scaling(h.rope_scaling), scaling(b.rope_scaling));
  cmp("bias", "--disable-bias-linear", h.bias, b.bias);
  return out;
}

}  // namespace

void check_checkpoint_matches_run(const CheckpointManifest& a, const GptConfig& b, uint64_t seed, int seq,
                                  const std::string& where) {
  const GptConfig& h = a.model;
  if (const auto diff = model_differences(h, b); !diff.empty())
    TRIAX_THROW(IoError, "{}: a checkpoint of another model: {}; it holds {}, this run trains {}", where,
                fmt::join(diff, "; "), h.describe(), b.describe());
  if (a.seed != seed || a.seq != seq)
    TRIAX_THROW(IoError, "{}: written with --seed {} and --seq-length {}, this run has --seed {} and --seq-length {} "
                         "(the data order and position depend on both)", where, a.seed, a.seq, seed, seq);
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

namespace {
// N for a directory named exactly checkpoint_dir_name(N) (any width: iteration 10,000,000 has 8
// digits; "iter_42" next to "iter_0000042" is not a second checkpoint 42), else nothing.
std::optional<int64_t> iteration_of_dir_name(const std::string& n) {
  if (!n.starts_with("iter_") || n.size() < 6 || n[5] < '0' || n[5] > '9') return std::nullopt;
  int64_t it = 0;
  const auto [p, err] = std::from_chars(n.data() + 5, n.data() + n.size(), it);
  if (err != std::errc() || p != n.data() + n.size() || n != checkpoint_dir_name(it)) return std::nullopt;
  return it;
}
}  // namespace

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const auto it = iteration_of_dir_name(e.path().filename().string());
    if (!it || !fs::is_regular_file(e.path() / kManifestName, ec)) continue;
    out.emplace_back(*it, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::vector<std::pair<int64_t, std::string>> checkpoints_to_load(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::path(path).lexically_normal();
  const fs::path dir = p.has_filename() ? p : p.parent_path();
  if (const auto it = iteration_of_dir_name(dir.filename().string());
      it && fs::is_regular_file(dir / kManifestName, ec))
    return {{*it, dir.string()}};
  return list_checkpoints(path);
}

}  // namespace triax
