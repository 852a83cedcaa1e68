// A validation token file for a multi-rank trainer test (one per rank, removed with it), and the
// validation losses of a training run that evaluates it.
#pragma once
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "support/multirank.h"
#include "triax/data/data.h"
#include "triax/io/token_shard.h"
#include "triax/train/trainer.h"

namespace triax::test {

struct ValidTokenFile {
  std::filesystem::path dir;
  std::string path;
  // n tokens of the synthetic corpus of the preset's vocabulary (seed 77), from sample 1000.
  ValidTokenFile(const std::string& tag, const std::string& preset, int n) {
    dir = std::filesystem::temp_directory_path() / fmt::format("triax_{}_valid_{}_{}", tag, ::getpid(), world().rank());
    std::filesystem::create_directories(dir);
    auto gen = make_synthetic_dataset(GptConfig::preset(preset).vocab, 77, 0.05);
    std::vector<int32_t> s(static_cast<size_t>(n));
    gen->sample(1000, n - 1, s.data());
    path = (dir / "valid.bin").string();
    io::write_token_shard(path, std::vector<uint16_t>(s.begin(), s.end()));
  }
  ~ValidTokenFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  ValidTokenFile(const ValidTokenFile&) = delete;
  ValidTokenFile& operator=(const ValidTokenFile&) = delete;
};

inline std::vector<double> eval_losses(std::shared_ptr<Communicator> w, const TrainConfig& cfg) {
  Trainer t(std::move(w), cfg);
  std::vector<double> losses;
  t.train([](const IterationMetrics&) {}, [&](const EvalMetrics& e) { losses.push_back(e.loss); });
  return losses;
}

}  // namespace triax::test
