// triax-plan: the planner's command line. With tp, pp, dp and the micro-batch size given it
// estimates that layout; with any of them left out it searches every valid layout for --gpus.
// --validate-sc21 predicts the Megatron-LM SC21 Table 1 rows. Exit codes: 0 ok, 1 error in the
// input files or the model, 2 bad command line, 3 search found no layout that fits.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <optional>

#include "hetero_mode.h"
#include "triax/core/error.h"
#include "triax/plan/published_runs.h"
#include "triax/plan/report.h"
#include "triax/plan/tune.h"
#include "triax/plan/validation.h"

using namespace triax::plan;

namespace {

std::string validation_table(const std::vector<Sc21Prediction>& preds) {
  std::string out = fmt::format("{:>8} {:>4} {:>3} {:>3} {:>4} {:>6}  {:<36} {:>9} {:>9} {:>7}\n", "params", "tp",
                                "pp", "dp", "gpus", "batch", "chosen layout", "predicted", "published", "error");
  double sum = 0, worst = 0;
  for (const auto& p : preds) {
    out += fmt::format("{:>7.1f}B {:>4} {:>3} {:>3} {:>4} {:>6}  {:<36} {:>9.1f} {:>9.1f} {:>+6.1f}%\n",
                       p.row.params_billion, p.row.tp, p.row.pp, p.row.dp, p.row.gpus, p.row.global_batch,
                       describe(p.estimate.layout), p.predicted_tflops, p.row.tflops_per_gpu, 100 * p.error);
    sum += std::abs(p.error);
    worst = std::max(worst, std::abs(p.error));
  }
  out += fmt::format("mean |error| {:.1f}%, worst {:.1f}% (TFLOP/s per GPU, Eq. 3 counting)\n",
                     100 * sum / preds.size(), 100 * worst);
  return out;
}

// Counts and sizes: a positive integer, with a message that says so.
const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      try {
        size_t pos = 0;
        const long v = std::stol(s, &pos);
        if (pos == s.size() && v > 0) return {};
      } catch (const std::exception&) {
      }
      return "must be a positive integer, got '" + s + "'";
    },
    "POSITIVE");

// " kv 8; SwiGLU, RMSNorm, ..." for --list: the block's choices that differ from GPT-2's.
std::string block_summary(const ModelShape& m) {
  std::string out;
  if (m.kv_head_count() != m.heads) out += fmt::format(" kv {}", m.kv_head_count());
  const std::string choices = block_choices(m);
  if (!choices.empty()) out += (out.empty() ? "  " : ", ") + choices;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"triax-plan: predict seconds per iteration, TFLOP/s, MFU and memory of a 3D-parallel "
               "Transformer layout on a cluster, or search for the best layouts (docs/PLANNER.md)"};

  std::string model_name, cluster_spec = "selene-a100", calibration, validate_csv, software = "triax";
  std::string validate_runs_csv;
  bool tune_mode = false;
  int grad_accum = 0;
  double gpu_hour_price = 0;
  ModelShape shape;
  int gpus = 0, tp = 0, cp = 0, pp = 0, dp = 0, vpp = 0, mbs = 0, top_k = 5;
  std::string cp_comm;
  std::string schedule, recompute, precision = "bf16", attention;
  bool sp = false, zero1 = false, json = false, dropout = false, cross_node_tp = false, runtime_copies = false;
  bool no_dp_overlap = false, grad_half = false, no_scatter_gather = false, list = false;

  app.add_option("--model", model_name, "model preset (see --list)");
  app.add_option("--layers", shape.layers, "Transformer layers")->check(kPositive);
  app.add_option("--hidden", shape.hidden, "hidden size")->check(kPositive);
  app.add_option("--heads", shape.heads, "attention heads")->check(kPositive);
  app.add_option("--ffn,--ffn-hidden-size", shape.ffn, "MLP inner size (default 4 x hidden)")->check(kPositive);
  app.add_option("--kv-heads,--num-query-groups", shape.kv_heads,
                 "key/value heads, grouped-query attention (default: --heads)")
      ->check(kPositive);
  // The block's choices, in Megatron's spelling; each overrides the preset only when given.
  std::string normalization, position_type;
  bool swiglu = false, disable_bias = false, untie = false;
  app.add_option("--normalization", normalization, "LayerNorm (weight and bias) or RMSNorm (weight)")
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}));
  app.add_option("--position-embedding-type", position_type,
                 "learned_absolute (a seq x hidden table) or rope (rotary, no table)")
      ->check(CLI::IsMember({"learned_absolute", "rope"}));
  auto* swiglu_opt = app.add_flag("--swiglu,!--no-swiglu", swiglu, "SwiGLU MLP: gate, up and down (three f x h matrices)");
  auto* bias_opt = app.add_flag("--disable-bias-linear,!--add-bias-linear", disable_bias, "no biases on the linear layers");
  auto* untie_opt = app.add_flag("--untie-embeddings-and-output-weights,!--tie-embeddings-and-output-weights", untie,
                                 "an LM head of its own instead of the input embedding");
  app.add_option("--vocab", shape.vocab, "vocabulary size")->check(kPositive);
  app.add_option("--seq", shape.seq, "sequence length")->check(kPositive);
  auto* global_batch_opt =
      app.add_option("--global-batch,--global-batch-size", shape.global_batch, "sequences per iteration")->check(kPositive);
  app.add_option("--cluster", cluster_spec, "cluster preset name or FILE.toml")->capture_default_str();
  app.add_option("--calibration", calibration, "collective calibration (.json or .toml) measured on the cluster");
  app.add_option("--gpus", gpus, "GPUs to use (search mode)")->check(kPositive);
  app.add_option("--tp", tp, "tensor-parallel size")->check(kPositive);
  app.add_option("--cp,--context-parallel-size", cp,
                 "context-parallel size: each sequence split over cp ranks (ring attention); default 1 for one "
                 "layout, searched (1, 2, 4, ...) otherwise")
      ->check(kPositive);
  app.add_option("--cp-comm-type", cp_comm, "how context-parallel ranks exchange K/V: p2p (ring, overlapped) or allgather")
      ->check(CLI::IsMember({"p2p", "allgather"}));
  app.add_option("--pp", pp, "pipeline-parallel size")->check(kPositive);
  app.add_option("--dp", dp, "data-parallel size")->check(kPositive);
  app.add_option("--vpp", vpp, "model chunks per pipeline rank (interleaved)")->check(kPositive);
  app.add_option("--micro-batch-size,--mbs", mbs, "sequences per micro-batch")->check(kPositive);
  app.add_option("--schedule", schedule, "pipeline schedule")->check(CLI::IsMember({"gpipe", "1f1b", "interleaved", "zb-h1"}));
  app.add_option("--recompute", recompute, "activation recomputation")->check(CLI::IsMember({"none", "selective", "full"}));
  auto* sp_opt = app.add_flag("--sequence-parallel,!--no-sequence-parallel", sp, "sequence parallelism (tp > 1)");
  auto* zero_opt = app.add_flag("--zero1,!--no-zero1", zero1, "shard optimizer state over dp (ZeRO-1; = --zero 1)");
  std::string zero_spec;
  int zero_shard = 0;
  auto* zero_level_opt = app.add_option("--zero", zero_spec,
                                        "ZeRO level: 0, 1 (optimizer state), 2 (+ gradients), 3 (+ parameters); "
                                        "also zero1 / zero2 / zero3, and 'zero3 hsdp4' for shard groups of 4");
  auto* shard_opt = app.add_option("--zero-shard-size", zero_shard,
                                   "HSDP: shard inside groups of N dp ranks, all-reduce across groups (ZeRO-2/3)")
                        ->check(kPositive);
  auto* precision_opt =
      app.add_option("--precision", precision, "compute precision (megatron-sc21 software: fp16 unless given)")
          ->check(CLI::IsMember({"bf16", "fp16", "fp32"}))
          ->capture_default_str();
  app.add_option("--software", software,
                 "runtime behaviour: triax (overlapped fp32 grad reduce, fused attention), megatron-sc21 "
                 "(the 2021 paper's Megatron-LM: fp16, unfused attention with dropout, no overlap), megatron-2022 "
                 "(+ backward TP overlap) or megatron-core-2024 (bf16, fused causal attention, distributed "
                 "optimizer, TP / PP / DP communication overlapped)")
      ->check(CLI::IsMember({"triax", "megatron-sc21", "megatron-2022", "megatron-core-2024"}))
      ->capture_default_str();
  app.add_option("--attention", attention, "attention kernel (overrides --software)")->check(CLI::IsMember({"fused", "unfused"}));
  app.add_flag("--dropout", dropout, "dropout on (stores masks)");
  app.add_flag("--runtime-copies", runtime_copies,
               "price the triax runtime's copies, bias fills and staging (at the cluster's copy_gbps)");
  app.add_flag("--no-dp-overlap", no_dp_overlap, "DP gradient reduction after backward, not overlapped");
  app.add_flag("--grad-reduce-half", grad_half, "accumulate and reduce gradients in bf16/fp16 instead of fp32");
  app.add_flag("--no-pp-scatter-gather", no_scatter_gather, "send whole activations between nodes");
  app.add_flag("--allow-cross-node-tp", cross_node_tp, "allow tp groups larger than a node");
  app.add_option("--top-k", top_k, "layouts to show in search mode")->check(kPositive)->capture_default_str();
  app.add_flag("--json", json, "print one JSON object instead of tables");
  std::string plot;
  app.add_option("--plot", plot,
                 "also write the predicted step-time breakdown (compute, bubble, exposed TP/PP/DP communication, "
                 "optimizer) of the best layouts, or of the one layout, as a stacked bar chart to FILE.svg");
  app.add_option("--validate-sc21", validate_csv, "predict the rows of a Megatron-LM SC21 Table 1 CSV");
  app.add_option("--validate", validate_runs_csv,
                 "predict every published run of a CSV (data/validation/published_runs.csv) on --cluster: fit the "
                 "cluster's GEMM constants, print in-sample, leave-one-out and held-out-by-source errors");
  app.add_flag("--tune", tune_mode,
               "recommend changes to the current settings (--gpus, --mbs, --grad-accum or --dp, optional --tp/--pp, "
               "--recompute): micro-batch, accumulation, recompute, layout, with step time, MFU, cost and the limit");
  app.add_option("--grad-accum", grad_accum, "gradient accumulation steps of the current settings (--tune)")
      ->check(kPositive);
  app.add_option("--gpu-hour-price", gpu_hour_price, "price of one GPU-hour, for the cost column of --tune")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--list", list, "list model and cluster presets");
  // Heterogeneous clusters (a cluster file with [[node_class]] tables; docs/PLANNER.md).
  std::vector<int> pipeline_layers;
  std::vector<long> dp_microbatches;
  std::vector<std::string> stage_classes;
  std::string emit_config;
  bool even = false;
  app.add_option("--pipeline-layers", pipeline_layers, "device classes: pin the layers per stage, e.g. 5,3")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--dp-microbatches", dp_microbatches, "device classes: pin the micro-batches per DP replica, e.g. 6,2")
      ->delimiter(',')
      ->check(kPositive);
  app.add_option("--stage-classes", stage_classes, "device classes: pin the class of each pipeline stage, e.g. h100,a100")
      ->delimiter(',');
  app.add_flag("--even", even, "device classes: price the even split only (layers and micro-batches even)");
  app.add_option("--emit-config", emit_config,
                 "device classes: write the best (or pinned) plan as a train_gpt --config FILE.toml, with its mpirun "
                 "MPMD launch line");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "triax-plan: error: %s\nRun 'triax-plan --help' for the options.\n", e.what());
    return 2;
  }

  if (!plot.empty() && (list || tune_mode || !validate_csv.empty() || !validate_runs_csv.empty())) {
    std::fprintf(stderr, "triax-plan: error: --plot draws a search's best layouts or one layout's estimate; "
                         "it does not go with --list, --tune, --validate or --validate-sc21\n");
    return 2;
  }

  try {
    if (list) {
      fmt::print("models:\n");
      for (const auto* presets : {&model_presets(), &llama_presets()})
        for (const auto& m : *presets)
          fmt::print("  {:<15} {:>4} layers, hidden {:>5}, heads {:>3}, vocab {:>6}, seq {:>5}, batch {:>5}  {:.2f}B{}\n",
                     m.name, m.layers, m.hidden, m.heads, m.vocab, m.seq, m.global_batch, total_parameters(m) / 1e9,
                     block_summary(m));
      fmt::print("clusters:\n");
      for (const auto& c : cluster_presets())
        fmt::print("  {:<12} {} x {} devices: {}\n", c.name, c.nodes, c.gpus_per_node, c.description);
      return 0;
    }

    const bool hetero = is_hetero_cluster_file(cluster_spec) || !pipeline_layers.empty() || !dp_microbatches.empty() ||
                        !stage_classes.empty() || !emit_config.empty() || even;
    Cluster cluster = hetero ? resolve_hetero_cluster(cluster_spec).classes.front().device : resolve_cluster(cluster_spec);
    Calibration cal;
    if (!calibration.empty()) cal = load_calibration(calibration);
    const CollectiveModel net(cluster, cal);

    if (!validate_runs_csv.empty()) {
      std::vector<PublishedRun> rows, elsewhere;
      for (auto& r : load_published_runs(validate_runs_csv))
        (r.cluster == cluster.name ? rows : elsewhere).push_back(std::move(r));
      if (rows.empty()) {
        std::fprintf(stderr, "triax-plan: error: %s has no rows measured on cluster '%s'\n", validate_runs_csv.c_str(),
                     cluster.name.c_str());
        return 1;
      }
      const ValidationReport rep = validate_runs(cluster, rows, elsewhere);
      fmt::print("{}\n", json ? validation_json(rep) : format_validation(rep));
      return 0;
    }

    if (!validate_csv.empty()) {
      std::vector<Sc21Prediction> preds;
      for (const auto& row : load_sc21_table(validate_csv)) preds.push_back(predict_sc21_row(row, net));
      if (json) {
        std::string out = "[";
        for (size_t i = 0; i < preds.size(); ++i) {
          out += fmt::format("{}{{\"params_billion\": {}, \"published_tflops\": {}, \"predicted_tflops\": {:.2f}, "
                             "\"error\": {:.4f}, \"estimate\": {}}}",
                             i ? ",\n" : "\n", preds[i].row.params_billion, preds[i].row.tflops_per_gpu,
                             preds[i].predicted_tflops, preds[i].error, estimate_json(preds[i].estimate, -1));
        }
        fmt::print("{}\n]\n", out);
      } else {
        fmt::print("{}", validation_table(preds));
      }
      return 0;
    }

    // The model: a preset, then any shape flag on top of it.
    ModelShape m;
    if (!model_name.empty()) m = model_preset(model_name);
    if (shape.layers) m.layers = shape.layers;
    if (shape.hidden) m.hidden = shape.hidden;
    if (shape.heads) m.heads = shape.heads;
    if (shape.kv_heads) m.kv_heads = shape.kv_heads;
    if (shape.ffn) m.ffn = shape.ffn;
    if (shape.vocab) m.vocab = shape.vocab;
    if (shape.seq) m.seq = shape.seq;
    if (shape.global_batch) m.global_batch = shape.global_batch;
    if (!normalization.empty()) m.rmsnorm = normalization == "RMSNorm";
    if (!position_type.empty()) {
      m.rope = position_type == "rope";
      m.learned_positions = !m.rope;
    }
    if (swiglu_opt->count()) m.swiglu = swiglu;
    if (bias_opt->count()) m.bias = !disable_bias;
    if (untie_opt->count()) m.tied_embeddings = !untie;
    if (model_name.empty() && (!m.layers || !m.hidden || !m.heads || !m.vocab || !m.seq || !m.global_batch)) {
      std::fprintf(stderr, "triax-plan: error: give --model NAME, or all of --layers --hidden --heads --vocab "
                           "--seq --global-batch\n");
      return 2;
    }
    validate(m);

    Layout base = software_layout(software);
    base.recompute = Recompute::none;
    if ((software != "megatron-sc21" && software != "megatron-2022") || precision_opt->count())
      base.precision = parse_precision(precision);
    if (!attention.empty()) base.attention = parse_attention(attention);
    if (dropout) base.dropout = true;
    if (runtime_copies) base.runtime_copies = true;
    if (no_dp_overlap) base.dp_overlap = false;
    if (grad_half) base.grad_reduce_fp32 = false;
    if (no_scatter_gather) base.pp_scatter_gather = false;
    if (!cp_comm.empty()) base.cp_comm = parse_cp_comm(cp_comm);
    LayoutRules rules;
    rules.allow_cross_node_tp = cross_node_tp;
    // The ZeRO level and shard size: --zero (or --zero1 / --no-zero1), --zero-shard-size, else the software's.
    auto apply_zero = [&](Layout& l) {
      l.zero = base.zero;
      l.zero_shard = base.zero_shard;
      if (zero_opt->count()) l.zero = zero1 ? 1 : 0;
      try {
        if (zero_level_opt->count()) parse_zero_spec(zero_spec, l);
      } catch (const triax::ConfigError& e) {
        TRIAX_THROW(ConfigError, "--zero {}: {}", zero_spec, e.what());
      }
      if (shard_opt->count()) l.zero_shard = zero_shard;
    };

    if (hetero) {
      HeteroOptions opt;
      opt.cluster = cluster_spec;
      opt.json = json;
      opt.emit_config = emit_config;
      opt.stage_classes = stage_classes;
      HeteroSearchSpace& space = opt.space;
      space.base = base;
      space.top_k = top_k;
      space.even = even;
      space.pipeline_layers = pipeline_layers;
      space.dp_microbatches = dp_microbatches;
      if (tp) space.tp = {tp};
      if (pp) space.pp = {pp};
      if (dp) space.dp = {dp};
      if (mbs) space.micro_batch = {mbs};
      if (!recompute.empty()) space.recompute = {parse_recompute(recompute)};
      if (zero_opt->count() || zero_level_opt->count()) {
        Layout z;
        apply_zero(z);
        space.zero = {z.zero};
      }
      if (!dp_microbatches.empty()) {
        if (!mbs) {
          std::fprintf(stderr, "triax-plan: error: --dp-microbatches needs --micro-batch-size\n");
          return 2;
        }
        long sum = 0;
        for (long n : dp_microbatches) sum += n;
        if (global_batch_opt->count() && m.global_batch != sum * mbs) {
          std::fprintf(stderr, "triax-plan: error: --global-batch-size %ld but --micro-batch-size %d x the sum of "
                               "--dp-microbatches %ld = %ld\n", m.global_batch, mbs, sum, sum * mbs);
          return 2;
        }
        m.global_batch = sum * mbs;
      }
      return run_hetero(m, opt);
    }

    if (tune_mode) {
      if (!mbs || (!grad_accum && !dp) || (!gpus && !(tp && pp && dp))) {
        std::fprintf(stderr, "triax-plan: error: --tune needs --mbs, --grad-accum (or --dp) and --gpus (or --tp --pp --dp)\n");
        return 2;
      }
      Layout l = base;
      l.micro_batch = mbs;
      if (grad_accum) {
        const long per_step = long(mbs) * grad_accum;
        if (m.global_batch % per_step != 0) {
          std::fprintf(stderr, "triax-plan: error: global batch %ld is not a multiple of mbs %d x grad-accum %d\n",
                       m.global_batch, mbs, grad_accum);
          return 2;
        }
        l.dp = int(m.global_batch / per_step);
        if (dp && dp != l.dp) {
          std::fprintf(stderr, "triax-plan: error: --dp %d but global batch / (mbs x grad-accum) = %d\n", dp, l.dp);
          return 2;
        }
      } else {
        l.dp = dp;
      }
      l.cp = cp ? cp : 1;
      const int g = gpus ? gpus : tp * l.cp * pp * dp;
      if (g % (l.dp * l.cp) != 0) {
        std::fprintf(stderr, "triax-plan: error: %d GPUs are not a multiple of dp %d x cp %d\n", g, l.dp, l.cp);
        return 2;
      }
      const int mp = g / (l.dp * l.cp);  // GPUs per model replica and CP rank
      if (tp && pp && tp * pp != mp) {
        std::fprintf(stderr, "triax-plan: error: tp*pp = %d but GPUs / dp = %d\n", tp * pp, mp);
        return 2;
      }
      l.tp = tp ? tp : 1;
      if (!tp) {  // the widest tensor parallelism inside a node that divides the (kv) heads, the rest pipeline
        for (int t = 1; t <= std::min(mp, cluster.gpus_per_node); ++t)
          if (mp % t == 0 && m.heads % t == 0 && m.kv_head_count() % t == 0) l.tp = t;
      }
      l.pp = pp ? pp : mp / l.tp;
      if (l.tp * l.pp != mp) {
        std::fprintf(stderr, "triax-plan: error: tp %d does not divide GPUs / dp = %d\n", l.tp, mp);
        return 2;
      }
      l.vpp = vpp ? vpp : 1;
      l.schedule = !schedule.empty() ? parse_schedule(schedule) : (l.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
      l.recompute = recompute.empty() ? Recompute::none : parse_recompute(recompute);
      l.sequence_parallel = sp;
      apply_zero(l);
      TuneOptions opt;
      opt.gpu_hour_price = gpu_hour_price;
      opt.rules = rules;
      const TuneResult r = tune(m, net, l, opt);
      fmt::print("{}", json ? tune_json(r) + "\n" : format_tune(r, opt));
      return 0;
    }

    const bool single = tp && pp && dp && mbs;
    const int grid = tp * (cp ? cp : 1) * pp * dp;
    if (single) {
      if (gpus && gpus != grid) {
        std::fprintf(stderr, "triax-plan: error: --gpus %d but %s = %d\n", gpus, cp ? "tp*cp*pp*dp" : "tp*pp*dp", grid);
        return 2;
      }
      Layout l = base;
      l.tp = tp;
      l.cp = cp ? cp : 1;
      l.pp = pp;
      l.dp = dp;
      l.micro_batch = mbs;
      l.vpp = vpp ? vpp : 1;
      l.schedule = !schedule.empty() ? parse_schedule(schedule)
                                     : (l.vpp > 1 ? Schedule::interleaved : Schedule::one_f_one_b);
      l.recompute = recompute.empty() ? Recompute::none : parse_recompute(recompute);
      l.sequence_parallel = sp;
      apply_zero(l);
      const Estimate e = estimate(m, net, l, rules);
      fmt::print("{}\n", json ? estimate_json(e) : format_estimate(e));
      if (!plot.empty()) write_breakdown_svg(plot, {e});
      return 0;
    }

    SearchSpace space;
    space.gpus = gpus ? gpus : (tp && pp && dp ? grid : 0);
    if (!space.gpus) {
      std::fprintf(stderr, "triax-plan: error: search mode (tp, pp, dp or --micro-batch-size left out) needs --gpus\n");
      return 2;
    }
    if (tp) space.tp = {tp};
    if (cp) space.cp = {cp};
    if (pp) space.pp = {pp};
    if (dp) space.dp = {dp};
    if (vpp) space.vpp = {vpp};
    if (mbs) space.micro_batch = {mbs};
    if (!schedule.empty()) space.schedules = {parse_schedule(schedule)};
    if (!recompute.empty()) space.recompute = {parse_recompute(recompute)};
    if (sp_opt->count()) space.sequence_parallel = {sp};
    if (zero_opt->count()) space.zero1 = {zero1};
    if (zero_level_opt->count() || shard_opt->count()) {
      Layout z;
      apply_zero(z);
      if (zero_level_opt->count()) space.zero = {z.zero};
      if (z.zero_shard > 0) space.zero_shard = {z.zero_shard};
    }
    space.base = base;
    space.rules = rules;
    space.top_k = top_k;
    const SearchResult r = search(m, net, space);
    fmt::print("{}\n", json ? search_json(r) : format_search(r));
    if (!plot.empty() && !r.best.empty()) write_breakdown_svg(plot, r.best);
    if (r.best.empty()) {
      if (!json) std::fprintf(stderr, "triax-plan: no layout of %s fits on %d GPUs of %s\n", m.name.c_str(), space.gpus,
                              cluster.name.c_str());
      return 3;
    }
    return 0;
  } catch (const triax::Error& e) {
    std::fprintf(stderr, "triax-plan: error: %s\n", e.what());
    return 1;
  }
}
