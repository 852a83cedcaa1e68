// Hostile sizes in configuration resolution (issue 24, items 6 and 7): every flag combination that
// used to wrap an int (SIGFPE, "-2147483648 virtual stages", "global batch -2") or build for
// minutes is refused by resolve_train_config at once with one ConfigError naming the flags, and
// no message shows a negative number. A NUL in a config string names its key.
#include <catch2/catch.hpp>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "triax/config/train_config.h"

using namespace triax;
using Catch::Contains;

namespace {

struct Hostile {
  int world;
  std::vector<std::string> flags;
  std::string expected;  // a substring of the ConfigError
};

std::string resolve_error(const Hostile& h) {
  std::vector<const char*> argv{"train_gpt"};
  for (const auto& f : h.flags) argv.push_back(f.c_str());
  const CommandLine cl = parse_train_command_line(static_cast<int>(argv.size()), argv.data(), "train_gpt", "");
  try {
    (void)resolve_train_config(cl.cfg, h.world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("hostile sizes are refused at resolution with one message and no wrapped number", "[config]") {
  const std::string max_int = "2147483647";
  const std::vector<Hostile> table = {
      // tp x pp = 2^32 wrapped to 0 and divided the world by it (SIGFPE).
      {4, {"--tp", "65536", "--pp", "65536"}, "not divisible by tp 65536 x pp 65536 = 4294967296"},
      {4, {"--tp", "65536", "--pp", "65536", "--dp", "65536"}, "tp x pp x dp = 65536 x 65536 x 65536 = 281474976710656"},
      {4, {"--tp", max_int, "--pp", max_int, "--dp", max_int}, "tp x pp x dp = 2147483647 x 2147483647 x 2147483647"},
      // pp x vpp = 2^32 (SIGFPE) and 2^31 ("-2147483648 virtual stages").
      {4, {"--pp", "4", "--vpp", "1073741824", "--schedule", "interleaved"}, "pp x vpp (virtual pipeline stages) = 4 x 1073741824"},
      {2, {"--pp", "2", "--vpp", "1073741824", "--schedule", "interleaved"}, "= 2147483648 is too large"},
      // A huge but divisible split is bounded by the schedule before its list of stages is built.
      {4, {"--pp", "4", "--vpp", "268435456", "--schedule", "interleaved", "--num-layers", "1073741824"}, "over 2^24"},
      // Batches: the products wrapped to a negative global batch.
      {2, {"--micro-batch-size", "4611686018427387904", "--num-micro-batches", "2"}, "micro-batch x dp x micro-batches ="},
      {1, {"--micro-batch-size", "9223372036854775807"}, "is too large"},
      {2, {"--global-batch-size", "9223372036854775806", "--num-micro-batches", "9223372036854775807"}, "dp x micro-batches ="},
      {1, {"--global-batch-size", "4611686018427387904", "--micro-batch-size", "1"}, "micro-batches per iteration is too many"},
      {1, {"--micro-batch-size", "67108864"}, "micro-batch x seq-length (tokens per micro-batch) = 67108864 x 64"},
      // Shapes whose derived sizes do not fit an int ("dimension -16").
      {1, {"--hidden-size", "1073741824", "--num-attention-heads", "1"}, "the MLP size 4 x --hidden-size = 4 x 1073741824"},
      {1, {"--hidden-size", max_int, "--num-attention-heads", "1", "--ffn-hidden-size", "4"}, "QKV projection's rows 3 x --hidden-size"},
      {1, {"--vocab-size", max_int}, "--vocab-size 2147483647 padded to a multiple of lcm(64, tp 1) = 64 is 2147483648"},
      {2, {"--vocab-size", "2147483600", "--tp", "2", "--num-attention-heads", "4"}, "lcm(64, tp 2) = 64"},
      // The default micro-batch count 2 x pp for a pp no world can hold.
      {1, {"--pp", max_int}, "not divisible by tp 1 x pp 2147483647"},
  };
  const std::regex negative(R"((^|[^0-9A-Za-z_^])-[0-9])");
  for (const Hostile& h : table) {
    CAPTURE(h.world, h.flags);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string what = resolve_error(h);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CAPTURE(what);
    CHECK_THAT(what, Contains(h.expected));
    CHECK_FALSE(std::regex_search(what, negative));
    CHECK(s < 1.0);
  }
}

TEST_CASE("sizes just inside the limits still resolve", "[config]") {
  TrainConfig c;
  c.pp = 2, c.vpp = 2, c.schedule = ScheduleKind::interleaved;
  c.micro_batch = 1, c.num_micro_batches = 2;
  const ResolvedTrainConfig r = resolve_train_config(c, 2);
  CHECK(r.stage_layers == std::vector<int>{2, 2, 2, 2});
  TrainConfig v;
  v.vocab = 2147483584;  // the largest multiple of 64 an int holds: no padding needed
  CHECK(resolve_train_config(v, 1).model.padded_vocab(1) == 2147483584);
}

TEST_CASE("a NUL character in a config string names the key and the position", "[config]") {
  TrainConfig c;
  const std::string text = std::string("data = \"ab\\u0000cd\"\n");
  try {
    apply_config_text(c, text, "run.toml");
    FAIL("a NUL in a string was accepted");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find('\0') == std::string::npos);
    CHECK_THAT(what, Contains("run.toml:1: data = \"ab\\u0000cd\": a NUL character (\\u0000) at position 2"));
  }
  // In a choice too (before the "not a known value" check, which printed an empty-looking name).
  CHECK_THROWS_WITH(apply_config_text(c, "model = \"\\u0000tiny\"\n", "m.toml"), Contains("m.toml:1: model") &&
                                                                                    Contains("NUL character"));
}

TEST_CASE("a raw NUL byte in a config file names the line, the column and the key", "[config]") {
  TrainConfig c;
  const std::string text = std::string("tp = 1\ndata = \"ab", 17) + std::string(1, '\0') + "cd\"\n";
  try {
    apply_config_text(c, text, "run.toml");
    FAIL("a NUL byte was accepted");
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    CHECK(what.find('\0') == std::string::npos);
    CHECK_THAT(what, Contains("run.toml:2:11: a NUL byte in the value of key 'data'"));
  }
}
