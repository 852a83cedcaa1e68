// The first lines of train_gpt's output (what the run is) and its end-of-run summary.
#include "triax/train/run_summary.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "triax/core/dtype.h"
#include "triax/plan/cluster.h"

namespace triax {

PeakRate peak_rate(const TrainConfig& cfg) {
  const bool fp32 = !cfg.bf16 && !cfg.fp16;
  if (cfg.backend == "cuda") {
    const plan::Cluster c = plan::cluster_preset("dgx-h100");
    return {fp32 ? c.peak_tflops_fp32 : c.peak_tflops_bf16,
            fmt::format("the dgx-h100 cluster preset's dense {} rate of an H100 SXM (docs/PLANNER.md)",
                        fp32 ? "fp32" : "bf16")};
  }
  const plan::Cluster c = plan::cluster_preset("cpu-local");
  return {c.peak_tflops_fp32, "the cpu-local cluster preset's rate, a single-thread OpenBLAS sgemm (docs/PLANNER.md)"};
}

std::string describe_run(Trainer& t) {
  const TrainConfig& c = t.config();
  const GptConfig& m = t.model_config();
  const GridShape g = t.grid().layout().shape();
  std::string s = fmt::format("# run: model {}: {}; block {}, {} MLP, {} positions\n", c.model, m.describe(),
                              enum_name(m.norm), m.swiglu ? "SwiGLU" : "GELU", enum_name(m.positions));
  s += fmt::format("# run: layout {} ranks = tp {}{} x pp {} x dp {} (vpp {}, ep {}), schedule {}, ZeRO {}{}, "
                   "backend {} ({})\n", t.grid().world().size(), g.tp,
                   g.cp > 1 ? fmt::format(" x cp {} ({})", g.cp, c.cp_comm_type) : std::string(), g.pp, g.dp, c.vpp, c.ep,
                   enum_name(c.schedule), c.zero,
                   c.zero_shard_size > 0 ? fmt::format(" (HSDP groups of {})", c.zero_shard_size) : std::string(), c.backend,
                   c.bf16 ? "bf16" : c.fp16 ? "fp16" : "fp32");
  s += fmt::format("# run: data {}; {}\n", t.train_data().describe(),
                   c.valid_data.empty() || c.eval_interval == 0
                       ? std::string("no validation")
                       : fmt::format("validation {} every {} iterations ({} batches)", c.valid_data, c.eval_interval,
                                     c.eval_iters));
  std::string metrics = "standard output (one line per iteration)";
  if (!c.metrics_jsonl.empty()) metrics += ", --metrics-jsonl " + c.metrics_jsonl;
  if (c.metrics_port) metrics += fmt::format(", Prometheus on port {}", *c.metrics_port);
  if (!c.metrics_textfile.empty()) metrics += ", --metrics-textfile " + c.metrics_textfile;
  const std::string ckpt =
      c.save.empty() ? std::string("not saved (no --save)")
                     : fmt::format("{} ({}at the end and on SIGTERM/SIGUSR1)", c.save,
                                   c.save_interval > 0 ? fmt::format("every {} iterations, ", c.save_interval) : "");
  s += fmt::format("# run: metrics to {}; checkpoints {}{}\n", metrics, ckpt,
                   c.load.empty() ? "" : fmt::format(", resumed from --load {}", c.load));
  return s;
}

RunSummary::RunSummary(Trainer& t)
    : train_iters_(t.config().train_iters),
      start_iteration_(t.iteration()),
      last_iteration_(t.iteration()),
      seq_(t.seq_length()),
      flops_per_token_(t.flops_per_token()),
      ranks_(t.grid().world().size()),
      peak_(peak_rate(t.config())),
      save_(t.config().save) {}

void RunSummary::add(const IterationMetrics& m) {
  ++iterations_;
  last_iteration_ = m.iteration;
  tokens_ += static_cast<double>(m.global_batch) * seq_;
  train_s_ += m.elapsed_ms / 1e3;
  final_loss_ = m.loss;
}

void RunSummary::add(const EvalMetrics& e) {
  final_valid_ = e.loss;
  final_valid_it_ = e.iteration;
  if (!best_valid_ || e.loss < *best_valid_) best_valid_ = e.loss, best_valid_it_ = e.iteration;
}

std::string RunSummary::text(double wall_s) const {
  const double tps = train_s_ > 0 ? tokens_ / train_s_ : 0;
  const double tflops = tps * flops_per_token_ / ranks_ / 1e12;
  std::string s;
  auto line = [&](std::string_view key, const std::string& value) { s += fmt::format(" run summary | {}: {}\n", key, value); };
  line("exit reason", exit_reason_);
  line("iterations", iterations_ > 0 ? fmt::format("{} ({} to {} of --train-iters {})", iterations_,
                                                    start_iteration_ + 1, last_iteration_, train_iters_)
                                     : fmt::format("0 (none run: at iteration {} of --train-iters {})",
                                                   last_iteration_, train_iters_));
  line("tokens", fmt::format("{:.0f}", tokens_));
  line("wall time", fmt::format("{} ({:.1f} s; iterations {:.3f} s)", format_duration(wall_s), wall_s, train_s_));
  line("mean throughput (tokens/s)", fmt::format("{:.0f}", tps));
  line("MFU", fmt::format("{:.2f}% ({:.4f} model TFLOP/s per rank of a peak {} TFLOP/s per rank: {})",
                          100 * tflops / peak_.tflops, tflops, peak_.tflops, peak_.source));
  if (final_loss_) line("last training loss", fmt::format("{:.6E}", *final_loss_));
  line("validation loss", final_valid_ ? fmt::format("final {:.6E} (iteration {}), best {:.6E} (iteration {})",
                                                     *final_valid_, final_valid_it_, *best_valid_, best_valid_it_)
                                       : std::string("none (no validation pass ran)"));
  line("last checkpoint", !checkpoint_.empty() ? checkpoint_
                          : save_.empty()      ? std::string("none (no --save)")
                                               : std::string("none written by this run"));
  return s;
}

std::string RunSummary::json(double wall_s) const {
  const double tps = train_s_ > 0 ? tokens_ / train_s_ : 0;
  nlohmann::json j;
  j["event"] = "run_summary";
  j["exit_reason"] = exit_reason_;
  j["iterations"] = iterations_;
  j["last_iteration"] = last_iteration_;
  j["tokens"] = tokens_;
  j["wall_s"] = wall_s;
  j["train_s"] = train_s_;
  j["tokens_per_s"] = tps;
  j["mfu"] = tps * flops_per_token_ / ranks_ / 1e12 / peak_.tflops;
  j["peak_tflops_per_rank"] = peak_.tflops;
  if (final_loss_) j["final_loss"] = *final_loss_;
  if (final_valid_) j["final_valid_loss"] = *final_valid_, j["best_valid_loss"] = *best_valid_;
  if (!checkpoint_.empty()) j["checkpoint"] = checkpoint_;
  return j.dump();
}

}  // namespace triax
