// HF Llama model directories in and out: config.json <-> GptConfig, safetensors (one file or a
// sharded index) <-> a ParamStore whose names are the HF names (see hf_dir.h).
#include "triax/model/hf_dir.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "triax/core/error.h"
#include "triax/distributed/grid.h"
#include "triax/io/atomic_file.h"
#include "triax/io/safetensors.h"

namespace triax {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kConfig = "config.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TRIAX_THROW(IoError, "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) TRIAX_THROW(IoError, "{}: read failed", path);
  return ss.str();
}

json parse_json(const std::string& text, const std::string& where) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TRIAX_THROW(IoError, "{}: not valid JSON: {}", where, e.what());
  }
}

// Typed access to config.json's keys: each error names the file and the key.
class Keys {
 public:
  Keys(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  // Present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& need(const char* key) const {
    if (!has(key)) TRIAX_THROW(ConfigError, "{}: missing key '{}'", where_, key);
    return j_.at(key);
  }
  int positive_int(const char* key) const {
    const json& v = need(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (int64_t{1} << 31) - 1)
      TRIAX_THROW(ConfigError, "{}: key '{}' is {}, expected a positive integer", where_, key, v.dump());
    return static_cast<int>(v.get<int64_t>());
  }
  int positive_int(const char* key, int dflt) const { return has(key) ? positive_int(key) : dflt; }
  double positive_number(const char* key) const {
    const json& v = need(key);
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      TRIAX_THROW(ConfigError, "{}: key '{}' is {}, expected a positive number", where_, key, v.dump());
    return v.get<double>();
  }
  double positive_number(const char* key, double dflt) const { return has(key) ? positive_number(key) : dflt; }
  bool boolean(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = j_.at(key);
    if (!v.is_boolean()) TRIAX_THROW(ConfigError, "{}: key '{}' is {}, expected true or false", where_, key, v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key) const {
    const json& v = need(key);
    if (!v.is_string()) TRIAX_THROW(ConfigError, "{}: key '{}' is {}, expected a string", where_, key, v.dump());
    return v.get<std::string>();
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

// rope_scaling: null / absent / rope_type "default" = none; "llama3" with its four numbers.
RopeScaling read_rope_scaling(const Keys& top, const json& root) {
  RopeScaling s;
  if (!top.has("rope_scaling")) return s;
  const json& j = root.at("rope_scaling");
  const std::string where = top.where() + ": rope_scaling";
  if (!j.is_object()) TRIAX_THROW(ConfigError, "{} is {}, expected null or an object", where, j.dump());
  const Keys k(j, where);
  const char* type_key = k.has("rope_type") ? "rope_type" : "type";
  const std::string type = k.string(type_key);
  if (type == "default") return s;
  if (type != "llama3")
    TRIAX_THROW(ConfigError, "{}: {} '{}' is not supported (only 'llama3' frequency scaling, or null for none)", where,
                type_key, type);
  s.llama3 = true;
  s.factor = k.positive_number("factor");
  s.low_freq_factor = k.positive_number("low_freq_factor");
  s.high_freq_factor = k.positive_number("high_freq_factor");
  s.original_max_positions = k.positive_int("original_max_position_embeddings");
  return s;
}

void check_same_model(const std::string& dir, const GptConfig& f, const GptConfig& m) {
  const auto shape = [](const GptConfig& c) {
    return fmt::format("layers={} heads={} kv_heads={} hidden={} ffn={} vocab={} norm={} swiglu={} positions={} "
                       "bias={} tied={}",
                       c.n_layer, c.n_head, c.kv_heads(), c.n_embd, c.ffn_size(), c.vocab, enum_name(c.norm), c.swiglu,
                       enum_name(c.positions), c.bias, c.tied_embeddings);
  };
  if (shape(f) != shape(m))
    TRIAX_THROW(IoError, "{}: config.json describes a model with {}, but the model being loaded has {}", dir, shape(f),
                shape(m));
}

// The tensors of a directory: one model.safetensors, or the shards an index names.
class DirTensors {
 public:
  explicit DirTensors(const std::string& dir) {
    const fs::path d(dir);
    if (fs::exists(d / kSingle)) {
      open((d / kSingle).string());
      for (const auto& t : files_.back()->tensors()) where_[t.name] = files_.back().get();
      return;
    }
    if (!fs::exists(d / kIndex))
      TRIAX_THROW(IoError, "{}: neither {} nor {} is there: no weights in this HF model directory", dir, kSingle,
                  kIndex);
    const std::string ipath = (d / kIndex).string();
    const json j = parse_json(read_text(ipath), ipath);
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object())
      TRIAX_THROW(IoError, "{}: no object 'weight_map' (tensor name -> shard file)", ipath);
    std::map<std::string, io::SafetensorsReader*> by_file;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().empty() || file.get<std::string>().find('/') != std::string::npos)
        TRIAX_THROW(IoError, "{}: weight_map['{}'] is {}, expected a file name in the directory", ipath, name,
                    file.dump());
      auto& r = by_file[file.get<std::string>()];
      if (!r) r = open((d / file.get<std::string>()).string());
      if (!r->contains(name))
        TRIAX_THROW(IoError, "{}: weight_map puts tensor '{}' in {}, which does not hold it", ipath, name, r->path());
      where_[name] = r;
    }
    // A shard's tensors that the index does not name are still the model's: an unknown one is an error.
    for (const auto& f : files_)
      for (const auto& t : f->tensors())
        if (!where_.count(t.name))
          TRIAX_THROW(IoError, "{}: tensor '{}' is not in {}'s weight_map", f->path(), t.name, ipath);
  }
  const std::map<std::string, const io::SafetensorsReader*>& tensors() const { return where_; }
  // The file holding `name`, or nullptr.
  const io::SafetensorsReader* find(const std::string& name) const {
    const auto it = where_.find(name);
    return it == where_.end() ? nullptr : it->second;
  }

 private:
  io::SafetensorsReader* open(const std::string& path) {
    files_.push_back(std::make_unique<io::SafetensorsReader>(path));
    return files_.back().get();
  }
  std::vector<std::unique_ptr<io::SafetensorsReader>> files_;
  std::map<std::string, const io::SafetensorsReader*> where_;
};

bool ignorable_extra(const std::string& name, const GptConfig& cfg) {
  return name.ends_with("rotary_emb.inv_freq") || (cfg.tied_embeddings && name == "lm_head.weight");
}

bool is_vocab_param(const std::string& name) { return name == "model.embed_tokens.weight" || name == "lm_head.weight"; }

// This TP rank's shard of one store parameter, read from its file: the rows or columns of the
// rank's block only; vocabulary rows past the file's real rows are zeros.
std::vector<float> read_param_shard(const io::TensorFile& f, const ParamInfo& info, int64_t file_rows, int tp_rank,
                                    int tp_size) {
  const auto& full = info.spec.full_shape;
  std::vector<io::SliceRange> r;
  for (auto d : full) r.push_back({0, d});
  if (info.spec.split == TpSplit::rows || info.spec.split == TpSplit::cols) {
    const size_t dim = info.spec.split == TpSplit::rows ? 0 : 1;
    const int64_t n = full[dim] / tp_size;
    r[dim] = {tp_rank * n, (tp_rank + 1) * n};
  } else if (info.spec.split != TpSplit::none) {
    TRIAX_THROW(ConfigError, "parameter '{}': a fused-QKV split has no place in an HF Llama directory",
                info.spec.name);
  }
  const int64_t want_rows = r[0].end - r[0].begin;
  r[0].end = std::min(r[0].end, file_rows);
  r[0].begin = std::min(r[0].begin, r[0].end);
  std::vector<float> v = f.read_slice(info.spec.name, r);
  int64_t row = 1;
  for (size_t d = 1; d < r.size(); ++d) row *= r[d].end - r[d].begin;
  v.resize(static_cast<size_t>(want_rows * row), 0.0f);  // padded vocabulary rows
  return v;
}

// rename(2) of a complete temporary directory onto dir: atomically exchanged with an existing
// one (whose old contents are then removed), else a plain rename.
void move_into_place(const fs::path& tmp, const fs::path& dir) {
  if (fs::exists(dir)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0)
      TRIAX_THROW(IoError, "{}: cannot exchange it with the new directory {}: {}", dir.string(), tmp.string(),
                  std::strerror(errno));
    std::error_code ec;
    fs::remove_all(tmp, ec);  // now the old contents
  } else if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    TRIAX_THROW(IoError, "{}: cannot rename {} to it: {}", dir.string(), tmp.string(), std::strerror(errno));
  }
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kConfig, ec);
}

GptConfig parse_hf_config(const std::string& json_text, const std::string& where) {
  const json j = parse_json(json_text, where);
  if (!j.is_object()) TRIAX_THROW(ConfigError, "{}: expected a JSON object", where);
  const Keys k(j, where);
  const std::string type = k.string("model_type");
  if (type != "llama")
    TRIAX_THROW(ConfigError, "{}: model_type '{}' is not supported (only 'llama', LlamaForCausalLM)", where, type);
  GptConfig c;
  c.n_embd = k.positive_int("hidden_size");
  c.ffn = k.positive_int("intermediate_size");
  c.n_layer = k.positive_int("num_hidden_layers");
  c.n_head = k.positive_int("num_attention_heads");
  c.n_kv_head = k.positive_int("num_key_value_heads", c.n_head);
  c.vocab = k.positive_int("vocab_size");
  c.max_seq = k.positive_int("max_position_embeddings");
  c.vocab_pad_to = 128;
  c.norm = Norm::rmsnorm;
  c.norm_eps = k.positive_number("rms_norm_eps");
  c.swiglu = true;
  c.positions = PositionEmbedding::rope;
  c.rope_theta = k.positive_number("rope_theta", 10000.0);
  c.rope_scaling = read_rope_scaling(k, j);
  c.tied_embeddings = k.boolean("tie_word_embeddings", false);
  const bool attention_bias = k.boolean("attention_bias", false), mlp_bias = k.boolean("mlp_bias", false);
  if (attention_bias != mlp_bias)
    TRIAX_THROW(ConfigError, "{}: keys 'attention_bias' ({}) and 'mlp_bias' ({}) differ; triax has one switch for "
                "the linear layers' biases", where, attention_bias, mlp_bias);
  c.bias = attention_bias;
  if (k.has("hidden_act") && k.string("hidden_act") != "silu")
    TRIAX_THROW(ConfigError, "{}: key 'hidden_act' is '{}'; only 'silu' (SwiGLU) is supported", where,
                k.string("hidden_act"));
  if (c.n_embd % c.n_head != 0)
    TRIAX_THROW(ConfigError, "{}: hidden_size {} is not divisible by num_attention_heads {}", where, c.n_embd,
                c.n_head);
  if (k.has("head_dim") && k.positive_int("head_dim") != c.n_embd / c.n_head)
    TRIAX_THROW(ConfigError, "{}: key 'head_dim' is {} but hidden_size / num_attention_heads = {}; triax needs them "
                "equal", where, k.positive_int("head_dim"), c.n_embd / c.n_head);
  try {
    c.validate(1);
  } catch (const ConfigError& e) {
    TRIAX_THROW(ConfigError, "{}: {}", where, e.what());
  }
  return c;
}

GptConfig read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / kConfig).string();
  return parse_hf_config(read_text(path), path);
}

void check_hf_llama(const GptConfig& cfg) {
  if (cfg.norm != Norm::rmsnorm)
    TRIAX_THROW(ConfigError, "HF LlamaForCausalLM has no {} (normalization must be RMSNorm)", enum_name(cfg.norm));
  if (!cfg.swiglu)
    TRIAX_THROW(ConfigError, "HF LlamaForCausalLM has no GELU MLP (the MLP must be SwiGLU: --swiglu)");
  if (cfg.positions != PositionEmbedding::rope)
    TRIAX_THROW(ConfigError, "HF LlamaForCausalLM has no {} position embedding (position embedding type must be rope)",
                enum_name(cfg.positions));
}

std::string hf_config_json(const GptConfig& cfg, io::FileDType stored) {
  check_hf_llama(cfg);
  const char* dtype = stored == io::FileDType::bf16 ? "bfloat16" : stored == io::FileDType::f16 ? "float16" : "float32";
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = cfg.n_embd;
  j["intermediate_size"] = cfg.ffn_size();
  j["num_hidden_layers"] = cfg.n_layer;
  j["num_attention_heads"] = cfg.n_head;
  j["num_key_value_heads"] = cfg.kv_heads();
  j["head_dim"] = cfg.head_dim();
  j["vocab_size"] = cfg.vocab;
  j["max_position_embeddings"] = cfg.max_seq;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = cfg.norm_eps;
  j["rope_theta"] = cfg.rope_theta;
  if (cfg.rope_scaling.llama3) {
    const auto& s = cfg.rope_scaling;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_positions}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = cfg.tied_embeddings;
  j["attention_bias"] = cfg.bias;
  j["mlp_bias"] = cfg.bias;
  j["attention_dropout"] = 0.0;
  j["torch_dtype"] = dtype;
  return j.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> hf_param_shapes(const GptConfig& cfg) {
  const int64_t C = cfg.n_embd, F = cfg.ffn_size(), D = cfg.head_dim(), Q = cfg.n_head * D, KV = cfg.kv_heads() * D;
  const bool nb = cfg.norm_kind_has_bias();
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  auto norm = [&](const std::string& p) {
    out.push_back({p + ".weight", {C}});
    if (nb) out.push_back({p + ".bias", {C}});
  };
  auto linear = [&](const std::string& p, int64_t o, int64_t i) {
    out.push_back({p + ".weight", {o, i}});
    if (cfg.bias) out.push_back({p + ".bias", {o}});
  };
  out.push_back({"model.embed_tokens.weight", {cfg.vocab, C}});
  for (int l = 0; l < cfg.n_layer; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    norm(p + "input_layernorm");
    linear(p + "self_attn.q_proj", Q, C);
    linear(p + "self_attn.k_proj", KV, C);
    linear(p + "self_attn.v_proj", KV, C);
    linear(p + "self_attn.o_proj", C, C);
    norm(p + "post_attention_layernorm");
    if (cfg.swiglu) linear(p + "mlp.gate_proj", F, C);
    linear(p + "mlp.up_proj", F, C);
    linear(p + "mlp.down_proj", C, F);
  }
  norm("model.norm");
  if (!cfg.tied_embeddings) out.push_back({"lm_head.weight", {cfg.vocab, C}});
  return out;
}

void load_hf_dir(const std::string& dir, ParamStore& store, const GptConfig& cfg, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    TRIAX_THROW(ConfigError, "tp rank {} of {} is not a valid tensor-parallel position", tp_rank, tp_size);
  check_same_model(dir, read_hf_config(dir), cfg);
  const DirTensors files(dir);
  std::map<std::string, std::vector<int64_t>> expected;
  for (auto& [name, shape] : hf_param_shapes(cfg)) expected.emplace(name, shape);
  for (const auto& [name, file] : files.tensors())
    if (!expected.count(name) && !ignorable_extra(name, cfg))
      TRIAX_THROW(IoError, "{}: tensor '{}' has no place in this model ({}): a file of another model?", file->path(),
                  name, cfg.describe());
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    const std::string& name = info.spec.name;
    const auto it = expected.find(name);
    if (it == expected.end())
      TRIAX_THROW(ConfigError, "parameter '{}' of the model has no place in an HF Llama directory", name);
    const io::SafetensorsReader* f = files.find(name);
    if (!f) TRIAX_THROW(IoError, "{}: missing tensor '{}' (shape {})", dir, name, io::shape_string(it->second));
    f->check_shape(name, it->second);
    auto want = it->second;
    if (is_vocab_param(name)) want[0] = info.spec.full_shape.at(0);
    if (want != info.spec.full_shape)
      TRIAX_THROW(ConfigError, "parameter '{}' has the full shape {} in the store, HF Llama's is {}", name,
                  io::shape_string(info.spec.full_shape), io::shape_string(want));
    const std::vector<float> shard = read_param_shard(*f, info, it->second[0], tp_rank, tp_size);
    if (shard.size() != info.numel)
      TRIAX_THROW(ConfigError, "parameter '{}': the store holds {} elements {} for tp rank {} of {}, the shard has {}",
                  name, info.numel, io::shape_string(info.local_shape), tp_rank, tp_size, shard.size());
    store.param_from_host(i, shard);
  }
  store.refresh_compute_copy();  // the layers read the compute copy (nothing to do without one)
}

void write_hf_dir(const std::string& dir, const GptConfig& cfg, const FullWeights& w, io::FileDType stored) {
  const std::string config = hf_config_json(cfg, stored);  // check_hf_llama
  cfg.validate(1);
  fs::path d = fs::path(dir).lexically_normal();
  if (!d.has_filename() && d.has_parent_path()) d = d.parent_path();  // "out/" -> "out"
  if (d.empty() || !d.has_filename()) TRIAX_THROW(IoError, "'{}' is not a directory name to write a model to", dir);
  if (fs::exists(d)) {
    if (!fs::is_directory(d)) TRIAX_THROW(IoError, "{}: exists and is not a directory", dir);
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string n = e.path().filename().string();
      if (n != kConfig && n != kSingle)
        TRIAX_THROW(IoError, "{}: holds {}, which writing the model would delete; choose a new or empty directory",
                    dir, n);
    }
  }
  std::set<std::string> placed;
  io::SafetensorsWriter wr;
  wr.add_metadata("format", "pt");  // transformers refuses safetensors without it
  wr.add_metadata("writer", "triax");
  for (const auto& [name, shape] : hf_param_shapes(cfg)) {
    const auto it = w.find(name);
    if (it == w.end()) TRIAX_THROW(ConfigError, "parameter '{}' is missing from the weights to write", name);
    int64_t row = 1;
    for (size_t k = 1; k < shape.size(); ++k) row *= shape[k];
    const auto& v = it->second;
    const bool vocab = is_vocab_param(name);
    const bool ok = vocab ? v.size() % static_cast<size_t>(row) == 0 && static_cast<int64_t>(v.size()) >= shape[0] * row
                          : static_cast<int64_t>(v.size()) == shape[0] * row;
    if (!ok)
      TRIAX_THROW(ConfigError, "parameter '{}' has {} values, expected {}{}", name, v.size(),
                  vocab ? "rows >= " : "", io::shape_string(shape));
    wr.add(name, shape, std::span<const float>(v.data(), static_cast<size_t>(shape[0] * row)), stored);
    placed.insert(name);
  }
  for (const auto& [name, v] : w)
    if (!placed.count(name) && !(cfg.tied_embeddings && name == "lm_head.weight"))
      TRIAX_THROW(ConfigError, "parameter '{}' has no place in HF LlamaForCausalLM (names: docs/LLAMA.md)", name);

  const fs::path tmp = d.string() + io::unique_tmp_suffix();
  std::error_code ec;
  if (!fs::create_directory(tmp, ec) || ec)
    TRIAX_THROW(IoError, "{}: cannot create the temporary directory {}: {}", dir, tmp.string(), ec.message());
  try {
    io::AtomicFile cf((tmp / kConfig).string());
    cf.write(std::as_bytes(std::span<const char>(config.data(), config.size())));
    cf.commit();
    wr.write((tmp / kSingle).string());
    move_into_place(tmp, d);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

void save_hf_dir(const std::string& dir, const GptConfig& cfg, const ParamStore& store, Communicator& tp,
                 Communicator& world, io::FileDType stored) {
  check_hf_llama(cfg);  // every rank, before the collective
  const FullWeights w = gather_full_weights(store, tp, world);
  write_on_rank0(world, [&] { write_hf_dir(dir, cfg, w, stored); });
}

void save_hf_dir(const std::string& dir, const GptConfig& cfg, const ParamStore& store, ProcessGrid& grid,
                 io::FileDType stored) {
  save_hf_dir(dir, cfg, store, grid.tp(), grid.world(), stored);
}

}  // namespace triax
