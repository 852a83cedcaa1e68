// Human-readable tables and JSON objects for estimates and searches.
#include "triax/plan/report.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace triax::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

nlohmann::json to_json(const Estimate& e) {
  const auto& t = e.time;
  const auto& mem = e.memory;
  const auto& l = e.layout;
  nlohmann::json j;
  j["model"] = {{"name", e.model.name},       {"layers", e.model.layers}, {"hidden", e.model.hidden},
                {"heads", e.model.heads},     {"kv_heads", e.model.kv_head_count()},
                {"ffn", e.model.ffn_hidden()}, {"vocab", e.model.vocab},
                {"seq", e.model.seq},         {"global_batch", e.model.global_batch},
                {"parameters", total_parameters(e.model)},
                {"normalization", e.model.rmsnorm ? "RMSNorm" : "LayerNorm"},
                {"swiglu", e.model.swiglu},
                {"position_embedding", e.model.rope ? "rope" : e.model.learned_positions ? "learned_absolute" : "none"},
                {"bias", e.model.bias},
                {"tied_embeddings", e.model.tied_embeddings}};
  j["cluster"] = e.cluster;
  j["layout"] = {{"gpus", l.gpus()},
                 {"tp", l.tp},
                 {"cp", l.cp},
                 {"cp_comm", std::string(to_string(l.cp_comm))},
                 {"pp", l.pp},
                 {"dp", l.dp},
                 {"vpp", l.vpp},
                 {"micro_batch_size", l.micro_batch},
                 {"micro_batches", e.micro_batches},
                 {"schedule", std::string(to_string(l.schedule))},
                 {"recompute", std::string(to_string(l.recompute))},
                 {"sequence_parallel", l.sequence_parallel},
                 {"zero1", l.zero == 1},
                 {"zero", l.zero},
                 {"zero_shard", l.shard_size()},
                 {"precision", std::string(to_string(l.precision))},
                 {"attention", std::string(to_string(l.attention))},
                 {"dropout", l.dropout},
                 {"dp_overlap", l.dp_overlap},
                 {"grad_reduce_fp32", l.grad_reduce_fp32},
                 {"pp_scatter_gather", l.pp_scatter_gather},
                 {"tp_overlap_backward", l.tp_overlap_backward},
                 {"runtime_copies", l.runtime_copies},
                 {"summary", describe(l)}};
  j["seconds_per_iteration"] = e.seconds_per_iteration;
  j["tflops_per_gpu"] = e.tflops_per_gpu;
  j["mfu"] = e.mfu;
  j["tokens_per_second"] = e.tokens_per_second;
  j["time"] = {{"compute", t.compute},     {"bubble", t.bubble},   {"tp_comm", t.tp_comm}, {"cp_comm", t.cp_comm},
               {"pp_comm", t.pp_comm},     {"dp_comm", t.dp_comm}, {"optimizer", t.optimizer},
               {"core_sharing", t.core_sharing},
               {"dp_algorithm", e.dp_algorithm}};
  j["memory_gib"] = mem.total() / kGiB;
  j["fits"] = mem.fits();
  j["memory"] = {{"stage", mem.stage},
                 {"weights_gib", mem.weights / kGiB},
                 {"gradients_gib", mem.gradients / kGiB},
                 {"optimizer_gib", mem.optimizer / kGiB},
                 {"activations_gib", mem.activations / kGiB},
                 {"comm_buffers_gib", mem.comm_buffers / kGiB},
                 {"reserved_gib", mem.reserved / kGiB},
                 {"capacity_gib", mem.capacity / kGiB}};
  const DpTraffic& dt = e.dp_traffic;
  j["dp_traffic"] = {{"all_reduce_bytes", dt.all_reduce},
                     {"reduce_scatter_bytes", dt.reduce_scatter},
                     {"all_gather_bytes", dt.all_gather},
                     {"calls", dt.calls},
                     {"shard_ranks", dt.shard_group.ranks},
                     {"shard_nodes", dt.shard_group.nodes},
                     {"replica_groups", dt.replica_group.ranks}};
  const CpTraffic& ct = e.cp_traffic;
  j["cp_traffic"] = {{"bytes", ct.bytes},
                     {"seconds", ct.seconds},
                     {"exposed", ct.exposed},
                     {"hidden_share", ct.hidden_share()},
                     {"block_bytes", ct.per_layer.block_bytes},
                     {"layer_fwd_bytes", ct.per_layer.fwd_bytes},
                     {"layer_bwd_bytes", ct.per_layer.bwd_bytes},
                     {"ring_nodes", ct.per_layer.ring.nodes}};
  j["flops"] = {{"model_per_iteration", e.flops.model}, {"executed_per_iteration", e.flops.executed}};
  return j;
}

std::string seconds(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.3f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace

std::string format_estimate(const Estimate& e) {
  const auto& t = e.time;
  const auto& mem = e.memory;
  const double T = e.seconds_per_iteration;
  std::string out;
  const std::string kv = e.model.kv_head_count() != e.model.heads
                             ? fmt::format(" ({} key/value)", e.model.kv_head_count())
                             : std::string();
  const std::string choices = block_choices(e.model);
  out += fmt::format("model   {}: {} layers, hidden {}, {} heads{}, ffn {}, vocab {}, seq {}, batch {} ({:.2f}B params){}\n",
                     e.model.name, e.model.layers, e.model.hidden, e.model.heads, kv, e.model.ffn_hidden(),
                     e.model.vocab, e.model.seq, e.model.global_batch, total_parameters(e.model) / 1e9,
                     choices.empty() ? std::string() : "; " + choices);
  out += fmt::format("layout  {} on {} GPUs of {}; {} micro-batches per iteration\n", describe(e.layout),
                     e.layout.gpus(), e.cluster, e.micro_batches);
  out += fmt::format("time per iteration    {:>12}\n", seconds(T));
  auto row = [&](const char* name, double v) {
    out += fmt::format("  {:<20}{:>12}  {:5.1f}%\n", name, seconds(v), 100 * v / T);
  };
  row("compute", t.compute);
  row("pipeline bubble", t.bubble);
  row("tp comm (exposed)", t.tp_comm);
  if (e.layout.cp > 1) {
    row("cp comm (exposed)", t.cp_comm);
    const CpTraffic& ct = e.cp_traffic;
    out += fmt::format("  cp{} {} per step: {:.2f} GiB sent over {} ranks on {} node(s), {} busy, {:.0f}% hidden\n",
                       e.layout.cp, to_string(e.layout.cp_comm), ct.bytes / kGiB, ct.per_layer.ring.ranks,
                       ct.per_layer.ring.nodes, seconds(ct.seconds), 100 * ct.hidden_share());
  }
  row("pp comm (exposed)", t.pp_comm);
  row("dp comm (exposed)", t.dp_comm);
  const DpTraffic& dt = e.dp_traffic;
  if (e.layout.zero >= 2 && dt.total() > 0)
    out += fmt::format("  zero{} per step: all-gather {:.2f} GiB, reduce-scatter {:.2f} GiB over {} ranks on {} node(s), "
                       "all-reduce {:.2f} GiB over {} groups, {} calls\n",
                       e.layout.zero, dt.all_gather / kGiB, dt.reduce_scatter / kGiB, dt.shard_group.ranks,
                       dt.shard_group.nodes, dt.all_reduce / kGiB, dt.replica_group.ranks, dt.calls);
  row("optimizer", t.optimizer);
  if (t.core_sharing > 0) row("ranks sharing cores", t.core_sharing);
  out += fmt::format("throughput  {:.1f} TFLOP/s per GPU (executed, recompute included), MFU {:.1f}%, {:.0f} tokens/s\n",
                     e.tflops_per_gpu, 100 * e.mfu, e.tokens_per_second);
  out += fmt::format("memory per GPU (pipeline rank {})  {:.2f} GiB of {:.2f} GiB: {}\n", mem.stage,
                     mem.total() / kGiB, mem.capacity / kGiB, mem.fits() ? "fits" : "DOES NOT FIT");
  auto mrow = [&](const char* name, double v) { out += fmt::format("  {:<20}{:>9.2f} GiB\n", name, v / kGiB); };
  mrow("weights", mem.weights);
  mrow("gradients", mem.gradients);
  mrow("optimizer state", mem.optimizer);
  mrow("activations", mem.activations);
  mrow("comm buffers", mem.comm_buffers);
  mrow("reserved", mem.reserved);
  return out;
}

std::string estimate_json(const Estimate& e, int indent) { return to_json(e).dump(indent); }

std::string format_search(const SearchResult& r) {
  std::string out;
  out += fmt::format("searched {} layouts: {} invalid, {} do not fit in memory, {} ranked\n", r.enumerated,
                     r.invalid, r.no_fit, r.ranked);
  if (auto why = zero_explanation(r)) out += *why + "\n";
  if (auto why = cp_explanation(r)) out += *why + "\n";
  if (r.best.empty()) {
    out += "no layout fits\n";
  } else {
    out += fmt::format("\n{:>4}  {:<52} {:>10} {:>8} {:>6} {:>8}  {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}\n", "rank",
                       "layout", "s/iter", "TFLOP/s", "MFU", "mem GiB", "compute", "bubble", "tp+cp", "pp", "dp", "optim");
    int i = 1;
    for (const auto& e : r.best) {
      out += fmt::format("{:>4}  {:<52} {:>10.4g} {:>8.1f} {:>5.1f}% {:>8.1f}  {:>9.4g} {:>8.3g} {:>8.3g} {:>8.3g} {:>8.3g} {:>8.3g}\n",
                         i++, describe(e.layout), e.seconds_per_iteration, e.tflops_per_gpu, 100 * e.mfu,
                         e.memory.total() / kGiB, e.time.compute, e.time.bubble, e.time.tp_comm + e.time.cp_comm,
                         e.time.pp_comm,
                         e.time.dp_comm, e.time.optimizer);
    }
    out += "\nbest layout in detail:\n" + format_estimate(r.best.front());
  }
  if (!r.lost_by.empty()) {
    out += "\nfitting layouts outside the top list, by the component that cost them most against the best:\n";
    const Estimate& best = r.best.front();
    for (const auto& [why, n] : r.lost_by) {
      const Estimate& x = r.lost_example.at(why);
      out += fmt::format("  {:<10} {:>7}   fastest of them: {} at {:.4g} s/iter ({:+.3g} s against the best)\n",
                         to_string(why), n, describe(x.layout), x.seconds_per_iteration,
                         x.seconds_per_iteration - best.seconds_per_iteration);
    }
  }
  if (r.no_fit > 0) out += fmt::format("over memory capacity: {}\n", r.no_fit);
  if (!r.fastest_no_fit.empty()) {
    const auto& e = r.fastest_no_fit.front();
    out += fmt::format("  fastest of them: {} at {:.4g} s/iter needs {:.1f} GiB of {:.1f}\n", describe(e.layout),
                       e.seconds_per_iteration, e.memory.total() / kGiB, e.memory.capacity / kGiB);
  }
  if (!r.invalid_reasons.empty()) {
    out += "invalid, by rule:\n";
    for (const auto& [why, n] : r.invalid_reasons) out += fmt::format("  {:>7}  {}\n", n, why);
  }
  return out;
}

std::string search_json(const SearchResult& r, int indent) {
  nlohmann::json j = r.best.empty() ? nlohmann::json::object() : to_json(r.best.front());
  if (r.best.empty()) {
    j["fits"] = false;
  }
  nlohmann::json s;
  s["enumerated"] = r.enumerated;
  s["invalid"] = r.invalid;
  s["no_fit"] = r.no_fit;
  s["ranked"] = r.ranked;
  s["invalid_reasons"] = nlohmann::json::object();
  for (const auto& [why, n] : r.invalid_reasons) s["invalid_reasons"][why] = n;
  s["lost_by"] = nlohmann::json::object();
  for (const auto& [why, n] : r.lost_by) s["lost_by"][std::string(to_string(why))] = n;
  s["lost_example"] = nlohmann::json::object();
  for (const auto& [why, e] : r.lost_example) s["lost_example"][std::string(to_string(why))] = to_json(e);
  s["best"] = nlohmann::json::array();
  for (const auto& e : r.best) s["best"].push_back(to_json(e));
  if (!r.fastest_no_fit.empty()) s["fastest_no_fit"] = to_json(r.fastest_no_fit.front());
  if (auto why = zero_explanation(r)) s["zero_needed"] = *why;
  if (auto why = cp_explanation(r)) s["cp_needed"] = *why;
  j["search"] = s;
  return j.dump(indent);
}

}  // namespace triax::plan
