// Reading published runs, predicting them, fitting the cluster constants and cross-validating.
#include "triax/plan/published_runs.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "triax/core/error.h"
#include "triax/plan/csv_table.h"
#include "triax/plan/validation.h"

namespace triax::plan {

namespace {

const std::vector<std::string> kColumns = {
    "id",  "source", "where", "cluster", "software",     "layers",      "hidden",    "heads",
    "vocab", "seq",  "tp",    "pp",      "dp",           "global_batch", "micro_batch", "vpp",
    "recompute", "sequence_parallel", "metric", "value", "tied_embeddings", "kv_heads", "options", "cp", "ffn"};
// Columns added later, optional in a file's header (empty cells: cp 1, ffn 4h).
constexpr size_t kOptionalTail = 2;

// The Llama block's choices (model_shape.cpp's llama presets): SwiGLU, RMSNorm, RoPE, no biases.
void set_llama_block(ModelShape& m) {
  m.swiglu = true;
  m.rmsnorm = true;
  m.bias = false;
  m.rope = true;
  m.learned_positions = false;
}

// An options entry zero0..zero3 or hsdpN onto the run: true when it was one; IoError naming the
// file and line for a bad number.
bool zero_option(const std::string& opt, PublishedRun& r, const std::string& file, int lineno) {
  Layout l;
  l.zero = -1;
  try {
    if (!parse_zero_token(opt, l)) return false;
  } catch (const ConfigError& e) {
    TRIAX_THROW(IoError, "{}:{}: column options: {}", file, lineno, e.what());
  }
  if (l.zero >= 0) r.zero = l.zero;
  if (l.zero_shard > 0) r.zero_shard = l.zero_shard;
  return true;
}

}  // namespace

std::vector<PublishedRun> load_published_runs(const std::filesystem::path& csv) {
  const std::string file = csv.string();
  std::vector<PublishedRun> rows;
  std::set<std::string> ids;
  read_csv_table(csv, kColumns, "the published-runs table", [&](const std::vector<std::string>& cells, int lineno) {
    auto col = [&](const char* name) -> const std::string& {
      const size_t i = std::find(kColumns.begin(), kColumns.end(), name) - kColumns.begin();
      return cells[i];
    };
    auto number = [&](const char* name, double lo) {
      const std::string& s = col(name);
      double v = 0;
      auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || ptr != s.data() + s.size())
        TRIAX_THROW(IoError, "{}:{}: column {} '{}' is not a number", file, lineno, name, s);
      if (!(v >= lo)) TRIAX_THROW(IoError, "{}:{}: column {} is {}, must be >= {}", file, lineno, name, s, lo);
      return v;
    };
    auto integer = [&](const char* name, int lo, int if_empty = -1) {
      if (if_empty >= 0 && col(name).empty()) return if_empty;
      const double v = number(name, lo);
      if (v != std::floor(v) || v > 1e9)
        TRIAX_THROW(IoError, "{}:{}: column {} '{}' must be an integer", file, lineno, name, col(name));
      return int(v);
    };
    PublishedRun r;
    r.line = lineno;
    r.id = col("id");
    r.source = col("source");
    r.where = col("where");
    r.cluster = col("cluster");
    r.software = col("software");
    for (const char* k : {"id", "source", "where", "cluster", "software"})
      if (col(k).empty()) TRIAX_THROW(IoError, "{}:{}: column {} is empty", file, lineno, k);
    if (!ids.insert(r.id).second) TRIAX_THROW(IoError, "{}:{}: id '{}' appears twice", file, lineno, r.id);
    try {
      (void)software_layout(r.software);
      r.recompute = parse_recompute(col("recompute"));
    } catch (const ConfigError& e) {
      TRIAX_THROW(IoError, "{}:{}: {}", file, lineno, e.what());
    }
    r.model.name = r.id;
    r.model.layers = integer("layers", 1);
    r.model.hidden = integer("hidden", 1);
    r.model.heads = integer("heads", 1);
    r.model.vocab = integer("vocab", 1);
    r.model.seq = integer("seq", 1);
    r.model.global_batch = integer("global_batch", 1);
    r.tp = integer("tp", 1);
    r.pp = integer("pp", 1);
    r.dp = integer("dp", 1);
    r.cp = integer("cp", 1, 1);
    r.model.ffn = integer("ffn", 0, 0);
    if (r.cp > 1 && r.model.seq % (2 * r.cp) != 0)
      TRIAX_THROW(IoError, "{}:{}: column cp {}: seq {} is not divisible by 2*cp", file, lineno, r.cp, r.model.seq);
    r.micro_batch = integer("micro_batch", 0);
    r.vpp = integer("vpp", 0);
    const int sp = integer("sequence_parallel", 0);
    if (sp > 1) TRIAX_THROW(IoError, "{}:{}: column sequence_parallel must be 0 or 1, got {}", file, lineno, sp);
    r.sequence_parallel = sp == 1;
    const int tied = integer("tied_embeddings", 0);
    if (tied > 1) TRIAX_THROW(IoError, "{}:{}: column tied_embeddings must be 0 or 1, got {}", file, lineno, tied);
    r.model.tied_embeddings = tied == 1;
    r.model.kv_heads = integer("kv_heads", 0);
    if (r.model.kv_heads > 0 && r.model.heads % r.model.kv_heads != 0)
      TRIAX_THROW(IoError, "{}:{}: column kv_heads {} must divide heads {} (0 = heads)", file, lineno,
                  r.model.kv_heads, r.model.heads);
    std::stringstream options(col("options"));
    for (std::string opt; std::getline(options, opt, ';');) {
      if (opt == "no-dropout") r.no_dropout = true;
      else if (opt == "no-tp-comm-overlap") r.no_tp_comm_overlap = true;
      else if (opt == "no-pp-overlap") r.no_pp_overlap = true;
      else if (opt == "fused-cross-entropy") r.fused_cross_entropy = true;
      else if (opt == "fp32-grad-reduce") r.fp32_grad_reduce = true;
      else if (opt == "llama-block") set_llama_block(r.model);
      else if (zero_option(opt, r, file, lineno)) continue;
      else
        TRIAX_THROW(IoError,
                    "{}:{}: column options: unknown option '{}' (known: no-dropout, no-tp-comm-overlap, "
                    "no-pp-overlap, fused-cross-entropy, fp32-grad-reduce, llama-block, zero0..zero3, hsdpN; "
                    "';'-separated)",
                    file, lineno, opt);
    }
    const std::string& metric = col("metric");
    if (metric == "tflops_eq3") r.metric = RunMetric::tflops_eq3;
    else if (metric == "seconds") r.metric = RunMetric::seconds;
    else if (metric == "tflops_model") r.metric = RunMetric::tflops_model;
    else
      TRIAX_THROW(IoError, "{}:{}: column metric '{}' must be tflops_eq3, tflops_model or seconds", file, lineno,
                  metric);
    r.value = number("value", 0);
    if (!(r.value > 0)) TRIAX_THROW(IoError, "{}:{}: column value must be positive", file, lineno);
    if (r.model.global_batch % r.dp != 0)
      TRIAX_THROW(IoError, "{}:{}: dp {} does not divide global_batch {}", file, lineno, r.dp, r.model.global_batch);
    rows.push_back(std::move(r));
  }, kOptionalTail);
  return rows;
}

Layout software_layout(std::string_view software) {
  if (software == "megatron-sc21") return sc21_software();
  if (software == "megatron-2022") {
    Layout l = sc21_software();
    l.tp_overlap_backward = true;  // --async-tensor-model-parallel-allreduce (Megatron-LM since 2021-09)
    return l;
  }
  if (software == "megatron-core-2024") {
    // Megatron-Core r0.8 as the Megatron-LM README's H100 scaling runs used it: bf16, Transformer
    // Engine fused attention, distributed optimizer (ZeRO-1) with --overlap-grad-reduce and
    // --overlap-param-gather, --tp-comm-overlap, overlapped pipeline p2p (in the interleaved schedule
    // only: Megatron-LM r0.8's arguments.py turns overlap_p2p_comm off for 1F1B); bf16 gradient
    // reduction (DDP's default, and NeMo's grad_sync_dtype bf16; Megatron-LM's own training loop forces
    // fp32 for bf16: the rows' fp32-grad-reduce option), Megatron's default dropout 0.1.
    Layout l;
    l.precision = Precision::bf16;
    l.attention = AttentionKernel::fused;
    l.causal_skip = true;
    l.dropout = true;
    l.zero = 1;
    l.dp_overlap = true;
    l.dp_param_gather_overlap = true;
    l.dp_mcore_buckets = true;
    l.grad_reduce_fp32 = false;
    l.tp_comm_overlap = true;
    l.pp_overlap = true;
    l.pp_overlap_interleaved_only = true;
    l.pp_scatter_gather = false;
    l.fused_cross_entropy = false;  // --cross-entropy-loss-fusion came after r0.8
    return l;
  }
  if (software == "triax") return Layout{};
  TRIAX_THROW(ConfigError, "unknown software '{}'; known: megatron-sc21, megatron-2022, megatron-core-2024, triax",
              software);
}

double measured_seconds(const PublishedRun& r) {
  if (r.metric == RunMetric::seconds) return r.value;
  // Model FLOPs (no recomputation), Megatron-LM's num_floating_point_operations: for an ffn of 4h
  // exactly this planner's 3 B s (l (24 h^2 + 4 s h) + 2 h V).
  if (r.metric == RunMetric::tflops_model) return iteration_flops(r.model, Layout{}).model / (double(r.gpus()) * r.value * 1e12);
  return megatron_eq3_flops(r.model) / (double(r.gpus()) * r.value * 1e12);
}

RunPrediction predict_run(const PublishedRun& r, const CollectiveModel& net) {
  Layout base = software_layout(r.software);
  base.recompute = r.recompute;
  base.sequence_parallel = r.sequence_parallel;
  if (r.no_dropout) base.dropout = false;
  if (r.no_tp_comm_overlap) base.tp_comm_overlap = false;
  if (r.no_pp_overlap) base.pp_overlap = false;
  if (r.fused_cross_entropy) base.fused_cross_entropy = true;
  if (r.fp32_grad_reduce) base.grad_reduce_fp32 = true;
  if (r.zero >= 0) base.zero = r.zero;
  if (r.zero_shard > 0) base.zero_shard = r.zero_shard;
  base.cp = r.cp;
  RunPrediction p;
  p.run = r;
  p.measured_seconds = measured_seconds(r);
  if (r.micro_batch > 0 && r.vpp > 0) {
    Layout l = base;
    l.tp = r.tp;
    l.pp = r.pp;
    l.dp = r.dp;
    l.micro_batch = r.micro_batch;
    l.vpp = r.vpp;
    l.schedule = r.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b;
    p.estimate = estimate(r.model, net, l);
  } else {
    SearchSpace sp;
    sp.gpus = r.gpus();
    sp.tp = {r.tp};
    sp.cp = {r.cp};
    sp.pp = {r.pp};
    sp.dp = {r.dp};
    if (r.micro_batch > 0) sp.micro_batch = {r.micro_batch};
    sp.schedules = {Schedule::one_f_one_b};
    if (r.pp > 1 && r.vpp != 1) sp.schedules.push_back(Schedule::interleaved);
    if (r.vpp > 1) sp.schedules = {Schedule::interleaved}, sp.vpp = {r.vpp};
    sp.recompute = {r.recompute};
    sp.sequence_parallel = {r.sequence_parallel};
    sp.zero = {base.zero};
    sp.zero_shard = {base.zero_shard};
    sp.base = base;
    sp.top_k = 1;
    const SearchResult res = search(r.model, net, sp);
    if (res.best.empty())
      TRIAX_THROW(ConfigError, "published run '{}' (line {}): no micro-batch size or schedule fits in memory", r.id,
                  r.line);
    p.estimate = res.best.front();
  }
  p.predicted_seconds = p.estimate.seconds_per_iteration;
  p.error = p.measured_seconds / p.predicted_seconds - 1;
  return p;
}

Cluster with_parameters(Cluster c, const FitParameters& p) {
  c.gemm_efficiency = p.gemm_efficiency;
  c.gemm_k_overhead = p.gemm_k_overhead;
  return c;
}

namespace {

// Each row on `base` when it was measured there, otherwise on its own cluster's preset (the rows of
// other clusters a held-out fit transfers from), with the parameters `p` either way.
double log_loss(const Cluster& base, const FitParameters& p, const std::vector<PublishedRun>& rows) {
  const CollectiveModel net(with_parameters(base, p));
  std::map<std::string, CollectiveModel> elsewhere;
  double sum = 0;
  for (const auto& r : rows) {
    const CollectiveModel* m = &net;
    if (r.cluster != base.name) {
      auto it = elsewhere.find(r.cluster);
      if (it == elsewhere.end())
        it = elsewhere.emplace(r.cluster, CollectiveModel(with_parameters(cluster_preset(r.cluster), p))).first;
      m = &it->second;
    }
    const double x = std::log(predict_run(r, *m).error + 1);
    sum += x * x;
  }
  return sum / rows.size();
}

}  // namespace

FitParameters fit_parameters(const Cluster& base, const std::vector<PublishedRun>& rows) {
  if (rows.empty()) TRIAX_THROW(ConfigError, "fit of cluster '{}': no rows to fit", base.name);
  // Bounds: a sustained tensor-core fraction between 0.4 and 1, a per-tile overhead up to 512 K
  // elements (four K-steps of 128 are already a lot for a software-pipelined main loop).
  double e_lo = 0.4, e_hi = 1.0, k_lo = 0, k_hi = 512;
  FitParameters best{0.66, 64};  // a fixed start (the earlier flat model), so the fit depends only on the rows
  double best_loss = log_loss(base, best, rows);
  for (int round = 0; round < 4; ++round) {
    const int n = 6;
    FitParameters round_best = best;
    for (int i = 0; i <= n; ++i) {
      for (int j = 0; j <= n; ++j) {
        const FitParameters p{e_lo + (e_hi - e_lo) * i / n, k_lo + (k_hi - k_lo) * j / n};
        const double loss = log_loss(base, p, rows);
        if (loss < best_loss) best_loss = loss, round_best = p;
      }
    }
    best = round_best;
    const double de = (e_hi - e_lo) / n, dk = (k_hi - k_lo) / n;
    e_lo = std::max(0.4, best.gemm_efficiency - de), e_hi = std::min(1.0, best.gemm_efficiency + de);
    k_lo = std::max(0.0, best.gemm_k_overhead - dk), k_hi = std::min(512.0, best.gemm_k_overhead + dk);
  }
  return best;
}

namespace {

ErrorSummary summarize(const std::vector<double>& errors) {
  ErrorSummary s;
  for (double e : errors) {
    s.mean += std::abs(e) / errors.size();
    s.worst = std::max(s.worst, std::abs(e));
  }
  return s;
}

}  // namespace

ValidationReport validate_runs(const Cluster& base, const std::vector<PublishedRun>& rows,
                               const std::vector<PublishedRun>& elsewhere) {
  if (rows.empty()) TRIAX_THROW(ConfigError, "validation on '{}': no rows", base.name);
  for (const auto& r : rows)
    if (r.cluster != base.name)
      TRIAX_THROW(ConfigError, "validation on '{}': row '{}' (line {}) was measured on '{}'", base.name, r.id, r.line,
                  r.cluster);
  ValidationReport rep;
  rep.cluster = base.name;
  rep.fit = fit_parameters(base, rows);
  const CollectiveModel all(with_parameters(base, rep.fit));
  std::map<std::string, FitParameters> by_source;
  for (const auto& r : rows) {
    if (by_source.count(r.source)) continue;
    std::vector<PublishedRun> others;
    for (const auto& o : rows)
      if (o.source != r.source) others.push_back(o);
    if (others.empty()) {
      // No other source on this cluster: fit on the other clusters' rows (each on its own cluster)
      // and carry the parameters over, so this source is still predicted without its own rows.
      for (const auto& o : elsewhere)
        if (o.source != r.source && o.cluster != base.name) others.push_back(o);
      rep.transferred_from_elsewhere = !others.empty();
    }
    if (others.empty())
      TRIAX_THROW(ConfigError, "validation on '{}': every row is from source '{}', nothing to fit on without it",
                  base.name, r.source);
    by_source[r.source] = fit_parameters(base, others);
  }
  std::vector<double> in, loo, src;
  for (size_t i = 0; i < rows.size(); ++i) {
    ValidationRow v;
    v.in_sample = predict_run(rows[i], all);
    std::vector<PublishedRun> others = rows;
    others.erase(others.begin() + i);
    v.leave_one_out_fit = fit_parameters(base, others);
    v.leave_one_out_error = predict_run(rows[i], CollectiveModel(with_parameters(base, v.leave_one_out_fit))).error;
    v.held_out_source_fit = by_source.at(rows[i].source);
    v.held_out_source_error =
        predict_run(rows[i], CollectiveModel(with_parameters(base, v.held_out_source_fit))).error;
    in.push_back(v.in_sample.error);
    loo.push_back(v.leave_one_out_error);
    src.push_back(v.held_out_source_error);
    rep.rows.push_back(std::move(v));
  }
  rep.in_sample = summarize(in);
  rep.leave_one_out = summarize(loo);
  rep.held_out_source = summarize(src);
  return rep;
}

std::string format_validation(const ValidationReport& r) {
  std::string out = fmt::format(
      "published runs on {}: fitted on all rows gemm_efficiency {:.3f}, gemm_k_overhead {:.0f}\n"
      "error = measured / predicted time - 1 (throughput error); LOO: fitted without the row; "
      "by source: fitted without every row of its source{}\n",
      r.cluster, r.fit.gemm_efficiency, r.fit.gemm_k_overhead,
      r.transferred_from_elsewhere ? " (on the other clusters' rows, parameters carried over)" : "");
  out += fmt::format("{:<18} {:<34} {:<40} {:>9} {:>9} {:>7} {:>7} {:>9}\n", "id", "source", "layout", "measured",
                     "predicted", "fit-all", "LOO", "by-source");
  for (const auto& v : r.rows) {
    const auto& p = v.in_sample;
    out += fmt::format("{:<18} {:<34} {:<40} {:>8.3f}s {:>8.3f}s {:>+6.1f}% {:>+6.1f}% {:>+8.1f}%\n", p.run.id,
                       p.run.source + " " + p.run.where, describe(p.estimate.layout), p.measured_seconds,
                       p.predicted_seconds, 100 * p.error, 100 * v.leave_one_out_error,
                       100 * v.held_out_source_error);
  }
  out += fmt::format("fit on all rows:      mean |error| {:.2f}%, worst {:.2f}%\n", 100 * r.in_sample.mean,
                     100 * r.in_sample.worst);
  out += fmt::format("leave-one-out:        mean |error| {:.2f}%, worst {:.2f}%\n", 100 * r.leave_one_out.mean,
                     100 * r.leave_one_out.worst);
  out += fmt::format("held out by source:   mean |error| {:.2f}%, worst {:.2f}%\n", 100 * r.held_out_source.mean,
                     100 * r.held_out_source.worst);
  return out;
}

std::string validation_json(const ValidationReport& r, int indent) {
  nlohmann::json j;
  j["cluster"] = r.cluster;
  j["fit"] = {{"gemm_efficiency", r.fit.gemm_efficiency}, {"gemm_k_overhead", r.fit.gemm_k_overhead}};
  auto sum = [](const ErrorSummary& s) { return nlohmann::json{{"mean", s.mean}, {"worst", s.worst}}; };
  j["in_sample"] = sum(r.in_sample);
  j["leave_one_out"] = sum(r.leave_one_out);
  j["held_out_source"] = sum(r.held_out_source);
  j["held_out_source_transferred"] = r.transferred_from_elsewhere;
  j["rows"] = nlohmann::json::array();
  for (const auto& v : r.rows) {
    j["rows"].push_back({{"id", v.in_sample.run.id},
                         {"source", v.in_sample.run.source},
                         {"where", v.in_sample.run.where},
                         {"layout", describe(v.in_sample.estimate.layout)},
                         {"measured_seconds", v.in_sample.measured_seconds},
                         {"predicted_seconds", v.in_sample.predicted_seconds},
                         {"error", v.in_sample.error},
                         {"leave_one_out_error", v.leave_one_out_error},
                         {"held_out_source_error", v.held_out_source_error}});
  }
  return j.dump(indent);
}

}  // namespace triax::plan
