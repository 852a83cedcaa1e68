// Context parallelism's configuration (issue 28): --cp and --cp-comm-type resolve into the layout
// (dp = world / (tp x cp x pp)), and each bad input is one ConfigError naming the problem: a
// sequence not divisible by 2 cp, a layout whose product is not the world, a cp that does not divide
// the world, an unknown exchange, an order naming cp twice, a GPT-2 sequence past its position table.
#include <catch2/catch.hpp>

#include "triax/config/train_config.h"

using namespace triax;
using Catch::Contains;

namespace {
TrainConfig cp_config(int cp) {
  TrainConfig c;
  c.model = "tiny";
  c.cp = cp;
  c.seq = 64;
  return c;
}

// The ConfigError message of parsing these flags (after the program name), or "" when they parse.
std::string flag_error(std::vector<const char*> args) {
  args.insert(args.begin(), "train_gpt");
  try {
    parse_train_command_line(static_cast<int>(args.size()), args.data(), "train_gpt", "test");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("cp resolves into the layout: dp = world / (tp x cp x pp)", "[config][cp]") {
  TrainConfig c = cp_config(2);
  c.tp = 2;
  const ResolvedTrainConfig r = resolve_train_config(c, 8);
  CHECK(r.dp == 2);
  CHECK(r.explicit_cfg.cp == 2);
  CHECK(r.seq == 64);
  // The explicit configuration resolves to itself.
  CHECK(to_toml(resolve_train_config(r.explicit_cfg, 8).explicit_cfg) == to_toml(r.explicit_cfg));
  const char* argv[] = {"t", "--cp", "4", "--cp-comm-type", "allgather"};
  const auto cl = parse_train_command_line(5, argv, "t", "test");
  CHECK(cl.cfg.cp == 4);
  CHECK(cl.cfg.cp_comm_type == "allgather");
  // RoPE has no table: a Llama sequence longer than max_seq is fine (and max_seq follows it).
  TrainConfig llama = cp_config(2);
  llama.model = "llama-tiny";
  llama.seq = 256;
  CHECK(resolve_train_config(llama, 2).model.max_seq == 256);
}

TEST_CASE("a sequence not divisible by 2 cp is refused, naming both", "[config][cp]") {
  TrainConfig c = cp_config(4);
  c.seq = 60;
  CHECK_THROWS_WITH(resolve_train_config(c, 4), Contains("--seq-length 60 is not divisible by 2 x cp = 8"));
  c.cp = 3;
  c.seq = 64;  // an odd cp: 2 x 3 = 6 does not divide 64
  CHECK_THROWS_WITH(resolve_train_config(c, 3), Contains("--seq-length 64 is not divisible by 2 x cp = 6"));
  c.cp = 2;
  c.seq = 62;  // divisible by cp but not by 2 cp
  CHECK_THROWS_WITH(resolve_train_config(c, 2), Contains("--seq-length 62 is not divisible by 2 x cp = 4"));
  c.seq = 60;
  CHECK_NOTHROW(resolve_train_config(c, 2));
}

TEST_CASE("a layout that does not multiply to the world, or a cp that does not divide it, is refused", "[config][cp]") {
  TrainConfig c = cp_config(2);
  c.tp = 2;
  c.dp = 3;
  CHECK_THROWS_WITH(resolve_train_config(c, 8), Contains("tp x cp x pp x dp = 2 x 2 x 1 x 3 = 12 but the world has 8 ranks"));
  c.dp.reset();
  c.tp = 1;
  CHECK_THROWS_WITH(resolve_train_config(c, 3), Contains("the world of 3 ranks is not divisible by tp 1 x cp 2 x pp 1 = 2"));
  c.cp = 4;
  c.pp = 2;
  CHECK_THROWS_WITH(resolve_train_config(c, 4), Contains("the world of 4 ranks is not divisible by tp 1 x cp 4 x pp 2 = 8"));
  CHECK_THROWS_WITH(resolve_train_config(cp_config(0), 1), Contains("cp = 0"));
}

TEST_CASE("an unknown --cp-comm-type or an order naming cp twice is refused, naming the value", "[config][cp]") {
  TrainConfig c = cp_config(2);
  c.cp_comm_type = "ring";
  CHECK_THROWS_WITH(resolve_train_config(c, 2), Contains("cp-comm-type = 'ring'") && Contains("p2p, allgather"));
  CHECK_THAT(flag_error({"--cp-comm-type", "a2a"}), Contains("\"a2a\"") && Contains("p2p, allgather"));
  CHECK_THAT(flag_error({"--cp", "0"}), Contains("--cp 0: out of range; expected an integer >= 1"));
  CHECK_THAT(flag_error({"--cp", "two"}), Contains("two"));
  c.cp_comm_type = "p2p";
  c.order = "tp-cp-cp-pp";
  CHECK_THROWS_WITH(resolve_train_config(c, 2), Contains("order = 'tp-cp-cp-pp'"));
  CHECK_THAT(flag_error({"--order", "cp-tp-cp-dp"}), Contains("cp-tp-cp-dp"));
  CHECK(flag_error({"--order", "tp-cp-dp-pp", "--cp", "2"}).empty());
}

TEST_CASE("GPT-2's learned positions bound the sequence under cp too", "[config][cp]") {
  TrainConfig c = cp_config(2);
  c.seq = 128;  // tiny's table has 64 rows
  CHECK_THROWS_WITH(resolve_train_config(c, 2), Contains("--seq-length 128 exceeds the model's position table"));
}
