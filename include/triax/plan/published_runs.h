// Published measurements of training runs (data/validation/published_runs.csv) and how the planner
// is checked against them: each row predicted on its cluster with the software that ran it, a few
// cluster constants fitted to the rows, and the error on rows left out of the fit (leave-one-out
// and held out by source).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "triax/plan/planner.h"

namespace triax::plan {

// tflops_eq3: TFLOP/s per GPU with Narayanan et al.'s Eq. 3 (recompute included); tflops_model:
// model FLOPs per GPU and second (Megatron-LM's num_floating_point_operations); seconds per iteration.
enum class RunMetric { tflops_eq3, tflops_model, seconds };

struct PublishedRun {
  std::string id, source, where, cluster, software;
  ModelShape model;
  int tp = 1, pp = 1, dp = 1;
  int cp = 1;           // context parallel (column cp; absent or empty: 1), p2p ring
  int micro_batch = 0;  // 0: not published, searched
  int vpp = 0;          // 0: not published, 1f1b and interleaved searched
  Recompute recompute = Recompute::full;
  bool sequence_parallel = false;
  // The `options` column: settings of this run that differ from its software's defaults
  // ("no-dropout", "no-tp-comm-overlap", "no-pp-overlap", "fused-cross-entropy"; ';'-separated).
  bool no_dropout = false, no_tp_comm_overlap = false, no_pp_overlap = false, fused_cross_entropy = false;
  bool fp32_grad_reduce = false;  // option fp32-grad-reduce: gradients accumulated and reduced in fp32
  // Option llama-block sets the model's Llama block choices (SwiGLU, RMSNorm, RoPE without a
  // position table, no biases); column ffn (absent, empty or 0: 4h) the MLP width.
  // Options zero0..zero3 and hsdpN (layout.h parse_zero_token): the ZeRO level (-1: the software's)
  // and the HSDP shard group size (0: the software's).
  int zero = -1, zero_shard = 0;
  RunMetric metric = RunMetric::seconds;
  double value = 0;
  int line = 0;  // in the file, for messages
  int gpus() const { return tp * cp * pp * dp; }
};

// Reads the CSV ('#' comment lines, one header line with exactly the documented columns; files
// written before the cp and ffn columns may leave them out). IoError naming the file, line and
// column on anything missing, malformed or out of range.
std::vector<PublishedRun> load_published_runs(const std::filesystem::path& csv);

// The runtime behaviour a software name stands for: "megatron-sc21" (Megatron-LM 2021: fp16, unfused
// attention with dropout, gradient all-reduce after backward, scatter/gather p2p), "megatron-2022"
// (the same code with selective recomputation and sequence parallelism available), "triax".
Layout software_layout(std::string_view software);

// Seconds per iteration the row measured (TFLOP/s rows through Narayanan et al.'s Eq. 3).
double measured_seconds(const PublishedRun& r);

struct RunPrediction {
  PublishedRun run;
  Estimate estimate;
  double measured_seconds = 0;
  double predicted_seconds = 0;
  double error = 0;  // throughput error: measured_seconds / predicted_seconds - 1
};

// Predicts a row on `net` (its cluster). Unpublished micro-batch / schedule are searched among the
// layouts that fit; a fully published layout is priced as run even if the memory model disagrees.
RunPrediction predict_run(const PublishedRun& r, const CollectiveModel& net);

// The constants fitted per cluster.
struct FitParameters {
  double gemm_efficiency = 0;
  double gemm_k_overhead = 0;
};
Cluster with_parameters(Cluster c, const FitParameters& p);

// Least squares in log(predicted / measured) over `rows` (all on cluster `base`), searched over a
// bounded grid refined around its best point. ConfigError on an empty row set.
FitParameters fit_parameters(const Cluster& base, const std::vector<PublishedRun>& rows);

struct ValidationRow {
  RunPrediction in_sample;       // with the parameters fitted to every row
  double leave_one_out_error = 0;  // fitted without this row
  double held_out_source_error = 0;  // fitted without every row of this row's source
  FitParameters leave_one_out_fit, held_out_source_fit;
};
struct ErrorSummary {
  double mean = 0, worst = 0;
};
struct ValidationReport {
  std::string cluster;
  FitParameters fit;  // on every row
  std::vector<ValidationRow> rows;
  ErrorSummary in_sample, leave_one_out, held_out_source;
  bool transferred_from_elsewhere = false;  // a held-out source was fitted on other clusters' rows
};

// Fits, predicts and cross-validates every row of one cluster. ConfigError when rows name
// different clusters or a source has no rows outside it to fit on.
// `elsewhere`: rows measured on other clusters (each priced on its preset); a source that is the only
// one on `base` is held out by fitting on those and carrying the parameters over.
ValidationReport validate_runs(const Cluster& base, const std::vector<PublishedRun>& rows,
                               const std::vector<PublishedRun>& elsewhere = {});

std::string format_validation(const ValidationReport& r);
std::string validation_json(const ValidationReport& r, int indent = 2);

}  // namespace triax::plan
