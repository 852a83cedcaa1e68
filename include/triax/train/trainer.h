// Trainer: TP x PP x DP training of a GPT on the CPU path. Builds the process grid, this
// stage's model chunks (virtual stages c*p + s), the optimizer (overlapped DP buckets or
// ZeRO-1), and runs iterations: pipeline schedule -> DP gradient sync -> clip -> AdamW, with
// Megatron-style metrics. Every layout trains the same model as one process (tests prove it).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "triax/train/timeline.h"
#include "triax/backend/backend.h"
#include "triax/distributed/grid.h"
#include "triax/model/gpt.h"
#include "triax/optim/lr_schedule.h"
#include "triax/optim/optimizer.h"
#include "triax/pipeline/executor.h"
#include "triax/pipeline/schedule.h"
#include "triax/config/batch.h"
#include "triax/config/train_config.h"
#include "triax/data/data.h"
#include "triax/faults/fault_checks.h"
#include "triax/faults/fault_injection.h"
#include "triax/faults/watchdog.h"
#include "triax/train/memory_plan.h"

namespace triax {

// seconds as "H:MM:SS" (rounded; negative as 0): the ETA and the run summary's times.
std::string format_duration(double seconds);

struct IterationMetrics {
  int64_t iteration = 0;          // 1-based
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;   // after this iteration
  double elapsed_ms = 0;
  double tokens_per_s = 0;
  double tflops = 0;              // model FLOPs per second per rank, in TFLOP/s
  double lr = 0;
  int64_t global_batch = 0;
  int64_t micro_batches = 0;
  double loss = 0;                // LM loss, mean over the global batch
  double moe_aux_loss = 0;        // load-balancing loss, mean over MoE layers and micro-batches
  bool moe = false;
  double grad_norm = 0;
  int64_t skipped = 0;            // skipped iterations so far
  double dp_exposed_ms = 0;       // DP gradient communication not hidden behind backward
  double dp_comm_ms = 0;          // DP collectives' span
  double p2p_wait_ms = 0;         // this rank's wait for pipeline receives and sends
  double compute_ms = 0;
  // ZeRO-3 only (zero3): the step's unit all-gathers, max over ranks: the time compute waited for
  // them (blocking gathers and waits on prefetches) and their issue-to-completion time in all.
  bool zero3 = false;
  double zero3_gather_exposed_ms = 0;
  double zero3_gather_ms = 0;
  double zero3_hidden() const { return zero3_gather_ms > 0 ? 1.0 - zero3_gather_exposed_ms / zero3_gather_ms : 0.0; }
  // Context parallelism only (cp, --cp > 1): the step's K/V (and dK/dV) exchanges of the ring or
  // all-gather attention (ContextParallel::stats()), max over ranks: the time attention waited for
  // them, and their issue-to-completion time in all.
  bool cp = false;
  double cp_exposed_ms = 0;
  double cp_exchange_ms = 0;
  double cp_hidden() const { return cp_exchange_ms > 0 ? 1.0 - cp_exposed_ms / cp_exchange_ms : 0.0; }
  // The backend allocator's high-water mark since start-up, the largest over the ranks (bytes):
  // what the planner's memory model predicts (device memory on --backend cuda).
  int64_t peak_mem_bytes = 0;
  bool step_skipped = false;      // this iteration's step was skipped (non-finite gradient norm)
  int nonfinite_rank = -1;        // first world rank with a non-finite gradient (skipped steps)
  std::string nonfinite_param;    // and its parameter
  double loss_zscore = 0;         // against the recent window (NaN until known)
  bool loss_spike = false;
  std::vector<int> stragglers;    // world ranks persistently slower than the median
  // Seconds to --train-iters at the mean iteration time of this run so far (0 at the last).
  double eta_s = 0;
  // "iteration 3/50 | consumed samples: 96 | elapsed time per iteration (ms): ..." (Megatron's names)
  std::string log_line() const;
  std::string json() const;
};

// One validation pass: the mean LM loss over eval_iters global batches of the validation set.
struct EvalMetrics {
  int64_t iteration = 0;  // training iterations done when it ran
  double loss = 0;
  double ppl = 0;         // exp(loss), capped at exp(20) like Megatron
  int64_t samples = 0;
  int64_t tokens = 0;     // samples x seq-length
  double seconds = 0;     // the pass's wall time (the slowest rank)
  // Megatron's block: a rule, " validation loss at iteration N | lm loss value: ... | lm loss PPL: ... |", a rule.
  std::string log_line() const;
  std::string json() const;  // {"iteration":N,"valid_loss":...,"valid_ppl":...,"valid_samples":...}
};

// cfg with the model shape of --init-from's file filled in where the flags leave it open.
TrainConfig with_init_from_shape(const TrainConfig& cfg);

// What tests choose beside the configuration (no option of a run).
struct TrainerOptions {
  // A separate compute copy of the masters' own type (ParamStore::finalize's force_compute_copy),
  // as mixed precision keeps one in bf16/fp16: training with it equals training without it
  // exactly when the copy is refreshed and gathered wherever the masters change (tested on the CPU).
  bool force_compute_copy = false;
  // fp16's dynamic loss scaler in any precision (the Trainer turns it on for --fp16 by itself): a
  // power-of-two scale leaves fp32 training's bits unchanged, and an injected NaN shows the skip.
  std::optional<LossScalerConfig> loss_scaler;
};

class Trainer {
 public:
  // Collective over world: resolves and validates the whole configuration with
  // resolve_train_config (ConfigError with the numbers for anything inconsistent), builds the
  // grid, the model chunks and the optimizer.
  Trainer(std::shared_ptr<Communicator> world, const TrainConfig& cfg, const TrainerOptions& opts = {});
  ~Trainer();

  // One iteration (collective). Returns the same metrics on every rank.
  IterationMetrics step(bool record_events = false);
  // All remaining iterations; on_iteration is called after each.
  // With eval_interval > 0, also evaluates after every eval_interval-th iteration (on_eval).
  // should_stop (collective, called after each iteration and its evaluation) ends the run early.
  void train(const std::function<void(const IterationMetrics&)>& on_iteration,
             const std::function<void(const EvalMetrics&)>& on_eval = {},
             const std::function<bool()>& should_stop = {});
  // Validation loss now (collective): forward-only pipeline schedule over eval_iters global
  // batches of the validation set, the same value on every rank and every layout.
  EvalMetrics evaluate();

  // The fully resolved configuration as a TOML file that --config reads back to the same run,
  // with derived facts as comments (printed at start-up by rank 0).
  std::string resolved_config() const;
  // The configuration with every derived value filled in.
  const TrainConfig& config() const { return cfg_; }
  const GptConfig& model_config() const { return model_; }
  ProcessGrid& grid() { return *grid_; }
  ParamStore& store() { return *store_; }
  Backend& backend() { return *backend_; }
  const std::vector<std::unique_ptr<GptChunk>>& chunks() const { return chunks_; }
  const StepResult& last_step() const { return last_; }
  // This rank's own optimizer report of the last step (IterationMetrics hold the max over ranks);
  // benchmarks use it to separate DP communication from waiting for a slower rank.
  const StepReport& last_report() const { return last_report_; }
  const Schedule& last_schedule() const { return *schedule_; }
  int64_t iteration() const { return iteration_; }
  // The target batch plan (global batch, micro-batch, micro-batches per DP replica).
  const BatchPlan& batch_plan() const { return batches_->target(); }
  int seq_length() const { return T_; }
  // The CP exchange timings (null without context parallelism).
  const ContextParallel* context_parallel() const { return cp_.get(); }
  // Samples [start, start + mbs) of ds as this rank's token and target rows (its zigzag chunks
  // under context parallelism).
  void fetch(Dataset& ds, int64_t start, int mbs, std::vector<int32_t>& x, std::vector<int32_t>& y) const;
  // Model FLOPs per token of a training step (forward + backward: 6 N + 6 L h T), what the
  // iteration line's TFLOP/s counts.
  double flops_per_token() const { return flops_per_token_; }
  const Dataset& train_data() const { return *data_; }
  int64_t consumed_samples() const { return consumed_; }
  Optimizer& optimizer() { return *optimizer_; }
  // For checkpoint restore (checkpoint/checkpoint.h): the iteration and consumed samples determine
  // the LR schedule, the batch ramp-up and the data position; the optimizer holds its own counts.
  void restore_progress(int64_t iteration, int64_t consumed_samples);
  // Layers [first, first + count) of virtual stage vs.
  std::pair<int, int> virtual_stage_layers(int vs) const;
  // Called by the watchdog thread when no iteration finished within --stall-timeout (after the
  // flight recorder was dumped); a program ends the job here. Without one the stall is logged.
  void set_stall_handler(Watchdog::StallHandler h) { watchdog_->set_handler(std::move(h)); }
  Watchdog& watchdog() { return *watchdog_; }

 private:
  // The public constructor resolves the configuration once and delegates here.
  Trainer(const std::shared_ptr<Communicator>& world, const ResolvedTrainConfig& r, const TrainerOptions& opts);
  // Construction steps, in order: backend, fault watchers and grid; model chunks and their
  // parameters; optimizer, executor and learning-rate schedule.
  void start_rank(const std::shared_ptr<Communicator>& world, const ResolvedTrainConfig& r);
  // --backend cuda: the rank's device (its local rank among hosts); refuses without one.
  void start_cuda(const std::shared_ptr<Communicator>& world, const std::vector<std::string>& hosts,
                  DType compute);
  void build_model(const ResolvedTrainConfig& r);
  void build_optimizer(const ResolvedTrainConfig& r);
  void open_validation();  // trainer_eval.cpp
  // Non-finite gradients, loss spikes, stragglers, --max-skipped-iterations (after each step).
  void check_step(IterationMetrics& mt, const StepReport& rep, std::span<const double> busy);
  // After the run's third step, or its last if it has fewer (collective): every rank's allocator
  // high-water mark next to the memory model's prediction for it; rank 0 prints the spread and
  // the rank furthest off.
  void report_memory();
  TrainerOptions opts_;
  TrainConfig cfg_;
  GptConfig model_;
  std::unique_ptr<ProcessGrid> grid_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Dataset> valid_;
  std::optional<Schedule> eval_schedule_;
  std::unique_ptr<Backend> backend_;  // before everything that holds its buffers
  std::unique_ptr<ParamStore> store_;
  std::unique_ptr<ContextParallel> cp_;  // --cp > 1: the ring attention of every chunk (outlives them)
  std::vector<std::unique_ptr<GptChunk>> chunks_;
  ZeroGroups zero_groups_;  // ZeRO-2/3 shard groups, from build_model until the optimizer takes them
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<BatchSchedule> batches_;
  std::unique_ptr<LrSchedule> lr_;
  ScheduleKind kind_;
  std::optional<Schedule> schedule_;
  std::vector<int> stage_layers_;  // per virtual stage
  std::unique_ptr<Timeline> timeline_;  // --profile-steps (built on first use in train())
  int T_ = 0;   // the sequence length
  int Tl_ = 0;  // this rank's tokens of a sequence: T_ / cp
  int64_t iteration_ = 0, consumed_ = 0;
  StepResult last_;
  StepReport last_report_;
  double flops_per_token_ = 0;
  double step_s_sum_ = 0;  // this run's iteration times (the ETA's mean)
  int64_t steps_run_ = 0;
  int moe_layers_ = 0;
  RankMemory predicted_memory_;  // the memory model's prediction for this rank (memory_plan.h)
  // Faults (docs/FAULTS.md).
  FaultInjector faults_;
  std::unique_ptr<Watchdog> watchdog_;
  LossSpikeDetector spikes_{0};
  StragglerDetector stragglers_{1.2};
  int64_t consecutive_skips_ = 0;
};

}  // namespace triax
