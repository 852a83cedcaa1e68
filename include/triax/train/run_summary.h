// What a run is (the first lines of its output) and what it did (the summary at its end):
// printed by rank 0 of train_gpt (docs/TRAINING.md, "Output").
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "triax/train/trainer.h"

namespace triax {

// The per-rank peak rate MFU is measured against, and where it comes from.
struct PeakRate {
  double tflops = 0;   // per rank
  std::string source;  // e.g. "the cpu-local cluster preset's fp32 rate (docs/PLANNER.md)"
};
// The planner's cluster preset for the backend: cpu-local (the measured single-thread sgemm rate)
// on the CPU backends, dgx-h100 (H100 SXM, dense bf16 or fp32 by the compute type) on cuda.
PeakRate peak_rate(const TrainConfig& cfg);

// The first lines of a run's output, '#' comments (the resolved configuration that follows stays a
// --config file): the model (preset, block, parameters), the layout, the data, and where metrics
// and checkpoints go.
std::string describe_run(Trainer& trainer);

// The end-of-run summary: fed every iteration and validation pass of this run, printed at its end.
class RunSummary {
 public:
  explicit RunSummary(Trainer& trainer);  // at the trainer's iteration (a resume's)
  void add(const IterationMetrics& m);
  void add(const EvalMetrics& e);
  void set_checkpoint(std::string dir) { checkpoint_ = std::move(dir); }
  void set_exit_reason(std::string why) { exit_reason_ = std::move(why); }
  // " run summary | key: value" lines; wall_s: the process's wall time so far.
  std::string text(double wall_s) const;
  std::string json(double wall_s) const;  // {"event":"run_summary","iterations":...}

  int64_t iterations() const { return iterations_; }
  double tokens() const { return tokens_; }

 private:
  int64_t train_iters_, start_iteration_, last_iteration_;
  int seq_;
  double flops_per_token_;
  int ranks_;
  PeakRate peak_;
  std::string save_;
  int64_t iterations_ = 0;
  double tokens_ = 0, train_s_ = 0;
  std::optional<double> final_loss_, final_valid_, best_valid_;
  int64_t final_valid_it_ = 0, best_valid_it_ = 0;
  std::string checkpoint_, exit_reason_ = "completed";
};

}  // namespace triax
