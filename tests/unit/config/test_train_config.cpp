// The training configuration module: every option round-trips through its sectioned TOML text
// (and the same values as flags, or as a flat file, give the same configuration), typos and keys
// in the wrong section get the nearest key and the right section, unset differs from 0, and
// resolve_train_config fills in what was derived.
#include <catch2/catch.hpp>

#include "triax/config/train_config.h"

#include <map>
#include <sstream>

using namespace triax;
using Catch::Contains;

namespace {

// A configuration in which every option differs from its default.
TrainConfig unusual() {
  TrainConfig c;
  c.model = "nano";
  c.layers = 6, c.heads = 2, c.hidden = 32, c.ffn = 96, c.vocab = 300, c.max_seq = 48, c.seq = 40;
  c.tp = 2, c.pp = 3, c.dp = 5, c.vpp = 2;
  c.order = "dp-tp-pp";
  c.allow_tp_across_hosts = true;
  c.pipeline_layers = {1, 2, 3};
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
  c.zero1 = true;
  c.bucket_mb = 0.125;
  c.overlap_grad_reduce = false;
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
  c.save = "ck pts", c.save_interval = 25, c.keep_last = 5, c.load = "old/ckpts";
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
  CHECK(cl.cfg.zero1);
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
  CHECK(printed == train_options().size());
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
  CHECK(flags.size() == train_options().size());
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
