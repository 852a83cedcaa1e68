// Real data across layouts: training on a shuffled Megatron corpus (samples inside documents)
// and validating on an llm.c shard give the same training losses and the same validation loss
// and perplexity at every tp x pp x dp layout as one process; evaluation does not disturb
// training; each DP rank reads only its own samples and middle pipeline stages read none.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "support/multirank.h"
#include "support/train_compare.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/indexed_dataset.h"
#include "triax/io/token_shard.h"
#include "triax/train/trainer.h"

using namespace triax;

namespace {

constexpr int kVocab = 67;  // the nano preset's

// Every rank writes the same files into its own directory (the generator is seeded).
struct Files {
  std::filesystem::path dir;
  std::string train, valid;
  Files() {
    dir = std::filesystem::temp_directory_path() /
          fmt::format("triax_valid_{}_{}", ::getpid(), test::world().rank());
    std::filesystem::create_directories(dir);
    // A learnable language: documents of 20..90 tokens walking a successor table.
    auto gen = make_synthetic_dataset(kVocab, 77, 0.05);
    std::vector<std::vector<int32_t>> docs;
    for (int d = 0; d < 60; ++d) {
      const int len = 20 + (d * 37) % 71;
      std::vector<int32_t> t(static_cast<size_t>(len));
      gen->sample(d, len - 1, t.data());
      docs.push_back(std::move(t));
    }
    std::vector<std::span<const int32_t>> spans(docs.begin(), docs.end());
    train = (dir / "train_text_document").string();
    io::write_indexed_dataset(train, spans);
    std::vector<uint16_t> v(400);
    std::vector<int32_t> s(400);
    gen->sample(1000, 399, s.data());
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(s[i]);
    valid = (dir / "valid.bin").string();
    io::write_token_shard(valid, v);
  }
  ~Files() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

TrainConfig base(const Files& f) {
  TrainConfig c = test::nano_train_config(4, 3e-3, 99);
  c.data = f.train;
  c.data_respect_eod = true;
  c.valid_data = f.valid;
  c.eval_interval = 2;
  c.eval_iters = 3;
  return c;
}

struct Run {
  std::vector<double> losses;
  std::vector<EvalMetrics> evals;
  int64_t samples_read = 0;
  bool first_or_last = false;
};

Run run(std::shared_ptr<Communicator> world, const TrainConfig& cfg) {
  Trainer t(std::move(world), cfg);
  Run r;
  t.train([&](const IterationMetrics& m) { r.losses.push_back(m.loss); },
          [&](const EvalMetrics& e) { r.evals.push_back(e); });
  r.samples_read = t.train_data().samples_read();
  r.first_or_last = t.grid().is_first_stage() || t.grid().is_last_stage();
  return r;
}

}  // namespace

TEST_CASE("validation loss and training on real data are the same at every layout", "[train][data]") {
  const int W = test::world().size();
  Files files;
  const TrainConfig cfg = base(files);
  TrainConfig serial_cfg = cfg;
  serial_cfg.dp = 1;
  const Run ref = run(std::shared_ptr<Communicator>(make_self_communicator("serial", test::world().rank())), serial_cfg);
  REQUIRE(ref.evals.size() == 2);
  CHECK(ref.evals[0].iteration == 2);
  CHECK(ref.evals[1].iteration == 4);
  CHECK(ref.evals[0].samples == 3 * 8);
  CHECK(ref.evals[1].loss < ref.evals[0].loss);  // the model learned the language
  CHECK(ref.evals[0].loss < std::log(kVocab));
  CHECK(ref.evals[0].ppl == Approx(std::exp(ref.evals[0].loss)).epsilon(1e-12));
  CHECK_THAT(ref.evals[0].log_line(), Catch::Matchers::Contains(fmt::format(
                 "validation loss at iteration 2 | lm loss value: {:.6E} | lm loss PPL: {:.6E} |", ref.evals[0].loss,
                 ref.evals[0].ppl)));
  // Evaluation leaves training alone: the same run without it has the same losses.
  TrainConfig no_eval = serial_cfg;
  no_eval.eval_interval = 0;
  const Run plain = run(std::shared_ptr<Communicator>(make_self_communicator("serial", test::world().rank())), no_eval);
  CHECK(plain.losses == ref.losses);

  struct Layout { int tp, pp, vpp; const char* schedule; bool sp; };
  std::vector<Layout> layouts;
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 4}) {
      if (W % (tp * pp) != 0 || 4 % tp != 0) continue;
      layouts.push_back({tp, pp, 1, pp > 1 ? "1f1b" : "gpipe", tp > 1});
      if (pp == 2) layouts.push_back({tp, pp, 2, "interleaved", false});
    }
  for (const auto& l : layouts) {
    TrainConfig c = cfg;
    c.tp = l.tp;
    c.pp = l.pp;
    c.vpp = l.vpp;
    c.dp = W / (l.tp * l.pp);
    c.schedule = parse_schedule_kind(l.schedule);
    c.sequence_parallel = l.sp;
    INFO("tp " << c.tp << " pp " << c.pp << " dp " << *c.dp << " vpp " << c.vpp << " " << l.schedule);
    const Run got = run(test::world_ptr(), c);
    REQUIRE(got.losses.size() == ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i) CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(1e-5));
    REQUIRE(got.evals.size() == ref.evals.size());
    for (size_t i = 0; i < ref.evals.size(); ++i) {
      CHECK(got.evals[i].iteration == ref.evals[i].iteration);
      CHECK(got.evals[i].loss == Approx(ref.evals[i].loss).epsilon(1e-5));
      CHECK(got.evals[i].ppl == Approx(ref.evals[i].ppl).epsilon(1e-4));
    }
    // Reads: first/last stages read exactly this DP rank's share of every iteration's batch.
    CHECK(got.samples_read == (got.first_or_last ? cfg.train_iters * *cfg.global_batch / *c.dp : 0));
  }
}

TEST_CASE("validation configuration errors name the problem", "[train][data]") {
  Files files;
  TrainConfig c = base(files);
  c.valid_data.clear();
  CHECK_THROWS_WITH(Trainer(test::world_ptr(), c), Catch::Matchers::Contains("no validation set") &&
                                                       Catch::Matchers::Contains("--valid-data"));
  c = base(files);
  c.valid_data = (files.dir / "missing_valid.bin").string();
  CHECK_THROWS_WITH(Trainer(test::world_ptr(), c), Catch::Matchers::Contains("missing_valid.bin"));
  c = base(files);
  c.eval_iters = 0;
  CHECK_THROWS_WITH(Trainer(test::world_ptr(), c), Catch::Matchers::Contains("eval-iters = 0") && Catch::Matchers::Contains(">= 1"));
  // A validation set shorter than one sample: named, with its token count.
  io::write_token_shard((files.dir / "tiny.bin").string(), std::vector<uint16_t>{1, 2, 3});
  c = base(files);
  c.valid_data = (files.dir / "tiny.bin").string();
  CHECK_THROWS_WITH(Trainer(test::world_ptr(), c), Catch::Matchers::Contains("tiny.bin") &&
                                                       Catch::Matchers::Contains("3 tokens"));
  // A validation token outside the model's vocabulary, named with file and byte offset when read.
  io::write_token_shard((files.dir / "big.bin").string(), std::vector<uint16_t>(40, 200));
  c = base(files);
  c.valid_data = (files.dir / "big.bin").string();
  c.eval_interval = 1;
  c.train_iters = 1;
  Trainer t(test::world_ptr(), c);
  std::string msg;
  try {
    t.evaluate();
  } catch (const IoError& e) {
    msg = e.what();
  }
  // Each DP rank meets the bad token of its own first sample: the offset is 1024 + 2 * position.
  std::smatch mm;
  REQUIRE(std::regex_search(msg, mm, std::regex("big\\.bin: token 200 at position (\\d+) \\(byte offset (\\d+)\\)")));
  CHECK(std::stoll(mm[2]) == 1024 + 2 * std::stoll(mm[1]));
}
