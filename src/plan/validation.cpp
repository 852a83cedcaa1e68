// Reading the SC21 Table 1 CSV and predicting its rows.
#include "triax/plan/validation.h"

#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "triax/core/error.h"
#include "triax/plan/csv_table.h"

namespace triax::plan {

namespace {
const std::vector<std::string> kColumns = {"params_billion", "heads",         "hidden", "layers",
                                           "tp",             "pp",            "dp",     "gpus",
                                           "global_batch",   "tflops_per_gpu", "percent_of_peak",
                                           "aggregate_pflops"};

}  // namespace

std::vector<Sc21Row> load_sc21_table(const std::filesystem::path& csv) {
  const std::string file = csv.string();
  std::vector<Sc21Row> rows;
  read_csv_table(csv, kColumns, "the SC21 table", [&](const std::vector<std::string>& cells, int lineno) {
    double v[12];
    for (size_t i = 0; i < cells.size(); ++i) {
      const char* b = cells[i].data();
      const char* e = b + cells[i].size();
      auto [ptr, ec] = std::from_chars(b, e, v[i]);
      if (ec != std::errc() || ptr != e || cells[i].empty())
        TRIAX_THROW(IoError, "{}:{}: column {} '{}' is not a number", file, lineno, kColumns[i], cells[i]);
    }
    Sc21Row r;
    r.params_billion = v[0];
    r.heads = int(v[1]);
    r.hidden = int(v[2]);
    r.layers = int(v[3]);
    r.tp = int(v[4]);
    r.pp = int(v[5]);
    r.dp = int(v[6]);
    r.gpus = int(v[7]);
    r.global_batch = long(v[8]);
    r.tflops_per_gpu = v[9];
    r.percent_of_peak = v[10];
    r.aggregate_pflops = v[11];
    if (long(r.tp) * r.pp * r.dp != r.gpus)
      TRIAX_THROW(IoError, "{}:{}: tp*pp*dp = {} but gpus = {}", file, lineno, long(r.tp) * r.pp * r.dp, r.gpus);
    rows.push_back(r);
  });
  return rows;
}

ModelShape sc21_model(const Sc21Row& r) {
  ModelShape m;
  m.name = fmt::format("sc21-{}b", r.params_billion);
  m.layers = r.layers;
  m.hidden = r.hidden;
  m.heads = r.heads;
  m.vocab = 51200;
  m.seq = 2048;
  m.global_batch = r.global_batch;
  return m;
}

Layout sc21_software() {
  Layout l;
  l.precision = Precision::fp16;
  l.recompute = Recompute::full;
  l.attention = AttentionKernel::unfused;
  l.dropout = true;
  l.dp_overlap = false;
  l.grad_reduce_fp32 = false;
  l.pp_scatter_gather = true;
  l.sequence_parallel = false;
  l.zero = 0;
  l.fused_cross_entropy = false;  // vocab_parallel_cross_entropy: fp32 passes over the logits
  return l;
}

Sc21Prediction predict_sc21_row(const Sc21Row& r, const CollectiveModel& net) {
  const ModelShape m = sc21_model(r);
  SearchSpace sp;
  sp.gpus = r.gpus;
  sp.tp = {r.tp};
  sp.pp = {r.pp};
  sp.dp = {r.dp};
  // The table does not give the schedule: Megatron-LM's default, non-interleaved 1F1B (interleaving
  // needs an explicit flag). Searching interleaved too predicts the pp > 1 rows 5-8% fast.
  sp.schedules = {Schedule::one_f_one_b};
  sp.recompute = {Recompute::full};
  sp.sequence_parallel = {false};
  sp.zero = {0};
  sp.base = sc21_software();
  sp.top_k = 1;
  const SearchResult res = search(m, net, sp);
  if (res.best.empty())
    TRIAX_THROW(ConfigError, "SC21 row {}B (tp{} pp{} dp{}): no micro-batch size fits in memory", r.params_billion,
                r.tp, r.pp, r.dp);
  Sc21Prediction p;
  p.row = r;
  p.estimate = res.best.front();
  p.predicted_tflops = megatron_eq3_flops(m) / (p.estimate.seconds_per_iteration * r.gpus) / 1e12;
  p.error = (p.predicted_tflops - r.tflops_per_gpu) / r.tflops_per_gpu;
  return p;
}

}  // namespace triax::plan
