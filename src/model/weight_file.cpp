// GPT-2 weights <-> safetensors (HF names, Conv1D layout) and llm.c checkpoints, TP-sharded on
// load (each rank reads only its block of each tensor) and gathered over TP and stages on save.
#include "triax/model/weight_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <set>
#include <sstream>

#include "triax/core/error.h"
#include "triax/distributed/grid.h"
#include "triax/io/llmc.h"
#include "triax/io/mapped_file.h"
#include "triax/io/safetensors.h"
#include "triax/model/param_shards.h"

namespace triax {
namespace {

constexpr std::string_view kPrefix = "transformer.";
// Per-layer parameter suffixes, in forward order.
constexpr std::string_view kLayerParams[] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
// llm.c's stacked tensor holding each per-layer parameter (same order as kLayerParams).
constexpr std::string_view kLlmcLayerNames[] = {"ln1w", "ln1b", "qkvw",    "qkvb", "attprojw", "attprojb",
                                                "ln2w", "ln2b", "fcw",     "fcb",  "fcprojw",  "fcprojb"};

// HF GPT-2 stores these as Conv1D: weight (in, out), i.e. the transpose of nn.Linear's (out, in).
bool is_conv1d(std::string_view layer_param) { return layer_param.ends_with(".weight") && !layer_param.starts_with("ln_"); }

// A parameter name split into its parts: "transformer.h.3.attn.c_attn.weight" -> layer 3,
// rest "attn.c_attn.weight"; "transformer.wte.weight" -> layer -1, rest "wte.weight".
struct ParsedName {
  int layer = -1;
  std::string rest;
  int index = -1;  // into kLayerParams for layer parameters
};

std::optional<ParsedName> parse_name(std::string_view name) {
  if (name.starts_with(kPrefix)) name.remove_prefix(kPrefix.size());
  ParsedName p;
  if (name.starts_with("h.")) {
    name.remove_prefix(2);
    const auto dot = name.find('.');
    if (dot == std::string_view::npos || dot == 0) return std::nullopt;
    int l = 0;
    const auto [ptr, ec] = std::from_chars(name.data(), name.data() + dot, l);
    if (ec != std::errc() || ptr != name.data() + dot || l < 0) return std::nullopt;
    p.layer = l;
    p.rest = std::string(name.substr(dot + 1));
    for (int i = 0; i < 12; ++i)
      if (kLayerParams[i] == p.rest) p.index = i;
    return p;
  }
  p.rest = std::string(name);
  return p;
}

std::vector<int64_t> reversed(std::vector<int64_t> s) {
  std::reverse(s.begin(), s.end());
  return s;
}

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Transposes a (rows, cols) row-major block.
std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[static_cast<size_t>(j * rows + i)] = a[static_cast<size_t>(i * cols + j)];
  return t;
}

int parse_positive_int(const std::string& s, const std::string& path, const std::string& key) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v <= 0)
    TRIAX_THROW(IoError, "{}: metadata '{}' is '{}', expected a positive integer", path, key, s);
  return v;
}

WeightFormat sniff_format(const io::MappedFile& f) {
  const auto b = f.bytes();
  if (b.size() >= 4) {
    int32_t magic = 0;
    std::memcpy(&magic, b.data(), 4);
    if (magic == io::kLlmcModelMagic) return WeightFormat::llmc;
    if (magic == io::kTokenShardMagic)
      TRIAX_THROW(IoError, "{}: this is an llm.c token shard (magic {}), not a weight file", f.path(), magic);
  }
  if (b.size() >= 9 && static_cast<char>(b[8]) == '{') return WeightFormat::safetensors;
  TRIAX_THROW(IoError,
              "{}: not a weight file: neither safetensors (8-byte header length, then a JSON header starting "
              "with '{{') nor an llm.c GPT-2 checkpoint (int32 magic {}); the file has {} bytes",
              f.path(), io::kLlmcModelMagic, b.size());
}

}  // namespace

std::string_view weight_format_name(WeightFormat f) { return f == WeightFormat::llmc ? "llm.c" : "safetensors"; }

WeightFormat weight_format_for_path(const std::string& path) {
  return std::string_view(path).ends_with(".bin") ? WeightFormat::llmc : WeightFormat::safetensors;
}

std::optional<int> default_gpt2_heads(int n_embd) {
  switch (n_embd) {
    case 768: return 12;
    case 1024: return 16;
    case 1280: return 20;
    case 1600: return 25;
    default: return std::nullopt;
  }
}

std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_param_shapes(const GptConfig& cfg) {
  const int64_t C = cfg.n_embd, F = cfg.ffn_size(), V = cfg.padded_vocab(1);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"transformer.wte.weight", {V, C}});
  out.push_back({"transformer.wpe.weight", {cfg.max_seq, C}});
  const std::vector<int64_t> shapes[12] = {{C},     {C}, {3 * C, C}, {3 * C}, {C, C}, {C},
                                           {C},     {C}, {F, C},     {F},     {C, F}, {C}};
  for (int l = 0; l < cfg.n_layer; ++l)
    for (int i = 0; i < 12; ++i) out.push_back({fmt::format("transformer.h.{}.{}", l, kLayerParams[i]), shapes[i]});
  out.push_back({"transformer.ln_f.weight", {C}});
  out.push_back({"transformer.ln_f.bias", {C}});
  return out;
}

// ---------------------------------------------------------------- WeightFile

WeightFile::~WeightFile() = default;
WeightFile::WeightFile(WeightFile&&) noexcept = default;
WeightFile& WeightFile::operator=(WeightFile&&) noexcept = default;

const std::string& WeightFile::path() const { return file_->path(); }

WeightFile::WeightFile(const std::string& path, int heads) {
  if (heads < 0) TRIAX_THROW(ConfigError, "number of heads must be positive, got {}", heads);
  format_ = sniff_format(io::MappedFile(path));
  GptConfig c;
  if (format_ == WeightFormat::llmc) {
    auto r = std::make_unique<io::LlmcGpt2Reader>(path);
    const auto& h = r->config();
    c.n_layer = h.num_layers;
    c.n_head = h.num_heads;
    c.n_embd = h.channels;
    c.vocab = h.vocab_size;
    c.max_seq = h.max_seq_len;
    c.ffn = 0;  // llm.c's MLP is always 4C
    if (heads != 0 && heads != c.n_head)
      TRIAX_THROW(ConfigError, "{}: the llm.c header says {} heads but {} were asked for", path, c.n_head, heads);
    file_ = std::move(r);
  } else {
    auto r = std::make_unique<io::SafetensorsReader>(path);
    if (r->contains("transformer.wte.weight")) {
      prefix_ = "transformer.";
    } else if (!r->contains("wte.weight")) {
      TRIAX_THROW(IoError, "{}: no tensor 'transformer.wte.weight' or 'wte.weight': not a GPT-2 checkpoint", path);
    }
    const auto& wte = r->info(prefix_ + "wte.weight");
    if (wte.shape.size() != 2)
      TRIAX_THROW(IoError, "{}: tensor '{}wte.weight' has shape {}, expected (vocab, hidden)", path, prefix_,
                  io::shape_string(wte.shape));
    const auto& wpe = r->info(prefix_ + "wpe.weight");
    if (wpe.shape.size() != 2 || wpe.shape[1] != wte.shape[1])
      TRIAX_THROW(IoError, "{}: tensor '{}wpe.weight' has shape {}, expected (positions, {})", path, prefix_,
                  io::shape_string(wpe.shape), wte.shape[1]);
    // Layers: every "h.<i>." index; they must be 0..L-1 without gaps.
    std::set<int> layers;
    const std::string hp = prefix_ + "h.";
    for (const auto& t : r->tensors()) {
      if (!t.name.starts_with(hp)) continue;
      auto p = parse_name(std::string_view(t.name).substr(prefix_.size()));
      if (!p || p->layer < 0) TRIAX_THROW(IoError, "{}: cannot read a layer number in tensor name '{}'", path, t.name);
      layers.insert(p->layer);
    }
    if (layers.empty()) TRIAX_THROW(IoError, "{}: no transformer layers (no '{}0.*' tensors)", path, hp);
    const int L = *layers.rbegin() + 1;
    for (int l = 0; l < L; ++l)
      if (!layers.count(l))
        TRIAX_THROW(IoError, "{}: layers are not numbered 0..{}: no '{}{}.*' tensors", path, L - 1, hp, l);
    const auto& fc = r->info(hp + "0.mlp.c_fc.weight");
    if (fc.shape.size() != 2 || fc.shape[0] != wte.shape[1])
      TRIAX_THROW(IoError, "{}: tensor '{}0.mlp.c_fc.weight' has shape {}, expected Conv1D ({}, ffn)", path, hp,
                  io::shape_string(fc.shape), wte.shape[1]);
    c.n_layer = L;
    c.n_embd = static_cast<int>(wte.shape[1]);
    c.vocab = static_cast<int>(wte.shape[0]);
    c.max_seq = static_cast<int>(wpe.shape[0]);
    c.ffn = fc.shape[1] == 4 * wte.shape[1] ? 0 : static_cast<int>(fc.shape[1]);
    const auto& meta = r->metadata();
    std::optional<int> meta_heads;
    if (auto it = meta.find("n_head"); it != meta.end()) meta_heads = parse_positive_int(it->second, path, "n_head");
    if (auto it = meta.find("vocab_pad_to"); it != meta.end())
      c.vocab_pad_to = parse_positive_int(it->second, path, "vocab_pad_to");
    if (heads != 0) {
      if (meta_heads && *meta_heads != heads)
        TRIAX_THROW(ConfigError, "{}: the file's metadata says n_head={} but {} heads were asked for", path,
                    *meta_heads, heads);
      c.n_head = heads;
    } else if (meta_heads) {
      c.n_head = *meta_heads;
    } else if (auto d = default_gpt2_heads(c.n_embd)) {
      c.n_head = *d;
    } else {
      TRIAX_THROW(ConfigError,
                  "{}: the file does not say how many attention heads the model has (no 'n_head' metadata) and "
                  "hidden size {} is not a GPT-2 size (768, 1024, 1280, 1600): give the number of heads",
                  path, c.n_embd);
    }
    has_lm_head_ = r->contains("lm_head.weight");
    file_ = std::move(r);
  }
  try {
    c.validate(1);
  } catch (const ConfigError& e) {
    TRIAX_THROW(IoError, "{}: the model in this file is not valid: {}", path, e.what());
  }
  config_ = c;
}

namespace {

// Where one parameter lives in a weight file and how it is stored there.
struct Source {
  std::string tensor;
  int layer = -1;       // llm.c: the row of the stacked per-layer tensor
  bool conv1d = false;  // HF Conv1D: (in, out), the transpose of triax's (out, in)
  std::vector<int64_t> file_shape;
  int64_t real_rows = -1;  // wte: rows past this are padding (zero)
  bool is_wte = false;
};

// The tensor of `file` (in `format`, with the safetensors name prefix `prefix`) that holds the
// store's parameter `info`, its shape checked against the file.
Source locate(const io::TensorFile& file, WeightFormat format, const std::string& prefix, const ParamInfo& info,
              const GptConfig& cfg) {
  const std::string& name = info.spec.name;
  const auto& full = info.spec.full_shape;
  auto parsed = parse_name(name);
  if (!parsed || (parsed->layer >= 0 && parsed->index < 0))
    TRIAX_THROW(ConfigError, "parameter '{}' is not a GPT-2 parameter this loader knows", name);

  Source src;
  src.file_shape = full;
  src.is_wte = parsed->layer < 0 && parsed->rest == "wte.weight";
  if (format == WeightFormat::safetensors) {
    src.tensor = prefix + (parsed->layer >= 0 ? fmt::format("h.{}.{}", parsed->layer, parsed->rest) : parsed->rest);
    src.conv1d = parsed->layer >= 0 && is_conv1d(parsed->rest);
    if (src.conv1d) src.file_shape = reversed(full);
  } else {
    const auto& h = static_cast<const io::LlmcGpt2Reader&>(file).config();
    if (parsed->layer >= 0) {
      src.tensor = kLlmcLayerNames[parsed->index];
      src.layer = parsed->layer;
      src.file_shape.insert(src.file_shape.begin(), h.num_layers);
    } else if (src.is_wte) {
      src.tensor = "wte";
    } else if (parsed->rest == "wpe.weight") {
      src.tensor = "wpe";
    } else if (parsed->rest == "ln_f.weight") {
      src.tensor = "lnfw";
    } else if (parsed->rest == "ln_f.bias") {
      src.tensor = "lnfb";
    } else {
      TRIAX_THROW(ConfigError, "parameter '{}' has no place in an llm.c checkpoint", name);
    }
    if (src.is_wte) src.file_shape[0] = h.padded_vocab_size;
  }
  if (src.is_wte) {
    if (full.size() != 2 || full[0] < cfg.vocab)
      TRIAX_THROW(ConfigError, "parameter '{}' has shape {}, expected (padded vocab >= {}, C)", name,
                  io::shape_string(full), cfg.vocab);
    src.real_rows = cfg.vocab;
    if (format == WeightFormat::safetensors) src.file_shape[0] = cfg.vocab;
  }
  if (!file.contains(src.tensor)) {
    if (format == WeightFormat::safetensors)
      TRIAX_THROW(IoError, "{}: missing tensor '{}' (parameter '{}'; looked for it {} the 'transformer.' prefix)",
                  file.path(), src.tensor, name, prefix.empty() ? "without" : "with");
    TRIAX_THROW(IoError, "{}: missing tensor '{}' (parameter '{}')", file.path(), src.tensor, name);
  }
  file.check_shape(src.tensor, src.file_shape);
  return src;
}

// Reads the block `r` (ranges in triax's (out, in) layout of the full parameter).
std::vector<float> read_block(const io::TensorFile& file, const Source& src, std::vector<io::SliceRange> r) {
  int64_t pad_rows = 0;
  if (src.real_rows >= 0 && r[0].end > src.real_rows) {
    const int64_t keep_end = std::max(r[0].begin, src.real_rows);
    pad_rows = r[0].end - keep_end;
    r[0].end = keep_end;
  }
  std::vector<io::SliceRange> fr = r;
  if (src.conv1d) std::swap(fr[0], fr[1]);  // the file holds (in, out)
  if (src.layer >= 0) fr.insert(fr.begin(), io::SliceRange{src.layer, src.layer + 1});
  std::vector<float> v = file.read_slice(src.tensor, fr);
  if (src.conv1d) v = transpose(v, r[1].end - r[1].begin, r[0].end - r[0].begin);
  if (pad_rows > 0) {
    int64_t row = 1;
    for (size_t d = 1; d < r.size(); ++d) row *= r[d].end - r[d].begin;
    v.resize(v.size() + static_cast<size_t>(pad_rows * row), 0.0f);
  }
  return v;
}

// Tensor-parallel rank tp_rank's shard of the parameter `spec`, read from its source.
std::vector<float> read_shard(const io::TensorFile& file, const Source& src, const ParamSpec& spec, int tp_rank,
                              int tp_size) {
  const auto& full = spec.full_shape;
  std::vector<io::SliceRange> all;
  for (auto d : full) all.push_back({0, d});
  std::vector<float> shard;
  switch (spec.split) {
    case TpSplit::none: shard = read_block(file, src, all); break;
    case TpSplit::rows:
    case TpSplit::cols: {
      const size_t dim = spec.split == TpSplit::rows ? 0 : 1;
      const int64_t n = full[dim] / tp_size;
      auto r = all;
      r[dim] = {tp_rank * n, (tp_rank + 1) * n};
      shard = read_block(file, src, r);
      break;
    }
    case TpSplit::qkv_rows: {
      const int64_t part = full[0] / 3, n = part / tp_size;
      for (int k = 0; k < 3; ++k) {
        auto r = all;
        r[0] = {k * part + tp_rank * n, k * part + (tp_rank + 1) * n};
        auto b = read_block(file, src, r);
        shard.insert(shard.end(), b.begin(), b.end());
      }
      break;
    }
  }
  return shard;
}

}  // namespace

void WeightFile::load(ParamStore& store, const GptConfig& cfg, int tp_rank, int tp_size) const {
  const std::string& path = file_->path();
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    TRIAX_THROW(ConfigError, "tp rank {} of {} is not a valid tensor-parallel position", tp_rank, tp_size);
  const GptConfig& f = config_;
  if (f.n_layer != cfg.n_layer || f.n_embd != cfg.n_embd || f.ffn_size() != cfg.ffn_size() || f.vocab != cfg.vocab ||
      f.max_seq != cfg.max_seq || f.n_head != cfg.n_head)
    TRIAX_THROW(IoError,
                "{}: the file holds a model with layers={} heads={} hidden={} ffn={} vocab={} positions={}, but the "
                "model being loaded has layers={} heads={} hidden={} ffn={} vocab={} positions={}",
                path, f.n_layer, f.n_head, f.n_embd, f.ffn_size(), f.vocab, f.max_seq, cfg.n_layer, cfg.n_head,
                cfg.n_embd, cfg.ffn_size(), cfg.vocab, cfg.max_seq);
  if (!cfg.tied_embeddings)
    TRIAX_THROW(ConfigError, "loading an untied model is not supported: GPT-2 files hold one tied embedding");

  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    const std::string& name = info.spec.name;
    const auto& full = info.spec.full_shape;
    const Source src = locate(*file_, format_, prefix_, info, cfg);
    const std::vector<float> shard = read_shard(*file_, src, info.spec, tp_rank, tp_size);
    // Through the backend's copy: the store's memory may not be host-accessible (a device, the
    // checking backend).
    if (shard.size() != info.numel)
      TRIAX_THROW(ConfigError, "parameter '{}': the store holds {} elements {} for tp rank {} of {}, the shard has {}",
                  name, info.numel, io::shape_string(info.local_shape), tp_rank, tp_size, shard.size());
    store.param_from_host(i, shard);

    if (src.is_wte && has_lm_head_) {
      // A file may carry the tied head explicitly; triax ties it, so it must equal wte.
      file_->check_shape("lm_head.weight", {cfg.vocab, full[1]});
      const int64_t n = info.spec.split == TpSplit::rows ? full[0] / tp_size : full[0];
      const int64_t r0 = info.spec.split == TpSplit::rows ? tp_rank * n : 0;
      const int64_t r1 = std::min<int64_t>(r0 + n, cfg.vocab);
      if (r1 > r0) {
        const auto head = file_->read_rows("lm_head.weight", r0, r1);
        if (!std::equal(head.begin(), head.end(), shard.begin()))
          TRIAX_THROW(IoError,
                      "{}: 'lm_head.weight' differs from '{}wte.weight': triax ties the LM head to the token "
                      "embedding and cannot load an untied model",
                      path, prefix_);
      }
    }
  }
  store.refresh_compute_copy();  // the layers read the compute copy (nothing to do without one)
}

// ---------------------------------------------------------------- writing

namespace {

const std::vector<float>& need(const FullWeights& w, const std::string& name, int64_t numel) {
  auto it = w.find(name);
  if (it == w.end()) TRIAX_THROW(ConfigError, "parameter '{}' is missing from the weights to write", name);
  if (numel >= 0 && static_cast<int64_t>(it->second.size()) != numel)
    TRIAX_THROW(ConfigError, "parameter '{}' has {} values, expected {}", name, it->second.size(), numel);
  return it->second;
}

// wte with any padded row count >= vocab: returns the real rows.
std::vector<float> real_wte(const GptConfig& cfg, const FullWeights& w, int64_t rows) {
  const auto& v = need(w, "transformer.wte.weight", -1);
  const int64_t C = cfg.n_embd;
  if (v.size() % static_cast<size_t>(C) != 0 || static_cast<int64_t>(v.size()) / C < cfg.vocab)
    TRIAX_THROW(ConfigError, "parameter 'transformer.wte.weight' has {} values, expected (rows >= {}) x {}", v.size(),
                cfg.vocab, C);
  std::vector<float> out(static_cast<size_t>(rows * C), 0.0f);
  std::copy_n(v.begin(), cfg.vocab * C, out.begin());
  return out;
}

}  // namespace

void write_hf_safetensors(const std::string& path, const GptConfig& cfg, const FullWeights& w,
                          io::FileDType stored) {
  cfg.validate(1);
  if (!cfg.tied_embeddings) TRIAX_THROW(ConfigError, "writing an untied model is not supported");
  io::SafetensorsWriter wr;
  wr.add_metadata("format", "pt");  // transformers refuses safetensors without it
  wr.add_metadata("writer", "triax");
  wr.add_metadata("n_layer", std::to_string(cfg.n_layer));
  wr.add_metadata("n_head", std::to_string(cfg.n_head));
  wr.add_metadata("n_embd", std::to_string(cfg.n_embd));
  wr.add_metadata("n_inner", std::to_string(cfg.ffn_size()));
  wr.add_metadata("vocab_size", std::to_string(cfg.vocab));
  wr.add_metadata("n_positions", std::to_string(cfg.max_seq));
  wr.add_metadata("vocab_pad_to", std::to_string(cfg.vocab_pad_to));
  for (const auto& [name, shape] : gpt_param_shapes(cfg)) {
    auto p = parse_name(name);
    if (p->layer < 0 && p->rest == "wte.weight") {
      wr.add(name, {cfg.vocab, cfg.n_embd}, real_wte(cfg, w, cfg.vocab), stored);
      continue;
    }
    const auto& v = need(w, name, numel_of(shape));
    if (p->layer >= 0 && is_conv1d(p->rest)) {
      wr.add(name, reversed(shape), transpose(v, shape[0], shape[1]), stored);
    } else {
      wr.add(name, shape, std::span<const float>(v), stored);
    }
  }
  wr.write(path);
}

void write_llmc_checkpoint(const std::string& path, const GptConfig& cfg, const FullWeights& w,
                           io::FileDType stored) {
  cfg.validate(1);
  if (cfg.ffn_size() != 4 * cfg.n_embd)
    TRIAX_THROW(ConfigError, "llm.c checkpoints fix the MLP at 4*C = {}; this model has ffn {}", 4 * cfg.n_embd,
                cfg.ffn_size());
  if (!cfg.tied_embeddings) TRIAX_THROW(ConfigError, "writing an untied model is not supported");
  io::LlmcGpt2Config h;
  h.max_seq_len = cfg.max_seq;
  h.vocab_size = cfg.vocab;
  h.padded_vocab_size = (cfg.vocab + 127) / 128 * 128;  // llm.c pads to 128
  h.num_layers = cfg.n_layer;
  h.num_heads = cfg.n_head;
  h.channels = cfg.n_embd;
  io::LlmcGpt2Writer wr(h, stored);
  wr.set("wte", real_wte(cfg, w, h.padded_vocab_size));
  wr.set("wpe", need(w, "transformer.wpe.weight", int64_t(cfg.max_seq) * cfg.n_embd));
  wr.set("lnfw", need(w, "transformer.ln_f.weight", cfg.n_embd));
  wr.set("lnfb", need(w, "transformer.ln_f.bias", cfg.n_embd));
  const auto shapes = gpt_param_shapes(cfg);
  for (int i = 0; i < 12; ++i) {
    std::vector<float> stacked;
    for (int l = 0; l < cfg.n_layer; ++l) {
      const std::string name = fmt::format("transformer.h.{}.{}", l, kLayerParams[i]);
      const auto& shape = shapes[2 + static_cast<size_t>(l) * 12 + static_cast<size_t>(i)].second;
      const auto& v = need(w, name, numel_of(shape));
      stacked.insert(stacked.end(), v.begin(), v.end());
    }
    wr.set(std::string(kLlmcLayerNames[i]), std::move(stacked));
  }
  wr.write(path);
}

FullWeights gather_full_weights(const ParamStore& store, Communicator& tp, Communicator& world) {
  // Any backend, host-accessible or not.
  return gather_full_tensors(store, tp, world, [&](size_t i) { return store.param_to_host(i); });
}

FullWeights gather_full_tensors(const ParamStore& store, Communicator& tp, Communicator& world,
                                const std::function<std::vector<float>(size_t)>& local_of) {
  // 1. Full tensors of this stage, kept on TP rank 0 (every TP rank takes part in the gathers).
  std::vector<std::pair<std::string, std::vector<float>>> mine;
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    const std::vector<float> local = local_of(i);
    if (local.size() != info.numel)
      TRIAX_THROW(ConfigError, "parameter '{}': {} local values, the store holds {}", info.spec.name, local.size(),
                  info.numel);
    std::vector<float> full;
    if (info.spec.split == TpSplit::none || tp.size() == 1) {
      full.assign(local.begin(), local.end());
    } else {
      std::vector<float> all(local.size() * static_cast<size_t>(tp.size()));
      tp.all_gather(std::span<const float>(local), std::span<float>(all)).wait();
      full.assign(static_cast<size_t>(numel_of(info.spec.full_shape)), 0.0f);
      for (int r = 0; r < tp.size(); ++r)
        place_shard(std::span<const float>(all).subspan(static_cast<size_t>(r) * local.size(), local.size()), full,
                    info.spec.full_shape, info.spec.split, r, tp.size());
    }
    if (tp.rank() == 0) mine.emplace_back(info.spec.name, std::move(full));
  }
  // 2. Every rank learns every rank's list of names and sizes, so all agree on which rank
  // sends which tensor (the lowest world rank holding a name) without another round.
  std::string manifest;
  for (const auto& [name, v] : mine) manifest += fmt::format("{} {}\n", name, v.size());
  int64_t len[1] = {static_cast<int64_t>(manifest.size())};
  std::vector<int64_t> lens(static_cast<size_t>(world.size()));
  world.all_gather(std::span<const int64_t>(len), std::span<int64_t>(lens)).wait();
  const int64_t maxlen = std::max<int64_t>(1, *std::max_element(lens.begin(), lens.end()));
  std::vector<char> mbuf(static_cast<size_t>(maxlen), '\0');
  std::copy(manifest.begin(), manifest.end(), mbuf.begin());
  std::vector<char> all(static_cast<size_t>(maxlen) * static_cast<size_t>(world.size()));
  world.all_gather(std::span<const char>(mbuf), std::span<char>(all)).wait();

  struct Entry {
    int rank;
    std::string name;
    size_t numel;
    size_t local_index;  // in the sender's list
  };
  std::vector<Entry> chosen;
  std::set<std::string> seen;
  for (int r = 0; r < world.size(); ++r) {
    std::istringstream in(std::string(all.data() + static_cast<size_t>(r) * maxlen, static_cast<size_t>(lens[r])));
    std::string name;
    size_t n = 0, k = 0;
    while (in >> name >> n) {
      if (seen.insert(name).second) chosen.push_back({r, name, n, k});
      ++k;
    }
  }
  // 3. Point-to-point to world rank 0, in the agreed order (MPI keeps the order per pair).
  FullWeights out;
  constexpr int kTag = 0x5a7e;
  for (const auto& e : chosen) {
    if (world.rank() == 0) {
      if (e.rank == 0) {
        out[e.name] = std::move(mine[e.local_index].second);
      } else {
        std::vector<float> v(e.numel);
        world.recv(std::span<float>(v), e.rank, kTag).wait();
        out[e.name] = std::move(v);
      }
    } else if (e.rank == world.rank()) {
      world.send(std::span<const float>(mine[e.local_index].second), 0, kTag).wait();
    }
  }
  return out;
}

void write_on_rank0(Communicator& world, const std::function<void()>& write) {
  // Rank 0 writes; every rank then throws what rank 0 threw, so a job never half-fails.
  int status[2] = {0, 0};  // kind (0 ok, 1 IoError, 2 ConfigError, 3 other), message length
  std::string msg;
  if (world.rank() == 0) {
    try {
      write();
    } catch (const IoError& e) {
      status[0] = 1;
      msg = e.what();
    } catch (const ConfigError& e) {
      status[0] = 2;
      msg = e.what();
    } catch (const std::exception& e) {
      status[0] = 3;
      msg = e.what();
    }
    status[1] = static_cast<int>(msg.size());
  }
  world.broadcast(std::span<int>(status), 0).wait();
  if (status[0] == 0) return;
  msg.resize(static_cast<size_t>(status[1]));
  world.broadcast(std::span<char>(msg.data(), msg.size()), 0).wait();
  if (world.rank() != 0) msg = fmt::format("(world rank 0 writing the weights) {}", msg);
  if (status[0] == 1) throw IoError(msg);
  if (status[0] == 2) throw ConfigError(msg);
  throw Error(msg);
}

void save_weights(const std::string& path, WeightFormat format, const GptConfig& cfg, const ParamStore& store,
                  Communicator& tp, Communicator& world, io::FileDType stored) {
  const FullWeights w = gather_full_weights(store, tp, world);
  write_on_rank0(world, [&] {
    if (format == WeightFormat::llmc)
      write_llmc_checkpoint(path, cfg, w, stored);
    else
      write_hf_safetensors(path, cfg, w, stored);
  });
}

void save_weights(const std::string& path, WeightFormat format, const GptConfig& cfg, const ParamStore& store,
                  ProcessGrid& grid, io::FileDType stored) {
  save_weights(path, format, cfg, store, grid.tp(), grid.world(), stored);
}

}  // namespace triax
