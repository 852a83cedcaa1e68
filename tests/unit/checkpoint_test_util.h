// Test helpers for weight files: a GPT-2 model held in HuggingFace's own layout (Conv1D (in, out)
// matrices, real vocabulary), written with the plain safetensors writer, so the loader under test
// is checked against files it did not produce; and a naive map from HF layout to triax's.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "triax/io/safetensors.h"
#include "triax/model/config.h"

namespace triax::test {

struct HfTensor {
  std::vector<int64_t> shape;  // as HF stores it
  std::vector<float> data;
};
using HfModel = std::map<std::string, HfTensor>;  // names without the "transformer." prefix

inline const char* const kHfLayerParams[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight",
                                             "attn.c_attn.bias",   "attn.c_proj.weight", "attn.c_proj.bias",
                                             "ln_2.weight",        "ln_2.bias",        "mlp.c_fc.weight",
                                             "mlp.c_fc.bias",      "mlp.c_proj.weight", "mlp.c_proj.bias"};

inline bool hf_is_conv1d(const std::string& name) {
  return name.rfind("h.", 0) == 0 && name.ends_with(".weight") && name.find(".ln_") == std::string::npos;
}

// value(tensor ordinal, flat index in the HF layout)
inline HfModel make_hf_model(const GptConfig& c, const std::function<float(int, int64_t)>& value) {
  const int64_t C = c.n_embd, F = c.ffn_size();
  HfModel m;
  int ordinal = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    HfTensor t{shape, std::vector<float>(static_cast<size_t>(n))};
    for (int64_t i = 0; i < n; ++i) t.data[static_cast<size_t>(i)] = value(ordinal, i);
    ++ordinal;
    m[name] = std::move(t);
  };
  add("wte.weight", {c.vocab, C});
  add("wpe.weight", {c.max_seq, C});
  const std::vector<int64_t> shapes[12] = {{C}, {C}, {C, 3 * C}, {3 * C}, {C, C}, {C},
                                           {C}, {C}, {C, F},     {F},     {F, C}, {C}};
  for (int l = 0; l < c.n_layer; ++l)
    for (int i = 0; i < 12; ++i) add(fmt::format("h.{}.{}", l, kHfLayerParams[i]), shapes[i]);
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  return m;
}

// Random values: matrices ~ N(0, std), LayerNorm weights around 1, biases small, all non-zero.
inline HfModel random_hf_model(const GptConfig& c, uint64_t seed, float std = 0.1f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  HfModel m = make_hf_model(c, [](int, int64_t) { return 0.0f; });
  for (auto& [name, t] : m) {
    const bool ln = name.find("ln_") != std::string::npos;
    const bool bias = name.ends_with(".bias");
    for (auto& v : t.data) v = ln && !bias ? 1.0f + 0.2f * n(rng) : bias ? 0.05f * n(rng) : std * n(rng);
  }
  return m;
}

// Writes m as safetensors, names prefixed by `prefix`; extra tensors and metadata as given.
inline void write_hf_file(const std::string& path, const HfModel& m, const std::string& prefix,
                          const std::map<std::string, std::string>& meta = {},
                          const std::map<std::string, HfTensor>& extra = {}) {
  io::SafetensorsWriter w;
  for (const auto& [k, v] : meta) w.add_metadata(k, v);
  for (const auto& [name, t] : m) w.add(prefix + name, t.shape, std::span<const float>(t.data));
  for (const auto& [name, t] : extra) w.add(name, t.shape, std::span<const float>(t.data));
  w.write(path);
}

// The full tensor of triax parameter `name` ("transformer.h.0.attn.c_attn.weight") in triax's
// layout, computed naively from the HF layout: Conv1D transposed, wte padded with zero rows.
inline std::vector<float> triax_layout(const HfModel& m, const std::string& name, int64_t padded_vocab) {
  const std::string hf = name.substr(std::string("transformer.").size());
  const HfTensor& t = m.at(hf);
  if (hf == "wte.weight") {
    std::vector<float> v(static_cast<size_t>(padded_vocab * t.shape[1]), 0.0f);
    std::copy(t.data.begin(), t.data.end(), v.begin());
    return v;
  }
  if (!hf_is_conv1d(hf)) return t.data;
  const int64_t in = t.shape[0], out = t.shape[1];
  std::vector<float> v(t.data.size());
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) v[static_cast<size_t>(o * in + i)] = t.data[static_cast<size_t>(i * out + o)];
  return v;
}

}  // namespace triax::test
