// The training configuration module: every option round-trips through its sectioned TOML text
// (and the same values as flags, or as a flat file, give the same configuration), typos and keys
// in the wrong section get the nearest key and the right section, unset differs from 0, and
// resolve_train_config fills in what was derived.
#include <catch2/catch.hpp>

#include "triax/config/train_config.h"

#include "support/llama_checks.h"

#include <map>
#include <sstream>
#include <tuple>

using namespace triax;
using Catch::Contains;

namespace {

// A configuration in which every option differs from its default.
TrainConfig unusual() {
  TrainConfig c;
  c.model = "nano";
  c.layers = 6, c.heads = 2, c.hidden = 32, c.ffn = 96, c.vocab = 300, c.max_seq = 48, c.seq = 40;
  c.normalization = Norm::rmsnorm, c.norm_epsilon = 1e-6, c.swiglu = true;
  c.position_embedding = PositionEmbedding::rope, c.rotary_base = 500000.0;
  c.use_rope_scaling = true, c.rope_scaling_factor = 16.0;
  c.group_query_attention = true, c.num_query_groups = 1;
  c.untie_embeddings = true, c.disable_bias_linear = true;
  c.tp = 2, c.pp = 3, c.dp = 5, c.vpp = 2;
  c.cp = 2, c.cp_comm_type = "allgather";
  c.order = "dp-tp-pp";
  c.allow_tp_across_hosts = true;
  c.pipeline_layers = {1, 2, 3};
  c.stage_classes = {"h100", "a100.80g", "a_1"};
  c.dp_microbatches = {{"h100", 6}, {"a100.80g", 2}};
  c.schedule = ScheduleKind::zb_h1;
  c.micro_batch = 3, c.global_batch = 45, c.num_micro_batches = 3;
  c.rampup = BatchRampup{15, 15, 90};
  c.train_iters = 7;
  c.seed = 987654321987ull;
  c.lr = 1.25e-4, c.min_lr = 3.3e-6;
  c.warmup_iters = 2, c.decay_iters = 6;
  c.lr_decay = LrDecay::linear;
  c.adamw.weight_decay = 0.05f, c.adamw.beta1 = 0.85f, c.adamw.beta2 = 0.975f, c.adamw.eps = 3e-7f;
  c.clip_grad = 0.3;
  c.zero = 2;
  c.zero_shard_size = 2;
  c.bucket_mb = 0.125;
  c.overlap_grad_reduce = false;
  c.zero_prefetch = false;
  c.recompute = Recompute::selective;
  c.sequence_parallel = true;
  c.moe_every = 2, c.experts = 6, c.topk = 1, c.capacity_factor = 1.5, c.no_drop = true, c.moe_aux_coef = 0.02;
  c.moe_chunks = 3, c.ep = 3;
  c.data = "a \"quoted\" \\ path.txt";
  c.data_shuffle = false, c.data_respect_eod = true;
  c.valid_data = "val_*.bin", c.eval_interval = 5, c.eval_iters = 3;
  c.metrics_jsonl = "m.jsonl";
  c.backend = "cpu-checked";
  c.bf16 = true, c.fp16 = true;  // printed and read back only: resolution refuses the pair (and both on a cpu backend)
  c.stall_timeout = 12.5, c.max_skipped_iterations = 4, c.straggler_factor = 1.5, c.loss_spike_zscore = 3.5;
  c.metrics_port = 9400, c.metrics_bind = "127.0.0.1", c.metrics_textfile = "triax.prom", c.metrics_linger = 2.5;
  c.profile_steps = "2:3", c.profile_dir = "prof dir";
  c.save = "ck pts", c.save_interval = 25, c.save_interval_minutes = 7.5, c.keep_last = 5, c.load = "old/ckpts";
  c.init_from = "gpt2.safetensors", c.export_hf = "out.safetensors";
  return c;
}

// The printed text's `key = value` lines as flags: --key=value with TOML's quoting and brackets
// taken off (strings here hold no escapes other than \" and \\).
std::vector<std::string> as_flags(const std::string& toml_text) {
  std::vector<std::string> flags;
  std::istringstream in(toml_text);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find(" = ");
    if (line.empty() || line[0] == '[' || line[0] == '#' || eq == std::string::npos) continue;
    std::string v = line.substr(eq + 3), word;
    if (v.front() == '"') {
      for (size_t i = 1; i + 1 < v.size(); ++i) word += v[i] == '\\' ? v[++i] : v[i];
    } else {
      for (const char ch : v)
        if (ch != '[' && ch != ']' && ch != ' ') word += ch;  // [1, 2, 3] -> 1,2,3
    }
    flags.push_back("--" + line.substr(0, eq) + "=" + word);
  }
  return flags;
}

CommandLine parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"t"};
  for (const auto& a : args) argv.push_back(a.c_str());
  return parse_train_command_line(static_cast<int>(argv.size()), argv.data(), "t", "test");
}

// Options the printed TOML holds: all but the aliases (--zero1).
size_t printed_options() {
  size_t n = 0;
  for (const auto& o : train_options()) n += o.alias_of.empty() ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("train config: every option round-trips through the printed TOML", "[config]") {
  const TrainConfig a = unusual();
  const std::string text = to_toml(a);
  TrainConfig b;
  apply_config_text(b, text, "printed.toml");
  CHECK(to_toml(b) == text);
  // Each option printed changes the default: a printer that dropped one would not round-trip.
  for (const auto& o : train_options()) {
    INFO(o.key);
    if (!o.alias_of.empty()) {  // another spelling (--zero1): never printed
      CHECK(!o.toml(a));
      continue;
    }
    CHECK(o.toml(a) != o.toml(TrainConfig{}));
    CHECK(o.toml(b) == o.toml(a));
  }
  CHECK(b.adamw.beta2 == a.adamw.beta2);
  CHECK(b.lr == a.lr);
  CHECK(b.seed == a.seed);
  CHECK(b.data == a.data);
}

TEST_CASE("train config: unset optionals are left out, 0 is refused", "[config]") {
  TrainConfig c;
  const std::string text = to_toml(c);
  CHECK(!Contains("micro-batch-size").match(text));
  CHECK(!Contains("num-layers").match(text));
  c.micro_batch = 0;
  CHECK_THROWS_WITH(check_ranges(c), Contains("micro-batch-size = 0: out of range; expected an integer >= 1"));
  TrainConfig d;
  CHECK_THROWS_WITH(apply_config_text(d, "dp = 0\n", "x.toml"), Contains("x.toml:1: dp = 0: out of range"));
}

TEST_CASE("train config: typos, tables and malformed files name file, line and key", "[config]") {
  TrainConfig c;
  CHECK(nearest_train_option("train_iters") == "train-iters");
  CHECK(nearest_train_option("micro-batch") == "micro-batch-size");
  CHECK(nearest_train_option("zzzzzzzzzzzz").empty());
  CHECK_THROWS_WITH(apply_config_text(c, "tp = 1\nglobal-bach-size = 8\n", "r.toml"),
                    Contains("r.toml:2: unknown key 'global-bach-size' (did you mean 'global-batch-size'?)"));
  CHECK_THROWS_WITH(apply_config_text(c, "[train]\nlr = 1.0\n", "r.toml"),
                    Contains("r.toml:1: unknown section [train] (did you mean [training]?); the sections are [model], "
                             "[parallel], [training], [optimizer], [data], [checkpoint], [metrics], [faults]"));
  CHECK_THROWS_AS(apply_config_text(c, "= =\n", "r.toml"), ConfigError);
  CHECK_THROWS_WITH(apply_config_text(c, "zero1 = 1\n", "r.toml"),
                    Contains("r.toml:1: zero1 = 1: an integer is the wrong type; expected true or false"));
  CHECK_THROWS_WITH(apply_config_text(c, "pipeline-layers = [2, 0]\n", "r.toml"), Contains("out of range"));
  CHECK_THROWS_WITH(apply_config_text(c, "rampup-batch-size = [1, 2]\n", "r.toml"), Contains("2 values"));
}

TEST_CASE("train config: the command line reads --config first, flags win", "[config]") {
  const char* argv[] = {"t", "--train-iters", "9", "--zero1", "--lr=0.5", "--pipeline-layers", "3,5"};
  const auto cl = parse_train_command_line(7, argv, "t", "test");
  CHECK(cl.cfg.train_iters == 9);
  CHECK((cl.cfg.zero == 1));
  CHECK(cl.cfg.lr == 0.5);
  CHECK(cl.cfg.pipeline_layers == std::vector<int>{3, 5});
  const char* bad[] = {"t", "--pipeline-layers", "3,,5"};
  CHECK_THROWS_WITH(parse_train_command_line(3, bad, "t", "test"), Contains("an empty entry"));
  const char* pos[] = {"t", "extra"};
  CHECK_THROWS_WITH(parse_train_command_line(2, pos, "t", "test"), Contains("unexpected argument 'extra'"));
}

TEST_CASE("train config: resolution fills in every derived value", "[config]") {
  TrainConfig c;
  c.model = "nano";
  c.pp = 2;
  const ResolvedTrainConfig r = resolve_train_config(c, 4);
  CHECK(r.dp == 2);
  CHECK(r.explicit_cfg.dp == 2);
  CHECK(r.explicit_cfg.micro_batch == 4);
  CHECK(r.explicit_cfg.num_micro_batches == 4);
  CHECK(r.explicit_cfg.global_batch == 32);
  CHECK(r.explicit_cfg.decay_iters == c.train_iters);
  CHECK(r.explicit_cfg.seq == r.model.max_seq);
  // Resolving the explicit configuration again changes nothing.
  CHECK(to_toml(resolve_train_config(r.explicit_cfg, 4).explicit_cfg) == to_toml(r.explicit_cfg));
  CHECK_THROWS_WITH(resolve_train_config(c, 3), Contains("not divisible by tp 1 x pp 2"));
}

TEST_CASE("train config: the printed file is sectioned, every key under its own section", "[config]") {
  const std::string text = to_toml(unusual());
  std::map<std::string, int> keys_per_section;
  std::string section;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.front() == '[') {
      section = line.substr(1, line.size() - 2);
      CHECK(find_enum<ConfigSection>(section).has_value());
      CHECK(keys_per_section.count(section) == 0);  // each section once
      keys_per_section[section] = 0;
      continue;
    }
    const std::string key = line.substr(0, line.find(" = "));
    INFO(line);
    const ConfigOption* o = find_train_option(key);
    REQUIRE(o != nullptr);
    CHECK(enum_name(o->section) == section);
    ++keys_per_section[section];
  }
  // Every section holds options, and all of them were printed (unusual() sets every one).
  CHECK(keys_per_section.size() == EnumNames<ConfigSection>::table.size());
  size_t printed = 0;
  for (const auto& [name, n] : keys_per_section) {
    INFO(name);
    CHECK(n > 0);
    printed += static_cast<size_t>(n);
  }
  CHECK(printed == printed_options());
  CHECK(Contains("[parallel]\ntp = 2\npp = 3\n").match(text));
  // --help lists every flag under its section's heading.
  const char* help[] = {"t", "--help"};
  const std::string h = parse_train_command_line(2, help, "t", "test").help_text;
  CHECK(h.find("\n[parallel]\n") < h.find("--zero1"));
  CHECK(h.find("--zero1") < h.find("\n[training]\n"));
}

TEST_CASE("train config: a sectioned file, the same flags and the same flat file are one configuration", "[config]") {
  const std::string text = to_toml(unusual());
  // Every option as a flag (--key=value): the same configuration as the sectioned file.
  const std::vector<std::string> flags = as_flags(text);
  CHECK(flags.size() == printed_options());
  CHECK(to_toml(parse(flags).cfg) == text);
  // Files written before sections: the same lines without the headers still read (flat keys
  // stay accepted, and the configuration prints sectioned).
  std::string flat;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() != '[') flat += line + "\n";
  TrainConfig f;
  apply_config_text(f, flat, "flat.toml");
  CHECK(to_toml(f) == text);
  // Mixed: flat keys before the first section.
  TrainConfig m;
  apply_config_text(m, "train-iters = 3\n[parallel]\ntp = 2\n", "mixed.toml");
  CHECK(m.train_iters == 3);
  CHECK(m.tp == 2);
}

TEST_CASE("train config: sections are strict: wrong section, unknown section, twice, nesting", "[config]") {
  TrainConfig c;
  CHECK_THROWS_WITH(apply_config_text(c, "[model]\nnum-layers = 4\ntp = 2\n", "r.toml"),
                    Contains("r.toml:3: 'tp' belongs in [parallel], not [model]"));
  CHECK_THROWS_WITH(apply_config_text(c, "[modle]\nnum-layers = 4\n", "r.toml"),
                    Contains("r.toml:1: unknown section [modle] (did you mean [model]?)"));
  CHECK_THROWS_WITH(apply_config_text(c, "[zero1]\n", "r.toml"),
                    Contains("r.toml:1: unknown section [zero1] ('zero1' is a key: write `zero1 = ...` under [parallel])"));
  CHECK_THROWS_WITH(apply_config_text(c, "[parallel]\ntpp = 2\n", "r.toml"),
                    Contains("r.toml:2: unknown key 'tpp' in [parallel] (did you mean 'tp'?)"));
  CHECK_THROWS_WITH(apply_config_text(c, "[model]\ntrain-iter = 2\n", "r.toml"),
                    Contains("r.toml:2: unknown key 'train-iter' in [model] (did you mean 'train-iters' in [training]?)"));
  CHECK_THROWS_WITH(apply_config_text(c, "tp = 2\n\n[parallel]\ntp = 4\n", "r.toml"),
                    Contains("r.toml:4: 'tp' is given twice (also on line 1)"));
  CHECK_THROWS_WITH(apply_config_text(c, "[model]\n[model.moe]\nexperts = 4\n", "r.toml"),
                    Contains("r.toml:2: 'moe' in [model] is a table"));
  CHECK_THROWS_WITH(apply_config_text(c, "[[model]]\nnum-layers = 4\n", "r.toml"),
                    Contains("r.toml:1: [[model]] is an array of tables; a section is written [model]"));
  // TOML itself: a top-level `model = ...` and a [model] section are one name defined twice.
  CHECK_THROWS_WITH(apply_config_text(c, "model = \"nano\"\n[model]\nnum-layers = 2\n", "r.toml"),
                    Contains("r.toml:2:") && Contains("malformed TOML"));
  // Types and ranges inside a section are checked as at the top level, with the line.
  CHECK_THROWS_WITH(apply_config_text(c, "[training]\n\ntrain-iters = \"three\"\n", "r.toml"),
                    Contains("r.toml:3: train-iters = \"three\": a string is the wrong type; expected an integer >= 1"));
  CHECK_THROWS_WITH(apply_config_text(c, "[parallel]\ntp = 0\n", "r.toml"),
                    Contains("r.toml:2: tp = 0: out of range; expected an integer >= 1"));
  CHECK_THROWS_WITH(apply_config_text(c, "[parallel]\nschedule = \"2f2b\"\n", "r.toml"),
                    Contains("r.toml:2: schedule = \"2f2b\": not a known value; expected one of gpipe, 1f1b, "
                             "interleaved, zb-h1"));
}

TEST_CASE("train config: resolution builds the MoE and learning-rate settings the Trainer uses", "[config]") {
  TrainConfig c;
  c.model = "nano";
  c.moe_every = 2, c.experts = 4, c.topk = 1, c.capacity_factor = 1.5, c.no_drop = true, c.moe_aux_coef = 0.02;
  c.moe_chunks = 2, c.ep = 2;
  c.lr = 2e-3, c.min_lr = 1e-4, c.warmup_iters = 3, c.lr_decay = LrDecay::linear, c.train_iters = 40;
  const ResolvedTrainConfig r = resolve_train_config(c, 2);
  CHECK(r.moe.experts == 4);
  CHECK(r.moe.top_k == 1);
  CHECK(r.moe.capacity_factor == 1.5);
  CHECK(!r.moe.drop_tokens);
  CHECK(r.moe.aux_loss_coef == 0.02f);
  CHECK(r.moe.chunks == 2);
  CHECK(r.moe_layers == r.model.n_layer / 2);
  CHECK(r.lr.max_lr == 2e-3);
  CHECK(r.lr.min_lr == 1e-4);
  CHECK(r.lr.warmup_iters == 3);
  CHECK(r.lr.decay_iters == 40);
  CHECK(r.lr.decay == LrDecay::linear);
  c.moe_every = 0, c.ep = 1;
  CHECK(resolve_train_config(c, 2).moe_layers == 0);
}

TEST_CASE("train config: --bf16 / --fp16 set the compute type, exclusive, refused on the cpu backends",
          "[config][mixed_precision]") {
  TrainConfig c;
  c.model = "nano";
  CHECK(resolve_train_config(c, 1).compute == DType::f32);
  // From the command line and from [training] in a file.
  CHECK(parse({"--bf16"}).cfg.bf16);
  CHECK(parse({"--fp16"}).cfg.fp16);
  TrainConfig f;
  apply_config_text(f, "[training]\nbf16 = true\n", "mp.toml");
  CHECK(f.bf16);
  CHECK_FALSE(f.fp16);
  CHECK_THROWS_WITH([] {
    TrainConfig g;
    apply_config_text(g, "[model]\nfp16 = true\n", "mp.toml");
  }(), Contains("fp16") && Contains("[training]"));
  for (const char* be : {"cpu", "cpu-checked"}) {
    INFO(be);
    c.backend = be;
    c.bf16 = true, c.fp16 = false;
    CHECK_THROWS_AS(resolve_train_config(c, 1), ConfigError);
    CHECK_THROWS_WITH(resolve_train_config(c, 1), Contains("--bf16") && Contains(std::string("--backend ") + be) &&
                                                      Contains("bfloat16"));
    c.bf16 = false, c.fp16 = true;
    CHECK_THROWS_WITH(resolve_train_config(c, 1), Contains("--fp16") && Contains(std::string("--backend ") + be) &&
                                                      Contains("float16"));
    c.bf16 = true, c.fp16 = true;
    CHECK_THROWS_WITH(resolve_train_config(c, 1), Contains("--bf16 and --fp16 are mutually exclusive"));
  }
}

// ---- the Llama block's flags (issue 26) ----

namespace {

ResolvedTrainConfig resolve_flags(const std::vector<std::string>& args, int world = 1) {
  return resolve_train_config(parse(args).cfg, world);
}

}  // namespace

TEST_CASE("train config: each Llama flag is parsed and overrides the preset's block", "[config][llama]") {
  const auto cl = parse({"--model", "tiny", "--normalization", "RMSNorm", "--norm-epsilon", "1e-6", "--swiglu",
                         "--position-embedding-type", "rope", "--rotary-base", "250000", "--use-rope-scaling",
                         "--rope-scaling-factor", "16", "--group-query-attention", "--num-query-groups", "2",
                         "--untie-embeddings-and-output-weights", "--disable-bias-linear"});
  const TrainConfig& c = cl.cfg;
  test::check_llama_flags(c, {.norm_epsilon = 1e-6, .rotary_base = 250000.0, .rope_scaling_factor = 16.0,
                              .num_query_groups = 2});
  // On GPT-2's tiny: the Llama block at tiny's shape (4 heads over 2 key/value heads).
  const ResolvedTrainConfig r = resolve_train_config(c, 2);
  const GptConfig& m = r.model;
  CHECK(m.n_layer == 8);
  CHECK(m.n_head == 4);
  // low/high frequency factors and original positions: Megatron's fixed values
  test::check_llama_block(m, {.kv_heads = 2, .norm_eps = 1e-6, .rope_theta = 250000.0,
                              .rope_scaling = {true, 16.0, 1.0, 4.0, 8192}, .tied_embeddings = false});
  CHECK(!m.is_gpt2());
  CHECK(m.embedding_param() == "model.embed_tokens.weight");
  CHECK(m.lm_head_param() == "lm_head.weight");
  // Without the flags tiny keeps GPT-2's block.
  const GptConfig g = resolve_flags({"--model", "tiny"}).model;
  CHECK(g.is_gpt2());
  CHECK(g.tied_embeddings);
  // The resolved configuration names the whole block, and resolving it again changes nothing.
  const std::string text = to_toml(r.explicit_cfg);
  CHECK(Contains("normalization = \"RMSNorm\"\nnorm-epsilon = 1e-06\nswiglu = true\nposition-embedding-type = \"rope\"\n"
                 "rotary-base = 250000\nuse-rope-scaling = true\nrope-scaling-factor = 16\ngroup-query-attention = true\n"
                 "num-query-groups = 2\nuntie-embeddings-and-output-weights = true\ndisable-bias-linear = true\n")
            .match(text));
  CHECK(to_toml(resolve_train_config(r.explicit_cfg, 2).explicit_cfg) == text);
}

TEST_CASE("train config: the printed configuration of a Llama preset reads back to the same model", "[config][llama]") {
  for (const char* preset : {"llama-tiny", "llama3.2-1b", "llama3-8b", "tiny"}) {
    INFO(preset);
    TrainConfig c;
    c.model = preset;
    c.tp = 2;
    const ResolvedTrainConfig r = resolve_train_config(c, 2);
    const std::string text = to_toml(r.explicit_cfg);
    // Read back as a --config file, over another preset: the printed block alone decides it.
    TrainConfig b;
    apply_config_text(b, text, "printed.toml");
    CHECK(to_toml(b) == text);
    const GptConfig& want = r.model;
    for (const char* over : {preset, "gpt2-124m", "llama3-70b"}) {
      INFO(over);
      TrainConfig o = b;
      o.model = over;
      const GptConfig got = resolve_train_config(o, 2).model;
      CHECK(got.describe() == want.describe());
      CHECK(got.kv_heads() == want.kv_heads());
      CHECK(got.norm == want.norm);
      CHECK(got.norm_eps == want.norm_eps);
      CHECK(got.swiglu == want.swiglu);
      CHECK(got.positions == want.positions);
      CHECK(got.rope_inv_freq() == want.rope_inv_freq());
      CHECK(got.rope_scaling.llama3 == want.rope_scaling.llama3);
      CHECK(got.tied_embeddings == want.tied_embeddings);
      CHECK(got.bias == want.bias);
    }
  }
  // A [model] section spelled by hand, as Megatron's flags.
  TrainConfig f;
  apply_config_text(f, "[model]\nmodel = \"tiny\"\nnormalization = \"RMSNorm\"\nswiglu = true\n"
                       "position-embedding-type = \"rope\"\nrotary-base = 10000.0\ngroup-query-attention = true\n"
                       "num-query-groups = 2\nuntie-embeddings-and-output-weights = true\ndisable-bias-linear = true\n"
                       "ffn-hidden-size = 176\n", "llama.toml");
  TrainConfig p;
  p.model = "llama-tiny";
  CHECK(resolve_train_config(f, 1).model.describe() == resolve_train_config(p, 1).model.describe());
  // A bool set false in a file turns off what a preset turns on.
  TrainConfig off;
  apply_config_text(off, "[model]\nmodel = \"llama-tiny\"\nswiglu = false\nuntie-embeddings-and-output-weights = false\n"
                         "group-query-attention = false\n", "off.toml");
  const GptConfig m = resolve_train_config(off, 1).model;
  CHECK(!m.swiglu);
  CHECK(m.tied_embeddings);
  CHECK(m.kv_heads() == m.n_head);
  CHECK(m.norm == Norm::rmsnorm);  // the rest stays the preset's
}

TEST_CASE("train config: errors of the Llama flags name the flags", "[config][llama]") {
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--num-query-groups", "2"}),
                    Contains("--num-query-groups 2 needs --group-query-attention"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--group-query-attention"}),
                    Contains("--group-query-attention needs --num-query-groups N") && Contains("'tiny'"));
  // llama-tiny has 2 query groups of its own: --group-query-attention alone keeps them.
  CHECK(resolve_flags({"--model", "llama-tiny", "--group-query-attention"}).model.kv_heads() == 2);
  // tp must divide the query groups: GptConfig::validate's numbers with the flags that set them.
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--tp", "4"}, 4),
                    Contains("--model llama-tiny") && Contains("--tp 4") &&
                        Contains("2 key/value heads (query groups) cannot be split over tp=4") &&
                        Contains("tp must divide --num-query-groups"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--group-query-attention", "--num-query-groups", "3"}),
                    Contains("--model llama-tiny --group-query-attention --num-query-groups 3 --tp 1") &&
                        Contains("4 query heads cannot be grouped over 3 key/value heads"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--hidden-size", "60"}),
                    Contains("--hidden-size 60") && Contains("rotary position embeddings need an even head size, got 15"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--rotary-base", "500000"}),
                    Contains("--rotary-base applies to rotary position embeddings") && Contains("learned_absolute"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--use-rope-scaling"}),
                    Contains("--use-rope-scaling applies to rotary position embeddings"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--rope-scaling-factor", "16"}),
                    Contains("--rope-scaling-factor 16 needs --use-rope-scaling"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama3.2-1b", "--use-rope-scaling=false", "--rope-scaling-factor", "4"}),
                    Contains("--rope-scaling-factor 4 needs --use-rope-scaling"));
  // Values out of range or unknown, as every flag: the flag, the value and what is valid.
  CHECK_THROWS_WITH(parse({"--normalization", "rmsnorm"}),
                    Contains("--normalization \"rmsnorm\": not a known value; expected one of LayerNorm, RMSNorm"));
  CHECK_THROWS_WITH(parse({"--position-embedding-type", "alibi"}),
                    Contains("expected one of learned_absolute, rope"));
  CHECK_THROWS_WITH(parse({"--norm-epsilon", "0"}), Contains("--norm-epsilon 0: out of range"));
  CHECK_THROWS_WITH(parse({"--rotary-base", "1"}), Contains("--rotary-base 1: out of range; expected a finite number > 1"));
  CHECK_THROWS_WITH(parse({"--rope-scaling-factor", "0.5"}), Contains("--rope-scaling-factor 0.5: out of range"));
  CHECK_THROWS_WITH(parse({"--num-query-groups", "0"}), Contains("--num-query-groups 0: out of range"));
  TrainConfig t;
  CHECK_THROWS_WITH(apply_config_text(t, "[model]\nswiglu = 1\n", "s.toml"),
                    Contains("s.toml:2: swiglu = 1: an integer is the wrong type; expected true or false"));
  CHECK_THROWS_WITH(apply_config_text(t, "[parallel]\nswiglu = true\n", "s.toml"),
                    Contains("'swiglu' belongs in [model], not [parallel]"));
  // --help lists them under [model], and --model lists the Llama presets.
  const char* help[] = {"t", "--help"};
  const std::string h = parse_train_command_line(2, help, "t", "test").help_text;
  for (const char* flag : {"--normalization V", "--norm-epsilon V", "--swiglu ", "--position-embedding-type V",
                           "--rotary-base V", "--use-rope-scaling ", "--rope-scaling-factor V",
                           "--group-query-attention ", "--num-query-groups V", "--untie-embeddings-and-output-weights",
                           "--disable-bias-linear "}) {
    INFO(flag);
    CHECK(h.find(flag) > h.find("\n[model]\n"));
    CHECK(h.find(flag) < h.find("\n[parallel]\n"));
  }
  CHECK(Contains("llama-tiny, llama3.2-1b, llama3-8b, llama3-70b").match(h));
}

TEST_CASE("train config: the Llama presets resolve to their documented shapes", "[config][llama]") {
  TrainConfig c;
  c.model = "llama-tiny";
  const ResolvedTrainConfig t = resolve_train_config(c, 1);
  const GptConfig& m = t.model;
  CHECK(std::tuple(m.n_layer, m.n_head, m.kv_heads(), m.n_embd, m.ffn_size(), m.vocab, m.max_seq) ==
        std::tuple(8, 4, 2, 64, 176, 256, 64));
  CHECK(m.norm == Norm::rmsnorm);
  CHECK(m.swiglu);
  CHECK(m.positions == PositionEmbedding::rope);
  CHECK(!m.bias);
  CHECK(!m.tied_embeddings);
  CHECK(t.seq == 64);
  CHECK(t.explicit_cfg.num_query_groups == 2);
  // llama3-8b at tp 8 (its 8 query groups, one per rank): Meta-Llama-3-8B's config.json and its
  // 8,030,261,248 parameters (HF's count; the vocabulary 128256 is a multiple of 128: no padding).
  c.model = "llama3-8b";
  c.tp = 8;
  c.seq = 128;
  const GptConfig e = resolve_train_config(c, 8).model;
  CHECK(std::tuple(e.n_layer, e.n_head, e.kv_heads(), e.n_embd, e.ffn_size(), e.vocab, e.max_seq) ==
        std::tuple(32, 32, 8, 4096, 14336, 128256, 8192));
  CHECK(e.rope_theta == 500000.0);
  CHECK(!e.rope_scaling.llama3);
  CHECK(!e.tied_embeddings);
  CHECK(e.num_params() == 8030261248LL);
  // Llama-3.2-1B: tied head, llama3 scaling with factor 32; 1,235,814,400 parameters.
  c.model = "llama3.2-1b";
  const GptConfig s = resolve_train_config(c, 8).model;
  CHECK(s.tied_embeddings);
  CHECK(s.rope_scaling.llama3);
  CHECK(s.rope_scaling.factor == 32.0);
  CHECK(s.num_params() == 1235814400LL);
  // --rope-scaling-factor overrides the preset's factor, the other scaling values stay.
  c.rope_scaling_factor = 8.0;
  CHECK(resolve_train_config(c, 8).model.rope_scaling.factor == 8.0);
  // tp 16 does not divide llama3-8b's 8 query groups.
  c = TrainConfig{};
  c.model = "llama3-8b", c.tp = 16, c.seq = 128;
  CHECK_THROWS_WITH(resolve_train_config(c, 16), Contains("--model llama3-8b") && Contains("--tp 16") &&
                                                     Contains("8 key/value heads (query groups) cannot be split over tp=16"));
}

TEST_CASE("train config: --export-hf of a model no HF file holds is refused before training", "[config][llama]") {
  // Each of these trained to the end and only then failed in the writer (after the last iteration).
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--normalization", "RMSNorm", "--export-hf", "out"}),
                    Contains("--export-hf out") && Contains("GELU MLP") && Contains("--normalization RMSNorm"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--position-embedding-type", "learned_absolute",
                                   "--export-hf", "out"}),
                    Contains("--export-hf out") && Contains("learned_absolute position embedding"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--normalization", "LayerNorm", "--export-hf", "out"}),
                    Contains("--export-hf out") && Contains("normalization must be RMSNorm"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--untie-embeddings-and-output-weights", "--export-hf", "o.st"}),
                    Contains("--export-hf o.st") && Contains("untied head"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "llama-tiny", "--moe-every", "2", "--experts", "2", "--export-hf", "d"}),
                    Contains("--export-hf d") && Contains("MoE layers (--moe-every 2)"));
  CHECK_THROWS_WITH(resolve_flags({"--model", "tiny", "--moe-every", "2", "--experts", "2", "--export-hf", "d.st"}),
                    Contains("MoE layers (--moe-every 2)"));
  // What the writers take still resolves: GPT-2's tied block, the Llama block tied or untied.
  CHECK_NOTHROW(resolve_flags({"--model", "tiny", "--export-hf", "o.st"}));
  CHECK_NOTHROW(resolve_flags({"--model", "llama-tiny", "--export-hf", "d"}));
  CHECK_NOTHROW(resolve_flags({"--model", "llama-tiny", "--untie-embeddings-and-output-weights=false", "--export-hf", "d"}));
  CHECK_NOTHROW(resolve_flags({"--model", "llama-tiny", "--disable-bias-linear=false", "--export-hf", "d"}));
}

TEST_CASE("train config: --tp/--pp lists take the first layout that fits the world", "[config][elastic]") {
  const char* argv[] = {"t", "--tp", "2,1", "--pp", "2,1", "--global-batch-size", "12", "--micro-batch-size", "2"};
  const auto cl = parse_train_command_line(9, argv, "t", "test");
  CHECK(cl.cfg.tp == 2);
  CHECK(cl.cfg.tp_choices == std::vector<int>{2, 1});
  CHECK(cl.cfg.pp_choices == std::vector<int>{2, 1});
  // The lists print as lists and read back.
  const std::string text = to_toml(cl.cfg);
  CHECK_THAT(text, Contains("tp = [2, 1]") && Contains("pp = [2, 1]"));
  TrainConfig back;
  apply_config_text(back, text, "printed.toml");
  CHECK(back.tp_choices == cl.cfg.tp_choices);
  // World 8: tp 2 x pp 2 x dp 2 (the first pair). World 6: tp 2 x pp 2 does not divide 6, tp 2 x pp 1
  // gives dp 3 (12 = 2 x 3 x 2). World 3: only tp 1 x pp 1 (dp 3). World 2: tp 2 x pp 1 (dp 1).
  auto layout = [&](int world) {
    const ResolvedTrainConfig r = resolve_train_config(cl.cfg, world);
    CHECK(r.explicit_cfg.tp_choices == cl.cfg.tp_choices);  // the resolved file re-resolves elsewhere
    return std::tuple{r.explicit_cfg.tp, r.explicit_cfg.pp, r.dp};
  };
  CHECK(layout(8) == std::tuple{2, 2, 2});
  CHECK(layout(6) == std::tuple{2, 1, 3});
  CHECK(layout(3) == std::tuple{1, 1, 3});
  CHECK(layout(2) == std::tuple{2, 1, 1});
  // World 5: nothing fits; one message with every pair and why.
  CHECK_THROWS_WITH(resolve_train_config(cl.cfg, 5),
                    Contains("no layout of --tp 2,1 and --pp 2,1 fits a world of 5 ranks") &&
                        Contains("tp 2 x pp 2: the world of 5 ranks is not divisible by tp 2 x pp 2 = 4") &&
                        Contains("tp 1 x pp 1:") && Contains("12"));
  // With the hosts known, a tp group across hosts moves on to the next size: two hosts of 2 ranks,
  // --tp 4,2 --pp 1 takes tp 2 (tp 4 would span both).
  TrainConfig h = cl.cfg;
  h.tp_choices = {4, 2}, h.tp = 4, h.pp_choices.clear(), h.pp = 1, h.global_batch = 8;
  const ResolvedTrainConfig rh = resolve_train_config(h, 4, {}, {"a", "a", "b", "b"});
  CHECK(rh.explicit_cfg.tp == 2);
  CHECK(resolve_train_config(h, 4).explicit_cfg.tp == 4);  // hosts unknown: the grid checks later
  h.allow_tp_across_hosts = true;
  CHECK(resolve_train_config(h, 4, {}, {"a", "a", "b", "b"}).explicit_cfg.tp == 4);
  // A size listed twice, or 0, is refused where it is given.
  TrainConfig c;
  CHECK_THROWS_WITH(apply_config_text(c, "[parallel]\ntp = [2, 2]\n", "r.toml"), Contains("r.toml:2") && Contains("listed twice"));
  CHECK_THROWS_WITH(apply_config_text(c, "[parallel]\npp = [2, 0]\n", "r.toml"), Contains("out of range"));
}
