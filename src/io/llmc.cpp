// llm.c GPT-2 checkpoint reader and writer (see llmc.h).
#include "triax/io/llmc.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "triax/core/error.h"
#include "triax/io/atomic_file.h"

namespace triax::io {
namespace {

constexpr uint64_t kHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

// Empty when the config is usable, else what is wrong with it.
std::string config_problem(const LlmcGpt2Config& c) {
  if (c.max_seq_len <= 0 || c.vocab_size <= 0 || c.padded_vocab_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.channels <= 0) {
    return fmt::format(
        "non-positive size in max_seq_len={} vocab_size={} padded_vocab_size={} num_layers={} num_heads={} "
        "channels={}",
        c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers, c.num_heads, c.channels);
  }
  if (c.channels % c.num_heads != 0) {
    return fmt::format("channels={} is not divisible by num_heads={}", c.channels, c.num_heads);
  }
  if (c.padded_vocab_size < c.vocab_size) {
    return fmt::format("padded_vocab_size={} is smaller than vocab_size={}", c.padded_vocab_size, c.vocab_size);
  }
  return {};
}

// Total parameter count, or false when it overflows 64 bits (absurd header values).
bool count_params(const std::vector<NamedShape>& layout, uint64_t& total) {
  total = 0;
  for (const NamedShape& t : layout) {
    uint64_t n = 1;
    for (int64_t d : t.shape)
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
    if (__builtin_add_overflow(total, n, &total)) return false;
  }
  return true;
}

}  // namespace

std::vector<NamedShape> llmc_gpt2_layout(const LlmcGpt2Config& c) {
  const int64_t Vp = c.padded_vocab_size, C = c.channels, T = c.max_seq_len, L = c.num_layers;
  return {
      {"wte", {Vp, C}},           {"wpe", {T, C}},          {"ln1w", {L, C}},          {"ln1b", {L, C}},
      {"qkvw", {L, 3 * C, C}},    {"qkvb", {L, 3 * C}},     {"attprojw", {L, C, C}},   {"attprojb", {L, C}},
      {"ln2w", {L, C}},           {"ln2b", {L, C}},         {"fcw", {L, 4 * C, C}},    {"fcb", {L, 4 * C}},
      {"fcprojw", {L, C, 4 * C}}, {"fcprojb", {L, C}},      {"lnfw", {C}},             {"lnfb", {C}},
  };
}

LlmcGpt2Reader::LlmcGpt2Reader(std::string path) : TensorFile(MappedFile(std::move(path))) {
  const std::string& p = this->path();
  const auto bytes = file().bytes();
  if (bytes.size() < kHeaderBytes) {
    TRIAX_THROW(IoError, "{}: file is {} bytes, shorter than the {}-byte llm.c model header", p, bytes.size(),
                kHeaderBytes);
  }
  int32_t h[kLlmcHeaderInts];
  std::memcpy(h, bytes.data(), kHeaderBytes);
  if (h[0] != kLlmcModelMagic) {
    TRIAX_THROW(IoError, "{}: bad magic {} (expected {} for an llm.c GPT-2 checkpoint{})", p, h[0], kLlmcModelMagic,
                h[0] == kTokenShardMagic ? "; this looks like a token shard" : "");
  }
  if (h[1] != 3 && h[1] != 5) {
    TRIAX_THROW(IoError,
                "{}: unsupported llm.c checkpoint version {} (expected 3 = fp32 or 5 = bf16 parameters with padded "
                "vocab; re-export older files)",
                p, h[1]);
  }
  version_ = h[1];
  config_ = {.max_seq_len = h[2], .vocab_size = h[3], .padded_vocab_size = h[7], .num_layers = h[4],
             .num_heads = h[5], .channels = h[6]};
  if (const std::string bad = config_problem(config_); !bad.empty()) {
    TRIAX_THROW(IoError, "{}: invalid model header: {}", p, bad);
  }
  const auto layout = llmc_gpt2_layout(config_);
  const uint64_t es = file_dtype_size(dtype());
  uint64_t nparams = 0, nbytes = 0, expected = 0;
  if (!count_params(layout, nparams) || __builtin_mul_overflow(nparams, es, &nbytes) ||
      __builtin_add_overflow(nbytes, kHeaderBytes, &expected)) {
    TRIAX_THROW(IoError, "{}: absurd model header (L={} C={} Vp={} maxT={}): the parameter size overflows", p,
                config_.num_layers, config_.channels, config_.padded_vocab_size, config_.max_seq_len);
  }
  if (bytes.size() != expected) {
    TRIAX_THROW(IoError,
                "{}: file is {} bytes but its header (L={} C={} Vp={} maxT={}, {} parameters of {} bytes) needs {}{}",
                p, bytes.size(), config_.num_layers, config_.channels, config_.padded_vocab_size, config_.max_seq_len,
                nparams, es, expected, bytes.size() < expected ? ": truncated" : "");
  }
  std::vector<TensorInfo> tensors;
  uint64_t off = kHeaderBytes;
  for (const NamedShape& t : layout) {
    TensorInfo info;
    info.name = t.name;
    info.dtype = dtype();
    info.shape = t.shape;
    info.offset = off;
    info.nbytes = static_cast<uint64_t>(info.numel()) * es;
    off += info.nbytes;
    tensors.push_back(std::move(info));
  }
  set_tensors(std::move(tensors));
}

LlmcGpt2Writer::LlmcGpt2Writer(LlmcGpt2Config config, FileDType stored) : config_(config), stored_(stored) {
  const std::string bad = config_problem(config_);
  require(bad.empty(), "llm.c checkpoint: invalid config: {}", bad);
  require(stored == FileDType::f32 || stored == FileDType::bf16,
          "llm.c checkpoint: parameters are stored as F32 (version 3) or BF16 (version 5), not {}",
          file_dtype_name(stored));
  layout_ = llmc_gpt2_layout(config_);
  uint64_t total = 0;
  require(count_params(layout_, total), "llm.c checkpoint: the parameter count of the config overflows");
  data_.resize(layout_.size());
  set_.assign(layout_.size(), false);
}

void LlmcGpt2Writer::set(const std::string& name, std::vector<float> data) {
  for (size_t i = 0; i < layout_.size(); ++i) {
    if (layout_[i].name != name) continue;
    uint64_t n = 1;
    for (int64_t d : layout_[i].shape) n *= static_cast<uint64_t>(d);
    require(data.size() == n, "llm.c checkpoint: tensor '{}' of shape {} needs {} values, got {}", name,
            shape_string(layout_[i].shape), n, data.size());
    data_[i] = std::move(data);
    set_[i] = true;
    return;
  }
  TRIAX_THROW(ConfigError, "llm.c checkpoint: no tensor named '{}' (the names are wte, wpe, ln1w, ..., lnfb)", name);
}

void LlmcGpt2Writer::set(const std::string& name, std::span<const float> data) {
  set(name, std::vector<float>(data.begin(), data.end()));
}

void LlmcGpt2Writer::write(const std::string& path) const {
  std::string missing;
  for (size_t i = 0; i < layout_.size(); ++i)
    if (!set_[i]) missing += (missing.empty() ? "" : ", ") + layout_[i].name;
  require(missing.empty(), "llm.c checkpoint {}: tensors not set: {}", path, missing);

  int32_t h[kLlmcHeaderInts] = {};
  h[0] = kLlmcModelMagic;
  h[1] = stored_ == FileDType::bf16 ? 5 : 3;
  h[2] = config_.max_seq_len;
  h[3] = config_.vocab_size;
  h[4] = config_.num_layers;
  h[5] = config_.num_heads;
  h[6] = config_.channels;
  h[7] = config_.padded_vocab_size;
  AtomicFile out(path);
  out.write_values(std::span<const int32_t>(h));
  std::vector<std::byte> buf;
  for (const auto& d : data_) {
    if (stored_ == FileDType::f32) {
      out.write_values(std::span<const float>(d));
      continue;
    }
    constexpr size_t kChunk = size_t{1} << 20;
    for (size_t i = 0; i < d.size(); i += kChunk) {
      const size_t m = std::min(kChunk, d.size() - i);
      buf.resize(m * 2);
      convert_from_float(d.data() + i, m, FileDType::bf16, buf.data());
      out.write(buf);
    }
  }
  out.commit();
}

}  // namespace triax::io
