// Heterogeneous plans as text: the search's table, JSON, the MPMD launch line and the train_gpt
// config file of a plan.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "triax/plan/hetero.h"

namespace triax::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string class_names(const std::vector<int>& idx, const HeteroCluster& hc) {
  std::string s;
  for (int c : idx) s += (s.empty() ? "" : ",") + hc.classes[size_t(c)].name;
  return s;
}

// "h100 x6,a100 x2": the classes of the replicas, in runs.
std::string replica_runs(const HeteroPlan& p, const HeteroCluster& hc) {
  std::string s;
  for (size_t d = 0; d < p.replica_classes.size();) {
    size_t e = d;
    while (e < p.replica_classes.size() && p.replica_classes[e] == p.replica_classes[d]) ++e;
    s += fmt::format("{}{} x{}", s.empty() ? "" : ",", hc.classes[size_t(p.replica_classes[d])].name, e - d);
    d = e;
  }
  return s;
}

// "6,2", or in runs past 8 entries: "4 x48,3 x16,1 x16".
std::string shares(const std::vector<long>& v) {
  if (v.size() <= 8) return fmt::format("{}", fmt::join(v, ","));
  std::string s;
  for (size_t d = 0; d < v.size();) {
    size_t e = d;
    while (e < v.size() && v[e] == v[d]) ++e;
    s += fmt::format("{}{} x{}", s.empty() ? "" : ",", v[d], e - d);
    d = e;
  }
  return s;
}

bool uneven(const std::vector<long>& v) { return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) != v.end(); }

std::string classes_json(const HeteroEstimate& e) {
  std::string s;
  for (const auto& u : e.classes)
    s += fmt::format("{}{{\"name\": \"{}\", \"ranks\": {}, \"utilisation\": {:.4f}, \"memory_gib\": {:.3f}, "
                     "\"capacity_gib\": {:.3f}}}",
                     s.empty() ? "" : ", ", u.name, u.ranks, u.utilisation, u.memory.total() / kGiB,
                     u.memory.capacity / kGiB);
  return "[" + s + "]";
}

std::string plan_json(const HeteroEstimate& e, const HeteroCluster& hc) {
  const HeteroPlan& p = e.plan;
  return fmt::format("{{\"layout\": \"{}\", \"pipeline_layers\": [{}], \"stage_classes\": \"{}\", "
                     "\"replica_classes\": \"{}\", \"dp_microbatches\": [{}], \"seconds_per_iteration\": {:.6g}, "
                     "\"sync_seconds\": {:.6g}, \"optimizer_seconds\": {:.6g}, \"core_sharing_seconds\": {:.6g}, "
                     "\"tokens_per_second\": {:.6g}, \"fits\": {}, \"classes\": {}}}",
                     describe(p.layout), fmt::join(p.stage_layers, ", "), class_names(p.stage_classes, hc),
                     class_names(p.replica_classes, hc), fmt::join(p.replica_microbatches, ", "), e.seconds, e.sync,
                     e.optimizer, e.core_sharing, e.tokens_per_second, e.fits, classes_json(e));
}

}  // namespace

std::string describe(const HeteroPlan& p, const HeteroCluster& hc) {
  std::string s = fmt::format("{} | layers {}", describe(p.layout), fmt::join(p.stage_layers, ","));
  if (!p.stage_classes.empty()) s += " | stages " + class_names(p.stage_classes, hc);
  else s += " | replicas " + replica_runs(p, hc);
  return s + " | micro-batches " + shares(p.replica_microbatches);
}

std::string format_hetero(const HeteroSearchResult& r, const HeteroCluster& hc) {
  std::string out = fmt::format("heterogeneous cluster '{}':", hc.name);
  for (const auto& k : hc.classes)
    out += fmt::format(" {} ({} x {} devices, {:g} TFLOP/s bf16, {:g} GiB)", k.name, k.nodes, k.device.gpus_per_node,
                       k.device.peak_tflops_bf16, k.device.memory_gib);
  out += fmt::format("\n{} plans priced, {} over memory or without a split, {} invalid layouts, {} placements over a "
                     "class's devices\n", r.priced, r.no_fit, r.invalid, r.over_capacity);
  for (size_t i = 0; i < r.best.size(); ++i) {
    const HeteroChoice& c = r.best[i];
    out += fmt::format("{}. {}\n   predicted {:.4g} s/step ({:.4g} tokens/s)\n", i + 1, describe(c.plan.plan, hc),
                       c.plan.seconds, c.plan.tokens_per_second);
    for (const auto& u : c.plan.classes)
      if (u.ranks > 0)
        out += fmt::format("   {}: {} ranks, utilisation {:.0f}%, memory {:.2f} of {:.1f} GiB\n", u.name, u.ranks,
                           100 * u.utilisation, u.memory.total() / kGiB, u.memory.capacity / kGiB);
    out += fmt::format("   even split ({}): {:.4g} s/step{}; speed-up {:.2f}x\n", describe(c.even.plan, hc),
                       c.even.seconds, c.even.fits ? "" : " (over memory)", c.speedup());
  }
  return out;
}

std::string hetero_json(const HeteroSearchResult& r, const HeteroCluster& hc) {
  std::string best;
  for (const auto& c : r.best)
    best += fmt::format("{}{{\"plan\": {}, \"even\": {}, \"speedup\": {:.4f}}}", best.empty() ? "\n" : ",\n",
                        plan_json(c.plan, hc), plan_json(c.even, hc), c.speedup());
  return fmt::format("{{\"cluster\": \"{}\", \"priced\": {}, \"no_fit\": {}, \"invalid\": {}, \"over_capacity\": {}, "
                     "\"best\": [{}]}}",
                     hc.name, r.priced, r.no_fit, r.invalid, r.over_capacity, best);
}

namespace {

// The class of every world rank in the order tp-dp-pp: w = t + tp (d + dp s).
std::vector<int> rank_classes(const HeteroPlan& p) {
  const Layout& l = p.layout;
  std::vector<int> cls;
  for (int s = 0; s < l.pp; ++s)
    for (int d = 0; d < l.dp; ++d)
      for (int t = 0; t < l.tp; ++t) cls.push_back(p.class_of(d, s));
  return cls;
}

// Runs of consecutive world ranks of one class: (first, end, class).
std::vector<std::array<int, 3>> rank_runs(const HeteroPlan& p) {
  const std::vector<int> cls = rank_classes(p);
  std::vector<std::array<int, 3>> runs;
  for (size_t w = 0; w < cls.size();) {
    size_t e = w;
    while (e < cls.size() && cls[e] == cls[w]) ++e;
    runs.push_back({int(w), int(e), cls[w]});
    w = e;
  }
  return runs;
}

// "0-15 h100, 16-31 a100".
std::string rank_ranges(const HeteroPlan& p, const HeteroCluster& hc) {
  std::string s;
  for (const auto& [first, end, c] : rank_runs(p))
    s += fmt::format("{}{} {}", s.empty() ? "" : ", ", end - first == 1 ? fmt::format("{}", first)
                                                                          : fmt::format("{}-{}", first, end - 1),
                     hc.classes[size_t(c)].name);
  return s;
}

}  // namespace

std::string mpmd_launch_line(const HeteroPlan& p, const HeteroCluster& hc, std::string_view config_file) {
  std::string line = "mpirun";
  for (const auto& [first, end, c] : rank_runs(p))
    line += fmt::format("{} -np {} -x TRIAX_DEVICE_CLASS={} train_gpt --config {}", first ? " :" : "", end - first,
                        hc.classes[size_t(c)].name, config_file);
  return line;
}

std::string train_config_toml(const ModelShape& m, const HeteroChoice& c, const HeteroCluster& hc,
                              std::string_view config_file, std::string_view runtime_preset) {
  const HeteroPlan& p = c.plan.plan;
  const Layout& l = p.layout;
  std::string s = fmt::format("# Written by triax-plan --emit-config for cluster '{}', model '{}':\n#   {}\n", hc.name,
                              m.name, describe(p, hc));
  s += fmt::format("# Predicted {:.4g} s/step; the even split ({}) {:.4g} s/step: speed-up {:.2f}x.\n", c.plan.seconds,
                   describe(c.even.plan, hc), c.even.seconds, c.speedup());
  s += "# Launch (MPMD; world ranks in the order tp-dp-pp, each app context one device class):\n";
  s += "#   " + mpmd_launch_line(p, hc, config_file) + "\n";
  s += "# World ranks: " + rank_ranges(p, hc) + "\n\n";
  s += "[model]\n";
  // train_gpt's preset of the same model carries what the planner's shape does not (RoPE's base and
  // scaling, the norm's epsilon); the keys below fix the shape either way.
  if (!runtime_preset.empty()) s += fmt::format("model = \"{}\"\n", runtime_preset);
  s += fmt::format("num-layers = {}\nhidden-size = {}\nnum-attention-heads = {}\nffn-hidden-size = {}\n"
                   "vocab-size = {}\nmax-position-embeddings = {}\n",
                   m.layers, m.hidden, m.heads, m.ffn_hidden(), m.vocab, m.seq);
  if (m.rmsnorm) s += "normalization = \"RMSNorm\"\n";
  if (m.swiglu) s += "swiglu = true\n";
  if (m.rope) s += "position-embedding-type = \"rope\"\n";
  if (m.kv_head_count() != m.heads)
    s += fmt::format("group-query-attention = true\nnum-query-groups = {}\n", m.kv_head_count());
  if (!m.tied_embeddings) s += "untie-embeddings-and-output-weights = true\n";
  if (!m.bias) s += "disable-bias-linear = true\n";
  s += fmt::format("\n[parallel]\ntp = {}\npp = {}\ndp = {}\nrecompute = \"{}\"\nzero = {}\n", l.tp, l.pp, l.dp,
                   to_string(l.recompute), l.zero);
  if (l.pp > 1) s += fmt::format("pipeline-layers = [{}]\n", fmt::join(p.stage_layers, ", "));
  if (!p.stage_classes.empty()) s += fmt::format("stage-classes = \"{}\"\n", class_names(p.stage_classes, hc));
  if (uneven(p.replica_microbatches))
    s += fmt::format("dp-microbatches = \"{}\"\n", fmt::join(p.replica_microbatches, ","));
  s += fmt::format("\n[training]\nseq-length = {}\nmicro-batch-size = {}\nglobal-batch-size = {}\n", m.seq,
                   l.micro_batch, p.microbatches() * l.micro_batch);
  // The precision the plan was priced at (fp32: train_gpt's default; a CPU backend runs only that).
  if (l.precision == Precision::bf16) s += "bf16 = true\n";
  if (l.precision == Precision::fp16) s += "fp16 = true\n";
  return s;
}

}  // namespace triax::plan
