// HF Llama model directories: config.json read into a GptConfig (every bad or missing key named
// with the file), written back and read again unchanged; a store saved as a directory and loaded
// back exactly (tp 1 and each rank of tp 2, f32 and bf16, single file and sharded index); every
// malformed directory an error naming the file and the tensor. The store is registered here by
// the documented names and splits (docs/LLAMA.md), independent of the model code.
#include <catch2/catch.hpp>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "unit/io_test_util.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/safetensors.h"
#include "triax/model/hf_dir.h"
#include "triax/model/param_shards.h"
#include "support/llama_checks.h"

using namespace triax;
using Catch::Matchers::Contains;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

json good_config() {
  return json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", 64},
              {"intermediate_size", 176},
              {"num_hidden_layers", 3},
              {"num_attention_heads", 8},
              {"num_key_value_heads", 4},
              {"vocab_size", 300},
              {"max_position_embeddings", 128},
              {"rms_norm_eps", 1e-6},
              {"rope_theta", 500000.0},
              {"rope_scaling",
               {{"rope_type", "llama3"},
                {"factor", 8},
                {"low_freq_factor", 1.0},
                {"high_freq_factor", 4.0},
                {"original_max_position_embeddings", 32}}},
              {"tie_word_embeddings", false},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"hidden_act", "silu"},
              {"head_dim", 8},
              {"torch_dtype", "bfloat16"}};
}

void write_config(const test::TempDir& d, const json& j) { test::write_bytes(d.file("config.json"), j.dump()); }

// The message of the ConfigError read_hf_config throws (fails the test if it throws nothing).
std::string config_error(const json& j) {
  test::TempDir d;
  write_config(d, j);
  try {
    (void)read_hf_config(d.path().string());
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("read_hf_config accepted " << j.dump());
  return {};
}

GptConfig llama(int layers, bool tied) {
  GptConfig c = GptConfig::preset("llama-nano");  // H8 KV4 C32 F48 V67
  c.n_layer = layers;
  c.tied_embeddings = tied;
  c.vocab_pad_to = 128;
  return c;
}

TpSplit split_of(const std::string& name) {
  const auto ends = [&](const char* s) { return name.ends_with(s); };
  if (ends("embed_tokens.weight") || name == "lm_head.weight") return TpSplit::rows;
  if (ends("o_proj.weight") || ends("down_proj.weight")) return TpSplit::cols;
  if (ends("layernorm.weight") || name == "model.norm.weight" || ends("o_proj.bias") || ends("down_proj.bias"))
    return TpSplit::none;
  return TpSplit::rows;  // q, k, v, gate, up (weights and biases)
}

// A store of the whole model for tp rank r of tp, registered by the documented names and splits.
struct Store {
  ParamStore store;
  Store(const GptConfig& cfg, int tp) {
    for (auto [name, shape] : hf_param_shapes(cfg)) {
      if (name.ends_with("embed_tokens.weight") || name == "lm_head.weight") shape[0] = cfg.padded_vocab(tp);
      ParamSpec s{name, shape, split_of(name)};
      store.add(s, shard_shape(shape, s.split, tp, name));
    }
    store.finalize();
  }
};

// bf16-exact integers in [-127, 127], a different pattern per tensor; vocabulary rows past the real vocabulary are zero.
FullWeights formula_weights(const GptConfig& cfg, int tp) {
  FullWeights w;
  int ordinal = 1;
  for (auto [name, shape] : hf_param_shapes(cfg)) {
    const int64_t real_rows = shape[0];
    if (name.ends_with("embed_tokens.weight") || name == "lm_head.weight") shape[0] = cfg.padded_vocab(tp);
    int64_t n = 1, row = 1;
    for (auto d : shape) n *= d;
    for (size_t k = 1; k < shape.size(); ++k) row *= shape[k];
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      v[static_cast<size_t>(i)] = i / row < real_rows ? static_cast<float>((i * 7 + ordinal * 13) % 255 - 127) : 0.0f;
    w[name] = std::move(v);
    ++ordinal;
  }
  return w;
}

void fill(ParamStore& s, const FullWeights& w, int rank, int tp) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& info = s.info(i);
    s.param_from_host(i, shard_of(w.at(info.spec.name), info.spec.full_shape, info.spec.split, rank, tp));
  }
}

void check_loaded(const ParamStore& s, const FullWeights& w, int rank, int tp) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& info = s.info(i);
    INFO(info.spec.name << " tp rank " << rank << " of " << tp);
    CHECK(s.param_to_host(i) == shard_of(w.at(info.spec.name), info.spec.full_shape, info.spec.split, rank, tp));
  }
}

std::string load_error(const std::string& dir, const GptConfig& cfg) {
  Store s(cfg, 1);
  try {
    load_hf_dir(dir, s.store, cfg, 0, 1);
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("load_hf_dir accepted " << dir);
  return {};
}

// Rewrites DIR/model.safetensors with `edit` applied to its tensors (name -> (shape, values)).
void rewrite(const std::string& dir, const std::function<void(std::map<std::string, std::pair<io::Shape,
                                                                       std::vector<float>>>&)>& edit) {
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  std::map<std::string, std::pair<io::Shape, std::vector<float>>> t;
  {
    io::SafetensorsReader r(path);
    for (const auto& e : r.tensors()) t[e.name] = {e.shape, r.read(e.name)};
  }
  edit(t);
  io::SafetensorsWriter wr;
  wr.add_metadata("format", "pt");
  for (auto& [name, sv] : t) wr.add(name, sv.first, sv.second);
  wr.write(path);
}

}  // namespace

TEST_CASE("read_hf_config reads a LlamaForCausalLM config.json") {
  test::TempDir d;
  write_config(d, good_config());
  CHECK(is_hf_dir(d.path().string()));
  CHECK_FALSE(is_hf_dir(d.file("config.json")));
  CHECK_FALSE(is_hf_dir(d.file("nothing")));
  const GptConfig c = read_hf_config(d.path().string());
  CHECK(c.n_embd == 64);
  CHECK(c.ffn_size() == 176);
  CHECK(c.n_layer == 3);
  CHECK(c.n_head == 8);
  CHECK(c.vocab == 300);
  CHECK(c.padded_vocab(1) == 384);
  CHECK(c.max_seq == 128);
  test::check_llama_block(c, {.kv_heads = 4, .norm_eps = 1e-6, .rope_theta = 500000.0,
                              .rope_scaling = {true, 8.0, 1.0, 4.0, 32}, .tied_embeddings = false});
  CHECK_FALSE(c.is_gpt2());

  SECTION("optional keys take HF's defaults") {
    json j = good_config();
    for (const char* k : {"num_key_value_heads", "rope_theta", "rope_scaling", "tie_word_embeddings", "attention_bias",
                          "mlp_bias", "hidden_act", "head_dim"})
      j.erase(k);
    const GptConfig o = parse_hf_config(j.dump(), "x");
    CHECK(o.kv_heads() == 8);
    CHECK(o.rope_theta == 10000.0);
    CHECK_FALSE(o.rope_scaling.llama3);
    CHECK_FALSE(o.tied_embeddings);
    CHECK_FALSE(o.bias);
  }
  SECTION("null rope_scaling, rope_type default, the old 'type' key, biases and a tied head") {
    json j = good_config();
    j["rope_scaling"] = nullptr;
    CHECK_FALSE(parse_hf_config(j.dump(), "x").rope_scaling.llama3);
    j["rope_scaling"] = {{"rope_type", "default"}};
    CHECK_FALSE(parse_hf_config(j.dump(), "x").rope_scaling.llama3);
    j["rope_scaling"] = good_config()["rope_scaling"];
    j["rope_scaling"].erase("rope_type");
    j["rope_scaling"]["type"] = "llama3";
    CHECK(parse_hf_config(j.dump(), "x").rope_scaling.llama3);
    j["attention_bias"] = true;
    j["mlp_bias"] = true;
    j["tie_word_embeddings"] = true;
    const GptConfig o = parse_hf_config(j.dump(), "x");
    CHECK(o.bias);
    CHECK(o.tied_embeddings);
  }
}

TEST_CASE("read_hf_config names the file and the key of every missing or bad value") {
  for (const char* key : {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                          "vocab_size", "max_position_embeddings", "rms_norm_eps"}) {
    json j = good_config();
    j.erase(key);
    const std::string e = config_error(j);
    INFO(e);
    CHECK_THAT(e, Contains("config.json") && Contains("missing key") && Contains(key));
  }
  const std::vector<std::pair<const char*, json>> bad = {
      {"hidden_size", "64"},          {"hidden_size", 64.5},        {"num_hidden_layers", 0},
      {"num_attention_heads", -8},    {"num_key_value_heads", "4"}, {"vocab_size", true},
      {"rms_norm_eps", 0},            {"rms_norm_eps", "1e-5"},     {"rope_theta", -1.0},
      {"tie_word_embeddings", "yes"}, {"attention_bias", 0},        {"intermediate_size", json::array()},
      {"max_position_embeddings", 1.0}};
  for (const auto& [key, value] : bad) {
    json j = good_config();
    j[key] = value;
    const std::string e = config_error(j);
    INFO(key << " = " << value.dump() << ": " << e);
    CHECK_THAT(e, Contains("config.json") && Contains(std::string("'") + key + "'"));
  }
  SECTION("rope_scaling") {
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      json j = good_config();
      j["rope_scaling"].erase(key);
      CHECK_THAT(config_error(j), Contains("rope_scaling") && Contains(key));
    }
    json j = good_config();
    j["rope_scaling"]["rope_type"] = "yarn";
    CHECK_THAT(config_error(j), Contains("rope_type") && Contains("yarn") && Contains("llama3"));
    j["rope_scaling"] = "llama3";
    CHECK_THAT(config_error(j), Contains("rope_scaling"));
  }
  SECTION("what triax cannot express") {
    json j = good_config();
    j["hidden_act"] = "gelu";
    CHECK_THAT(config_error(j), Contains("hidden_act") && Contains("gelu"));
    j = good_config();
    j["head_dim"] = 16;
    CHECK_THAT(config_error(j), Contains("head_dim") && Contains("16"));
    j = good_config();
    j["attention_bias"] = true;
    CHECK_THAT(config_error(j), Contains("attention_bias") && Contains("mlp_bias"));
    j = good_config();
    j["model_type"] = "gpt2";
    CHECK_THAT(config_error(j), Contains("model_type") && Contains("gpt2"));
    j = good_config();
    j["num_key_value_heads"] = 3;  // 8 heads do not group over 3
    CHECK_THAT(config_error(j), Contains("config.json") && Contains("key/value heads"));
  }
  SECTION("not JSON, or no file") {
    test::TempDir d;
    test::write_bytes(d.file("config.json"), "{\"hidden_size\": ");
    CHECK_THROWS_AS(read_hf_config(d.path().string()), IoError);
    CHECK_THROWS_WITH(read_hf_config(d.path().string()), Contains("config.json") && Contains("JSON"));
    CHECK_THROWS_AS(read_hf_config(d.file("nowhere")), IoError);
  }
}

TEST_CASE("config.json written for a model reads back as the same model") {
  for (const char* preset : {"llama-nano", "llama3.2-1b", "llama3-8b"}) {
    GptConfig c = GptConfig::preset(preset);
    c.vocab_pad_to = 128;
    c.norm_eps = 1e-6;
    const std::string text = hf_config_json(c, io::FileDType::bf16);
    const json j = json::parse(text);
    CHECK(j["architectures"][0] == "LlamaForCausalLM");
    CHECK(j["torch_dtype"] == "bfloat16");
    CHECK(j["head_dim"] == c.head_dim());
    const GptConfig b = parse_hf_config(text, preset);
    INFO(preset);
    CHECK(b.describe() == c.describe());
    CHECK(b.norm_eps == c.norm_eps);
    CHECK(b.rope_theta == c.rope_theta);
    CHECK(b.rope_scaling.llama3 == c.rope_scaling.llama3);
    CHECK(b.rope_scaling.factor == c.rope_scaling.factor);
    CHECK(b.rope_scaling.original_max_positions == c.rope_scaling.original_max_positions);
    CHECK(b.rope_inv_freq() == c.rope_inv_freq());
  }
  GptConfig g = GptConfig::preset("nano");  // GPT-2: LayerNorm, GELU, learned positions
  CHECK_THROWS_WITH(hf_config_json(g, io::FileDType::f32), Contains("LayerNorm"));
  g.norm = Norm::rmsnorm;
  CHECK_THROWS_WITH(hf_config_json(g, io::FileDType::f32), Contains("SwiGLU"));
  g.swiglu = true;
  CHECK_THROWS_WITH(hf_config_json(g, io::FileDType::f32), Contains("learned_absolute"));
}

TEST_CASE("a store saved as an HF directory loads back exactly, whole and per TP rank") {
  const bool tied = GENERATE(false, true);
  const auto stored = GENERATE(io::FileDType::f32, io::FileDType::bf16, io::FileDType::f16);
  const GptConfig cfg = llama(2, tied);
  const FullWeights w = formula_weights(cfg, 1);
  test::TempDir d;
  const std::string dir = d.file("model");
  write_hf_dir(dir, cfg, w, stored);
  CHECK(fs::exists(fs::path(dir) / "config.json"));
  CHECK(read_hf_config(dir).describe() == cfg.describe());
  {
    io::SafetensorsReader r(dir + "/model.safetensors");
    CHECK(r.metadata().at("format") == "pt");
    CHECK(r.info("model.embed_tokens.weight").shape == io::Shape{cfg.vocab, cfg.n_embd});
    CHECK(r.info("model.embed_tokens.weight").dtype == stored);
    CHECK(r.contains("lm_head.weight") == !tied);
    CHECK(r.tensors().size() == hf_param_shapes(cfg).size());
  }
  for (int tp : {1, 2, 4}) {
    const FullWeights wt = formula_weights(cfg, tp);
    for (int rank = 0; rank < tp; ++rank) {
      Store s(cfg, tp);
      load_hf_dir(dir, s.store, cfg, rank, tp);
      check_loaded(s.store, wt, rank, tp);
    }
  }
  // Written again through the collective (one rank): the same bytes.
  Store s(cfg, 1);
  fill(s.store, w, 0, 1);
  auto tp = make_self_communicator("tp", 0), world = make_self_communicator("world", 0);
  const std::string again = d.file("again");
  save_hf_dir(again, cfg, s.store, *tp, *world, stored);
  CHECK(test::read_bytes(again + "/model.safetensors") == test::read_bytes(dir + "/model.safetensors"));
  CHECK(test::read_bytes(again + "/config.json") == test::read_bytes(dir + "/config.json"));
}

TEST_CASE("a sharded model.safetensors.index.json directory loads like one file") {
  const GptConfig cfg = llama(2, false);
  const FullWeights w = formula_weights(cfg, 1);
  test::TempDir d;
  const std::string dir = d.file("sharded");
  fs::create_directories(dir);
  test::write_bytes(dir + "/config.json", hf_config_json(cfg, io::FileDType::bf16));
  io::SafetensorsWriter a, b;
  json map;
  int k = 0;
  for (const auto& [name, shape] : hf_param_shapes(cfg)) {
    int64_t n = 1;
    for (auto x : shape) n *= x;
    const std::vector<float> v(w.at(name).begin(), w.at(name).begin() + n);
    const bool first = k++ % 2 == 0;
    (first ? a : b).add(name, shape, v, io::FileDType::bf16);
    map[name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  b.add("model.layers.0.self_attn.rotary_emb.inv_freq", {4}, std::vector<float>{1, 2, 3, 4});
  map["model.layers.0.self_attn.rotary_emb.inv_freq"] = "model-00002-of-00002.safetensors";
  a.write(dir + "/model-00001-of-00002.safetensors");
  b.write(dir + "/model-00002-of-00002.safetensors");
  json index{{"metadata", {{"total_size", 0}}}, {"weight_map", map}};
  test::write_bytes(dir + "/model.safetensors.index.json", index.dump());
  for (int rank = 0; rank < 2; ++rank) {
    Store s(cfg, 2);
    load_hf_dir(dir, s.store, cfg, rank, 2);
    check_loaded(s.store, formula_weights(cfg, 2), rank, 2);
  }
  SECTION("the index names a tensor its shard does not hold") {
    index["weight_map"]["model.norm.weight"] = index["weight_map"]["model.norm.weight"] == "model-00001-of-00002.safetensors"
                                                   ? "model-00002-of-00002.safetensors"
                                                   : "model-00001-of-00002.safetensors";
    test::write_bytes(dir + "/model.safetensors.index.json", index.dump());
    CHECK_THAT(load_error(dir, cfg), Contains("model.norm.weight") && Contains("does not hold it"));
  }
  SECTION("a shard holds a tensor the index does not name") {
    index["weight_map"].erase("model.norm.weight");
    test::write_bytes(dir + "/model.safetensors.index.json", index.dump());
    CHECK_THAT(load_error(dir, cfg), Contains("model.norm.weight") && Contains("weight_map"));
  }
}

TEST_CASE("loading a wrong HF directory names the file and the tensor") {
  const GptConfig cfg = llama(2, false);
  test::TempDir d;
  const std::string dir = d.file("m");
  write_hf_dir(dir, cfg, formula_weights(cfg, 1));
  SECTION("a missing tensor") {
    rewrite(dir, [](auto& t) { t.erase("model.layers.1.mlp.gate_proj.weight"); });
    CHECK_THAT(load_error(dir, cfg), Contains("missing tensor 'model.layers.1.mlp.gate_proj.weight'"));
  }
  SECTION("a wrong shape") {
    rewrite(dir, [](auto& t) {
      auto& [shape, v] = t.at("model.layers.0.self_attn.k_proj.weight");
      shape = {shape[1], shape[0]};
    });
    CHECK_THAT(load_error(dir, cfg), Contains("model.safetensors") && Contains("k_proj.weight") &&
                                         Contains("[32, 16]") && Contains("[16, 32]"));
  }
  SECTION("a tensor of another model") {
    rewrite(dir, [](auto& t) { t["model.layers.2.mlp.up_proj.weight"] = {{2}, {1.0f, 2.0f}}; });
    CHECK_THAT(load_error(dir, cfg), Contains("model.layers.2.mlp.up_proj.weight") && Contains("no place"));
  }
  SECTION("rotary buffers are ignored, and a tied model's lm_head") {
    rewrite(dir, [](auto& t) { t["model.layers.0.self_attn.rotary_emb.inv_freq"] = {{2}, {1.0f, 2.0f}}; });
    Store s(cfg, 1);
    CHECK_NOTHROW(load_hf_dir(dir, s.store, cfg, 0, 1));
    const GptConfig tied = llama(2, true);
    const std::string td = d.file("tied");
    write_hf_dir(td, tied, formula_weights(tied, 1));
    rewrite(td, [&](auto& t) { t["lm_head.weight"] = t.at("model.embed_tokens.weight"); });
    Store st(tied, 1);
    CHECK_NOTHROW(load_hf_dir(td, st.store, tied, 0, 1));
    check_loaded(st.store, formula_weights(tied, 1), 0, 1);
  }
  SECTION("config.json describes another model") {
    GptConfig other = cfg;
    other.n_kv_head = 2;
    CHECK_THAT(load_error(dir, other), Contains("config.json describes") && Contains("kv_heads=4") &&
                                           Contains("kv_heads=2"));
  }
  SECTION("no weights") {
    fs::remove(fs::path(dir) / "model.safetensors");
    CHECK_THAT(load_error(dir, cfg), Contains("model.safetensors.index.json"));
  }
}

TEST_CASE("writing an HF directory replaces only a model directory, and nothing half-written stays") {
  const GptConfig cfg = llama(1, false);
  const FullWeights w = formula_weights(cfg, 1);
  test::TempDir d;
  const std::string dir = d.file("out");
  write_hf_dir(dir, cfg, w);
  const std::string before = test::read_bytes(dir + "/model.safetensors");
  FullWeights w2 = w;
  w2.at("model.norm.weight")[0] = 12345.0f;
  write_hf_dir(dir + "/", cfg, w2);  // replaced (a trailing slash is the same directory)
  CHECK(test::read_bytes(dir + "/model.safetensors") != before);
  Store s(cfg, 1);
  load_hf_dir(dir, s.store, cfg, 0, 1);
  CHECK(s.store.param_to_host(s.store.find("model.norm.weight"))[0] == 12345.0f);

  test::write_bytes(dir + "/tokenizer.json", "{}");
  CHECK_THROWS_WITH(write_hf_dir(dir, cfg, w), Contains("tokenizer.json"));
  FullWeights missing = w;
  missing.erase("model.layers.0.mlp.down_proj.weight");
  CHECK_THROWS_WITH(write_hf_dir(d.file("x"), cfg, missing), Contains("model.layers.0.mlp.down_proj.weight"));
  FullWeights extra = w;
  extra["model.layers.0.mlp.experts.0.weight"] = {1.0f};
  CHECK_THROWS_WITH(write_hf_dir(d.file("y"), cfg, extra), Contains("experts.0") && Contains("no place"));
  // Only `out` (with the stray tokenizer) is left: no temporary directories, no failed outputs.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(d.path())) {
    INFO(e.path());
    CHECK(e.path().filename() == "out");
    ++entries;
  }
  CHECK(entries == 1);
}
