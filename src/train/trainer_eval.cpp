// Validation: the trainer's forward-only pass over the validation set, run by the training
// executor with a forward-only schedule (make_forward_only), and its Megatron-style report.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>

#include "triax/core/error.h"
#include "triax/train/trainer.h"

namespace triax {

std::string EvalMetrics::log_line() const {
  const std::string body = fmt::format(" validation loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | "
                                       "tokens: {} | time (s): {:.2f} | ", iteration, loss, ppl, tokens, seconds);
  const std::string rule(body.size() + 1, '-');
  return fmt::format("{}\n{}\n{}", rule, body, rule);
}

std::string EvalMetrics::json() const {
  nlohmann::json j;
  j["iteration"] = iteration;
  j["valid_loss"] = loss;
  j["valid_ppl"] = ppl;
  j["valid_samples"] = samples;
  j["valid_tokens"] = tokens;
  j["valid_s"] = seconds;
  return j.dump();
}

void Trainer::open_validation() {
  const auto& c = cfg_;
  require(c.eval_interval >= 0, "--eval-interval {} must be >= 0 (0: no validation)", c.eval_interval);
  require(c.eval_iters >= 1, "--eval-iters {} must be >= 1", c.eval_iters);
  require(c.eval_interval == 0 || !c.valid_data.empty(),
          "--eval-interval {} asks for validation but no validation set was given (--valid-data)", c.eval_interval);
  if (c.valid_data.empty()) return;
  require(c.valid_data != "synthetic", "--valid-data names a file; the synthetic dataset has no held-out split");
  // In file order, no shuffle: every evaluation scores the same samples. Inside documents when
  // training respects them and the validation format has them.
  valid_ = open_dataset(c.valid_data, model_.vocab, c.seed, DataOptions{false, c.data_respect_eod, false});
  if (valid_->num_samples(T_) == 0)
    TRIAX_THROW(IoError, "validation set {} holds no sample of {} + 1 tokens", valid_->describe(), T_);
}

EvalMetrics Trainer::evaluate() {
  require(valid_ != nullptr, "evaluate() needs a validation set (--valid-data)");
  const BatchPlan plan = batches_->target();
  // Each replica its share of the global batch (uneven with --dp-microbatches), as in training.
  const int d = grid_->coord().dp;
  const int m = static_cast<int>(plan.micro_batches_of(d)), mbs = static_cast<int>(plan.micro_batch);
  const int64_t first = plan.first_micro_batch_of(d);
  const double M = static_cast<double>(plan.total_micro_batches());
  if (!eval_schedule_ || eval_schedule_->micro_batches != m) eval_schedule_ = make_forward_only(cfg_.pp, cfg_.vpp, m);
  const bool reporter = grid_->is_last_stage() && grid_->coord().tp == 0;
  const auto t0 = std::chrono::steady_clock::now();
  double sum[1] = {0.0};
  for (int64_t k = 0; k < cfg_.eval_iters; ++k) {
    const int64_t base = k * plan.global_batch;
    auto data = [&](int mb, std::vector<int32_t>& x, std::vector<int32_t>& y) {
      fetch(*valid_, base + (first + mb) * mbs, mbs, x, y);
    };
    const StepResult r = executor_->run(*eval_schedule_, data, nullptr, 1.0f);
    if (reporter) sum[0] += r.loss_sum / M / cfg_.cp;
  }
  for (auto& ch : chunks_) ch->take_aux_loss();  // evaluation forwards are no part of the training loss
  grid_->world().all_reduce(std::span<double>(sum), ReduceOp::sum).wait();
  double seconds[1] = {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  grid_->world().all_reduce(std::span<double>(seconds), ReduceOp::max).wait();
  EvalMetrics e;
  e.iteration = iteration_;
  e.loss = sum[0] / static_cast<double>(cfg_.eval_iters);
  e.ppl = std::exp(std::min(20.0, e.loss));
  e.samples = cfg_.eval_iters * plan.global_batch;
  e.tokens = e.samples * T_;
  e.seconds = seconds[0];
  return e;
}

}  // namespace triax
