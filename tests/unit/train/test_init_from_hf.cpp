// --init-from an HF Llama directory on one rank: config.json fills the shape and the block flags
// that are not given, the Trainer's model is config.json's (including the llama3 scaling factors
// and context that no flag spells), every parameter holds the file's values (vocabulary rows past
// the real vocabulary zero), and a flag that contradicts the directory is refused naming both.
#include <catch2/catch.hpp>

#include <cmath>

#include "unit/io_test_util.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/model/hf_dir.h"
#include "triax/train/trainer.h"
#include "support/llama_checks.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

GptConfig dir_model() {
  GptConfig m = GptConfig::preset("llama-nano");  // H8 KV4 C32 F48 V67, untied
  m.vocab_pad_to = 128;
  m.max_seq = 32;
  m.norm_eps = 1e-6;
  m.rope_theta = 20000.0;
  m.rope_scaling = RopeScaling{true, 4.0, 2.0, 8.0, 64};  // none of Megatron's fixed 1, 4, 8192
  return m;
}

FullWeights dir_weights(const GptConfig& m) {
  FullWeights w;
  int ordinal = 1;
  for (const auto& [name, shape] : hf_param_shapes(m)) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(0.1 * std::sin(0.37 * i + ordinal));
    w[name] = std::move(v);
    ++ordinal;
  }
  return w;
}

TrainConfig run(const std::string& dir) {
  TrainConfig c;
  c.init_from = dir;
  c.seq = 8;
  c.micro_batch = 1;
  c.global_batch = 1;
  c.train_iters = 1;
  return c;
}

}  // namespace

TEST_CASE("--init-from an HF Llama directory: the model, the block flags and the weights come from it") {
  test::TempDir d;
  const std::string dir = d.file("llama");
  const GptConfig m = dir_model();
  const FullWeights w = dir_weights(m);
  write_hf_dir(dir, m, w);

  const TrainConfig f = with_init_from_shape(run(dir));
  CHECK(f.layers == 2);
  CHECK(f.heads == 8);
  CHECK(f.hidden == 32);
  CHECK(f.ffn == 48);
  CHECK(f.vocab == 67);
  CHECK(f.max_seq == 32);
  test::check_llama_flags(f, {.norm_epsilon = 1e-6, .rotary_base = 20000.0, .rope_scaling_factor = 4.0,
                              .num_query_groups = 4});

  Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), run(dir));
  const GptConfig& got = t.model_config();
  CHECK(got.describe() == m.describe());
  CHECK(got.norm_eps == m.norm_eps);
  CHECK(got.rope_scaling.low_freq_factor == 2.0);
  CHECK(got.rope_scaling.high_freq_factor == 8.0);
  CHECK(got.rope_scaling.original_max_positions == 64);
  CHECK(got.rope_inv_freq() == m.rope_inv_freq());
  const ParamStore& s = t.store();
  REQUIRE(s.size() == hf_param_shapes(m).size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto& info = s.info(i);
    INFO(info.spec.name);
    std::vector<float> want = w.at(info.spec.name);
    want.resize(static_cast<size_t>(info.numel), 0.0f);  // padded vocabulary rows
    CHECK(s.param_to_host(i) == want);
  }
}

TEST_CASE("--init-from an HF Llama directory refuses a contradicting flag, naming both models") {
  test::TempDir d;
  const std::string dir = d.file("llama");
  const GptConfig m = dir_model();
  write_hf_dir(dir, m, dir_weights(m));
  TrainConfig c = run(dir);
  c.normalization = Norm::layernorm;
  CHECK_THROWS_WITH(Trainer(std::shared_ptr<Communicator>(make_self_communicator()), c),
                    Contains("config.json describes") && Contains("norm=RMSNorm") && Contains("norm=LayerNorm"));
  c = run(dir);
  c.heads = 4;
  CHECK_THROWS_WITH(Trainer(std::shared_ptr<Communicator>(make_self_communicator()), c),
                    Contains("heads=8") && Contains("heads=4"));
}

TEST_CASE("--init-from an HF Llama directory with --group-query-attention alone keeps the directory's groups") {
  test::TempDir d;
  const std::string dir = d.file("llama");
  const GptConfig m = dir_model();  // 8 heads over 4 key/value heads
  write_hf_dir(dir, m, dir_weights(m));
  TrainConfig c = run(dir);
  c.group_query_attention = true;  // as a preset with groups: the groups are config.json's
  const TrainConfig f = with_init_from_shape(c);
  CHECK(f.num_query_groups == 4);
  Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), c);
  CHECK(t.model_config().kv_heads() == 4);
  // A number that contradicts the directory is still refused on load, naming both models.
  c.num_query_groups = 2;
  CHECK_THROWS_WITH(Trainer(std::shared_ptr<Communicator>(make_self_communicator()), c),
                    Contains("kv_heads=4") && Contains("kv_heads=2"));
}

TEST_CASE("--init-from an HF Llama directory with --position-embedding-type learned_absolute names the positions") {
  test::TempDir d;
  const std::string dir = d.file("llama");
  const GptConfig m = dir_model();
  write_hf_dir(dir, m, dir_weights(m));
  TrainConfig c = run(dir);
  c.position_embedding = PositionEmbedding::learned_absolute;
  // The rotary flags are config.json's only under rope positions: the refusal is the load's, naming
  // both models, not one about a --rotary-base the command line never gave.
  const TrainConfig f = with_init_from_shape(c);
  CHECK_FALSE(f.rotary_base.has_value());
  CHECK_FALSE(f.use_rope_scaling.has_value());
  CHECK_THROWS_WITH(Trainer(std::shared_ptr<Communicator>(make_self_communicator()), c),
                    Contains("positions=rope") && Contains("positions=learned_absolute"));
}

TEST_CASE("--init-from an HF Llama directory: a configuration error says the flags it names came from the directory") {
  test::TempDir d;
  const std::string dir = d.file("llama");
  const GptConfig m = dir_model();
  write_hf_dir(dir, m, dir_weights(m));
  TrainConfig c = run(dir);
  c.group_query_attention = true;
  c.num_query_groups = 3;
  // The message lists "--model tiny --num-layers 2 ... --num-query-groups 3": only the last was given.
  CHECK_THROWS_WITH(Trainer(std::shared_ptr<Communicator>(make_self_communicator()), c),
                    Contains("8 query heads cannot be grouped over 3 key/value heads") &&
                        Contains("the model flags not given come from --init-from " + dir));
}

TEST_CASE("--init-from a directory without config.json says what an HF model directory holds") {
  test::TempDir d;
  const std::string dir = d.file("weights");
  std::filesystem::create_directory(dir);
  // It read "weights: not a regular file" (the GPT-2 weight-file reader's word for a directory).
  CHECK_THROWS_WITH(with_init_from_shape(run(dir)),
                    Contains("--init-from " + dir + ": a directory without config.json") &&
                        Contains("an HF Llama model directory"));
}
