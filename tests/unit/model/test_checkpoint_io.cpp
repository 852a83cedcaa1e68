// Weight files <-> ParamStore on one rank: a hand-made HF (Conv1D) file lands in the right
// places, save -> load round trips exactly in both formats, the model shape is read from the
// file, and every malformed or mismatched file is an IoError naming the file and the tensor.
#include <catch2/catch.hpp>

#include "unit/checkpoint_test_util.h"
#include "unit/io_test_util.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/llmc.h"
#include "triax/io/token_shard.h"
#include "triax/model/weight_file.h"
#include "triax/model/gpt.h"
#include "triax/model/param_shards.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

// A small shape that is not a GPT-2 size (heads must come from metadata or the caller) with a
// non-4C MLP and a vocabulary that pads.
GptConfig small_cfg() {
  GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.ffn = 24;
  c.vocab = 10;
  c.max_seq = 6;
  c.vocab_pad_to = 4;  // padded vocab 12: two zero rows
  return c;
}

// Integer-valued, exactly representable and distinct per tensor: ordinal * 1000 + flat index.
float formula(int ordinal, int64_t i) { return static_cast<float>(ordinal * 1000 + i); }

struct Model {
  std::unique_ptr<Communicator> self = make_self_communicator("tp", 0);
  ParamStore store;
  std::unique_ptr<GptChunk> chunk;
  explicit Model(const GptConfig& cfg) {
    chunk = std::make_unique<GptChunk>(cfg, ChunkSpec{0, cfg.n_layer, true, true}, *self, store, Recompute::none);
    store.finalize();
  }
  std::vector<float> get(const std::string& name) const {
    auto s = store.param(store.find(name));
    return {s.begin(), s.end()};
  }
};

// The model's parameters as a FullWeights map (tp = 1: local == full).
FullWeights weights_of(const Model& m) {
  FullWeights w;
  for (size_t i = 0; i < m.store.size(); ++i) {
    auto s = m.store.param(i);
    w[m.store.info(i).spec.name] = {s.begin(), s.end()};
  }
  return w;
}

}  // namespace

TEST_CASE("a hand-made HF Conv1D file loads into the right places", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig cfg = small_cfg();
  const auto hf = test::make_hf_model(cfg, formula);
  const int64_t C = cfg.n_embd;
  for (std::string prefix : {"transformer.", ""}) {
    INFO("prefix '" << prefix << "'");
    const std::string path = dir.file("hf" + prefix + ".safetensors");
    // HF also saves the causal-mask buffers; they are not parameters and must be ignored.
    std::map<std::string, test::HfTensor> extra;
    extra[prefix + "h.0.attn.bias"] = {{1, 1, 6, 6}, std::vector<float>(36, 1.0f)};
    extra[prefix + "h.0.attn.masked_bias"] = {{}, {-1e4f}};
    test::write_hf_file(path, hf, prefix, {{"n_head", "2"}, {"format", "pt"}}, extra);

    WeightFile wf(path);
    REQUIRE(wf.format() == WeightFormat::safetensors);
    const GptConfig& got = wf.config();
    CHECK(got.n_layer == 2);
    CHECK(got.n_head == 2);
    CHECK(got.n_embd == 8);
    CHECK(got.ffn_size() == 24);
    CHECK(got.vocab == 10);
    CHECK(got.max_seq == 6);

    Model m(cfg);
    std::fill(m.store.flat_params().begin(), m.store.flat_params().end(), -7.0f);  // poison
    wf.load(m.store, cfg, *m.self);

    // c_attn: file (C, 3C) element [i][o] = ordinal*1000 + i*3C + o lands at our [o][i] of (3C, C).
    const int o_attn = 2 + 2;  // wte, wpe, ln_1.weight, ln_1.bias, then c_attn of layer 0
    const auto qkv = m.get("transformer.h.0.attn.c_attn.weight");
    auto at = [&](int64_t o, int64_t i) { return qkv[static_cast<size_t>(o * C + i)]; };
    CHECK(at(0, 1) == 1000.0f * o_attn + 1 * 3 * C + 0);              // Q row 0, input 1
    CHECK(at(C + 2, 3) == 1000.0f * o_attn + 3 * 3 * C + (C + 2));    // K row 2, input 3
    CHECK(at(2 * C + 7, 5) == 1000.0f * o_attn + 5 * 3 * C + 2 * C + 7);  // V row 7, input 5
    // c_attn bias: Q, K, V blocks in order, untouched.
    const auto qkvb = m.get("transformer.h.0.attn.c_attn.bias");
    CHECK(qkvb[C + 1] == 1000.0f * (o_attn + 1) + C + 1);
    // mlp.c_proj of layer 1: file (F, C) [f][c] -> our (C, F) [c][f].
    const int o_fp1 = 2 + 12 + 10;
    const auto fp = m.get("transformer.h.1.mlp.c_proj.weight");
    CHECK(fp[static_cast<size_t>(3 * cfg.ffn_size() + 17)] == 1000.0f * o_fp1 + 17 * C + 3);
    // wte: real rows as stored, padded rows [10, 12) zero.
    const auto wte = m.get("transformer.wte.weight");
    REQUIRE(wte.size() == 12u * C);
    CHECK(wte[9 * C + 7] == 9 * C + 7.0f);
    for (size_t i = 10 * C; i < wte.size(); ++i) REQUIRE(wte[i] == 0.0f);
    // Every parameter equals the naive HF -> triax map.
    for (const auto& [name, shape] : gpt_param_shapes(cfg)) {
      INFO(name);
      CHECK(m.get(name) == test::triax_layout(hf, name, 12));
    }
  }
}

TEST_CASE("heads come from metadata, the caller or the GPT-2 size", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig cfg = small_cfg();
  const auto hf = test::make_hf_model(cfg, formula);
  const std::string bare = dir.file("bare.safetensors");
  test::write_hf_file(bare, hf, "transformer.");
  // C = 8 is not a GPT-2 size and there is no metadata: the caller must say.
  const auto msg = test::config_error_of([&] { WeightFile wf(bare); });
  CHECK_THAT(msg, Contains(bare) && Contains("heads") && Contains("8"));
  CHECK(WeightFile(bare, 2).config().n_head == 2);
  CHECK(WeightFile(bare, 4).config().n_head == 4);
  CHECK_THAT(test::io_error_of([&] { WeightFile wf(bare, 3); }), Contains("not divisible"));

  const std::string meta = dir.file("meta.safetensors");
  test::write_hf_file(meta, hf, "transformer.", {{"n_head", "2"}});
  CHECK(WeightFile(meta).config().n_head == 2);
  CHECK(WeightFile(meta, 2).config().n_head == 2);
  CHECK_THAT(test::config_error_of([&] { WeightFile wf(meta, 4); }), Contains("n_head=2") && Contains(meta));
  const std::string badmeta = dir.file("badmeta.safetensors");
  test::write_hf_file(badmeta, hf, "transformer.", {{"n_head", "two"}});
  CHECK_THAT(test::io_error_of([&] { WeightFile wf(badmeta); }), Contains("n_head") && Contains("two"));

  CHECK(default_gpt2_heads(768) == 12);
  CHECK(default_gpt2_heads(1024) == 16);
  CHECK(default_gpt2_heads(1280) == 20);
  CHECK(default_gpt2_heads(1600) == 25);
  CHECK(!default_gpt2_heads(512));
  // A GPT-2-wide file without metadata gets GPT-2's head count (only the tensors the shape needs).
  const std::string wide = dir.file("wide.safetensors");
  {
    io::SafetensorsWriter w;
    w.add("wte.weight", {3, 768}, std::vector<float>(3 * 768, 0.5f));
    w.add("wpe.weight", {2, 768}, std::vector<float>(2 * 768, 0.5f));
    w.add("h.0.mlp.c_fc.weight", {768, 3072}, std::vector<float>(768 * 3072, 0.5f));
    w.write(wide);
  }
  const GptConfig wc = WeightFile(wide).config();
  CHECK(wc.n_head == 12);
  CHECK(wc.n_layer == 1);
  CHECK(wc.ffn_size() == 3072);
}

TEST_CASE("save -> load round trips exactly in both formats", "[checkpoint]") {
  test::TempDir dir;
  for (GptConfig cfg : {GptConfig::preset("nano"), small_cfg()}) {
    INFO(cfg.describe());
    Model a(cfg);
    a.chunk->init_params(4242);
    // init leaves biases at zero and LayerNorm at one: fill every tensor so the test can fail.
    std::mt19937_64 rng(test::fresh_seed());
    for (size_t i = 0; i < a.store.size(); ++i) {
      auto p = a.store.param(i);
      auto r = test::random_floats(p.size(), rng, 0.5f);
      if (a.store.info(i).spec.name == "transformer.wte.weight")
        std::fill(r.begin() + static_cast<std::ptrdiff_t>(cfg.vocab) * cfg.n_embd, r.end(), 0.0f);
      std::copy(r.begin(), r.end(), p.begin());
    }
    std::vector<WeightFormat> formats = {WeightFormat::safetensors};
    if (cfg.ffn_size() == 4 * cfg.n_embd) formats.push_back(WeightFormat::llmc);
    for (WeightFormat f : formats) {
      INFO(weight_format_name(f));
      const std::string path = dir.file(f == WeightFormat::llmc ? "rt.bin" : "rt.safetensors");
      save_weights(path, f, cfg, a.store, *a.self, *a.self);
      WeightFile wf(path);
      CHECK(wf.format() == f);
      CHECK(wf.config().n_head == cfg.n_head);
      CHECK(wf.config().n_layer == cfg.n_layer);
      CHECK(wf.config().vocab == cfg.vocab);
      Model b(cfg);
      wf.load(b.store, cfg, *b.self);
      for (size_t i = 0; i < a.store.size(); ++i) {
        INFO(a.store.info(i).spec.name);
        CHECK(b.get(a.store.info(i).spec.name) == a.get(a.store.info(i).spec.name));
      }
    }
    // The HF file is in HF's layout: Conv1D shapes, real vocabulary, no lm_head, metadata.
    io::SafetensorsReader st(dir.file("rt.safetensors"));
    const int64_t C = cfg.n_embd;
    CHECK(st.info("transformer.h.0.attn.c_attn.weight").shape == io::Shape{C, 3 * C});
    CHECK(st.info("transformer.h.1.mlp.c_proj.weight").shape == io::Shape{cfg.ffn_size(), C});
    CHECK(st.info("transformer.wte.weight").shape == io::Shape{cfg.vocab, C});
    CHECK(!st.contains("lm_head.weight"));
    CHECK(st.metadata().at("format") == "pt");
    CHECK(st.metadata().at("n_head") == std::to_string(cfg.n_head));
    const auto c_fc = st.read("transformer.h.1.mlp.c_fc.weight");
    const auto ours = a.get("transformer.h.1.mlp.c_fc.weight");  // (F, C)
    CHECK(c_fc[static_cast<size_t>(5 * cfg.ffn_size() + 3)] == ours[static_cast<size_t>(3 * C + 5)]);

    // bf16: the loaded values are the stored values rounded to bf16.
    const std::string path16 = dir.file("rt16.safetensors");
    write_hf_safetensors(path16, cfg, weights_of(a), io::FileDType::bf16);
    Model c(cfg);
    WeightFile(path16).load(c.store, cfg, *c.self);
    const auto src = a.get("transformer.h.0.attn.c_attn.weight");
    const auto got = c.get("transformer.h.0.attn.c_attn.weight");
    for (size_t i = 0; i < src.size(); ++i) REQUIRE(got[i] == static_cast<float>(bf16(src[i])));
  }
}

TEST_CASE("llm.c checkpoints: shape from the header, stacked layers, padded vocab", "[checkpoint]") {
  test::TempDir dir;
  GptConfig cfg = GptConfig::preset("nano");  // vocab 67 -> llm.c pads to 128
  const auto hf = test::make_hf_model(cfg, formula);
  // Build the llm.c file by hand from the HF-layout model (independent of write_llmc_checkpoint).
  io::LlmcGpt2Config h{cfg.max_seq, cfg.vocab, 128, cfg.n_layer, cfg.n_head, cfg.n_embd};
  io::LlmcGpt2Writer w(h);
  const char* names[12] = {"ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                           "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb"};
  for (int i = 0; i < 12; ++i) {
    std::vector<float> st;
    for (int l = 0; l < cfg.n_layer; ++l) {
      auto v = test::triax_layout(hf, fmt::format("transformer.h.{}.{}", l, test::kHfLayerParams[i]), 0);
      st.insert(st.end(), v.begin(), v.end());
    }
    w.set(names[i], st);
  }
  w.set("wte", test::triax_layout(hf, "transformer.wte.weight", 128));
  w.set("wpe", hf.at("wpe.weight").data);
  w.set("lnfw", hf.at("ln_f.weight").data);
  w.set("lnfb", hf.at("ln_f.bias").data);
  const std::string path = dir.file("model.bin");
  w.write(path);

  WeightFile wf(path);
  REQUIRE(wf.format() == WeightFormat::llmc);
  CHECK(wf.config().n_head == cfg.n_head);
  CHECK(wf.config().n_layer == cfg.n_layer);
  CHECK(wf.config().vocab == 67);
  CHECK(wf.config().max_seq == cfg.max_seq);
  CHECK_THAT(test::config_error_of([&] { WeightFile x(path, 2); }), Contains("4 heads"));
  Model m(cfg);
  wf.load(m.store, cfg, *m.self);
  for (const auto& [name, shape] : gpt_param_shapes(cfg)) {
    INFO(name);
    CHECK(m.get(name) == test::triax_layout(hf, name, cfg.padded_vocab(1)));
  }
  // The same model through the HF file gives the same parameters.
  const std::string st = dir.file("model.safetensors");
  test::write_hf_file(st, hf, "", {{"n_head", "4"}});
  Model m2(cfg);
  WeightFile(st).load(m2.store, cfg, *m2.self);
  CHECK(m2.store.flat_params().size() == m.store.flat_params().size());
  CHECK(std::equal(m.store.flat_params().begin(), m.store.flat_params().end(), m2.store.flat_params().begin()));
}

TEST_CASE("malformed and mismatched weight files are IoErrors naming file and tensor", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig cfg = small_cfg();
  const auto hf = test::make_hf_model(cfg, formula);
  const std::map<std::string, std::string> meta = {{"n_head", "2"}};
  auto load = [&](const std::string& path, const GptConfig& c) {
    Model m(c);
    WeightFile(path).load(m.store, c, *m.self);
  };

  SECTION("missing tensor") {
    auto m = hf;
    m.erase("h.1.mlp.c_fc.bias");
    const auto path = dir.file("missing.safetensors");
    test::write_hf_file(path, m, "transformer.", meta);
    CHECK_THAT(test::io_error_of([&] { load(path, cfg); }),
               Contains(path) && Contains("missing tensor 'transformer.h.1.mlp.c_fc.bias'"));
  }
  SECTION("a matrix in Linear (out, in) layout instead of Conv1D") {
    auto m = hf;
    m["h.0.attn.c_attn.weight"].shape = {24, 8};
    const auto path = dir.file("linear.safetensors");
    test::write_hf_file(path, m, "transformer.", meta);
    CHECK_THAT(test::io_error_of([&] { load(path, cfg); }),
               Contains(path) && Contains("transformer.h.0.attn.c_attn.weight") && Contains("[24, 8]") &&
                   Contains("[8, 24]"));
  }
  SECTION("a bias of the wrong length") {
    auto m = hf;
    m["h.1.ln_2.bias"] = {{7}, std::vector<float>(7, 1.0f)};
    const auto path = dir.file("bias.safetensors");
    test::write_hf_file(path, m, "", meta);
    CHECK_THAT(test::io_error_of([&] { load(path, cfg); }),
               Contains(path) && Contains("h.1.ln_2.bias") && Contains("[7]") && Contains("[8]"));
  }
  SECTION("the file's model differs from the model being loaded") {
    const auto path = dir.file("ok.safetensors");
    test::write_hf_file(path, hf, "transformer.", meta);
    GptConfig other = cfg;
    other.n_layer = 3;
    CHECK_THAT(test::io_error_of([&] { load(path, other); }),
               Contains(path) && Contains("layers=2") && Contains("layers=3"));
    other = cfg;
    other.vocab = 9;
    CHECK_THAT(test::io_error_of([&] { load(path, other); }), Contains("vocab=10") && Contains("vocab=9"));
  }
  SECTION("no embedding, no layers, gaps in the layer numbers") {
    auto m = hf;
    m.erase("wte.weight");
    auto path = dir.file("nowte.safetensors");
    test::write_hf_file(path, m, "transformer.", meta);
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(path); }), Contains(path) && Contains("wte.weight"));
    m = hf;
    for (const char* p : test::kHfLayerParams) m.erase(fmt::format("h.0.{}", p));
    path = dir.file("gap.safetensors");
    test::write_hf_file(path, m, "transformer.", meta);
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(path); }), Contains(path) && Contains("transformer.h.0."));
  }
  SECTION("an untied lm_head is refused; a tied copy is accepted") {
    const auto tied = dir.file("tied.safetensors");
    test::write_hf_file(tied, hf, "transformer.", meta, {{"lm_head.weight", hf.at("wte.weight")}});
    load(tied, cfg);
    auto head = hf.at("wte.weight");
    head.data[13] += 1.0f;
    const auto untied = dir.file("untied.safetensors");
    test::write_hf_file(untied, hf, "transformer.", meta, {{"lm_head.weight", head}});
    CHECK_THAT(test::io_error_of([&] { load(untied, cfg); }), Contains(untied) && Contains("lm_head.weight"));
  }
  SECTION("files that are not weights") {
    const auto shard = dir.file("tokens.bin");
    const std::vector<uint16_t> toks = {1, 2, 3};
    io::write_token_shard(shard, toks);
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(shard); }), Contains(shard) && Contains("token shard"));
    const auto junk = dir.file("junk.safetensors");
    test::write_bytes(junk, std::string(64, 'x'));
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(junk); }), Contains(junk) && Contains("not a weight file"));
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(dir.file("absent.safetensors")); }), Contains("absent.safetensors"));
    test::write_bytes(dir.file("empty"), "");
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(dir.file("empty")); }), Contains("not a weight file"));
  }
  SECTION("a truncated llm.c checkpoint") {
    GptConfig n = GptConfig::preset("nano");
    Model a(n);
    a.chunk->init_params(1);
    const auto path = dir.file("t.bin");
    write_llmc_checkpoint(path, n, weights_of(a));
    auto bytes = test::read_bytes(path);
    bytes.resize(bytes.size() - 4);
    test::write_bytes(path, bytes);
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(path); }), Contains(path) && Contains("truncated"));
  }
  SECTION("a truncated safetensors file") {
    const auto path = dir.file("trunc.safetensors");
    test::write_hf_file(path, hf, "transformer.", meta);
    auto bytes = test::read_bytes(path);
    bytes.resize(bytes.size() - 8);
    test::write_bytes(path, bytes);
    CHECK_THAT(test::io_error_of([&] { WeightFile wf(path); }), Contains(path));
  }
}

TEST_CASE("writing refuses incomplete weights and shapes llm.c cannot hold", "[checkpoint]") {
  test::TempDir dir;
  const GptConfig n = GptConfig::preset("nano");
  Model a(n);
  a.chunk->init_params(3);
  auto w = weights_of(a);
  w.erase("transformer.h.1.ln_2.weight");
  CHECK_THAT(test::config_error_of([&] { write_hf_safetensors(dir.file("x.safetensors"), n, w); }),
             Contains("transformer.h.1.ln_2.weight"));
  CHECK_THAT(test::config_error_of([&] { write_llmc_checkpoint(dir.file("x.bin"), n, w); }),
             Contains("transformer.h.1.ln_2.weight"));
  const GptConfig s = small_cfg();  // ffn 24 != 4C
  Model b(s);
  CHECK_THAT(test::config_error_of([&] { write_llmc_checkpoint(dir.file("y.bin"), s, weights_of(b)); }),
             Contains("4*C"));
  // save_weights reports the writer's failure as an IoError on every rank.
  CHECK_THAT(test::io_error_of([&] {
               save_weights(dir.file("no/such/dir/z.safetensors"), WeightFormat::safetensors, n, a.store, *a.self,
                            *a.self);
             }),
             Contains("no/such/dir"));
  CHECK(weight_format_for_path("a/b.bin") == WeightFormat::llmc);
  CHECK(weight_format_for_path("a/b.safetensors") == WeightFormat::safetensors);
}
