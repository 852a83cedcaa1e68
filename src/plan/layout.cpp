// Layout enums, element sizes, and the validity rules of a 3D layout.
#include "triax/plan/layout.h"

#include <fmt/format.h>

#include <array>
#include <utility>

#include "triax/core/error.h"

namespace triax::plan {

namespace {
template <class E, size_t N>
E parse_enum(std::string_view what, std::string_view s, const std::array<std::pair<const char*, E>, N>& names) {
  std::string known;
  for (const auto& [n, e] : names) {
    if (s == n) return e;
    known += known.empty() ? std::string(n) : fmt::format(", {}", n);
  }
  TRIAX_THROW(ConfigError, "unknown {} '{}'; expected one of: {}", what, s, known);
}
constexpr std::array<std::pair<const char*, Schedule>, 4> kSchedules{{{"gpipe", Schedule::gpipe},
                                                                      {"1f1b", Schedule::one_f_one_b},
                                                                      {"interleaved", Schedule::interleaved},
                                                                      {"zb-h1", Schedule::zb_h1}}};
constexpr std::array<std::pair<const char*, Recompute>, 3> kRecompute{
    {{"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}}};
constexpr std::array<std::pair<const char*, Precision>, 3> kPrecision{
    {{"bf16", Precision::bf16}, {"fp16", Precision::fp16}, {"fp32", Precision::fp32}}};
constexpr std::array<std::pair<const char*, AttentionKernel>, 2> kAttention{
    {{"fused", AttentionKernel::fused}, {"unfused", AttentionKernel::unfused}}};

template <class E, size_t N>
std::string_view name_of(E e, const std::array<std::pair<const char*, E>, N>& names) {
  for (const auto& [n, v] : names)
    if (v == e) return n;
  return "?";
}
}  // namespace

std::string_view to_string(Schedule s) { return name_of(s, kSchedules); }
std::string_view to_string(Recompute r) { return name_of(r, kRecompute); }
std::string_view to_string(Precision p) { return name_of(p, kPrecision); }
std::string_view to_string(AttentionKernel a) { return name_of(a, kAttention); }
Schedule parse_schedule(std::string_view s) { return parse_enum("schedule", s, kSchedules); }
Recompute parse_recompute(std::string_view s) { return parse_enum("recompute mode", s, kRecompute); }
Precision parse_precision(std::string_view s) { return parse_enum("precision", s, kPrecision); }
AttentionKernel parse_attention(std::string_view s) { return parse_enum("attention kernel", s, kAttention); }

int activation_bytes(const Layout& l) { return l.precision == Precision::fp32 ? 4 : 2; }
int parameter_bytes(const Layout& l) { return l.precision == Precision::fp32 ? 4 : 2; }
int gradient_bytes(const Layout& l) {
  return (l.precision == Precision::fp32 || l.grad_reduce_fp32) ? 4 : 2;
}

long micro_batches(const ModelShape& m, const Layout& l) {
  const long per_replica = m.global_batch / l.dp;
  return per_replica / l.micro_batch;
}

std::optional<std::string> layout_problem(const ModelShape& m, const Cluster& c, const Layout& l,
                                          const LayoutRules& rules) {
  if (l.tp < 1 || l.pp < 1 || l.dp < 1 || l.vpp < 1 || l.micro_batch < 1)
    return fmt::format("tp, pp, dp, vpp and micro-batch size must be >= 1 (got tp{} pp{} dp{} v{} mbs{})",
                       l.tp, l.pp, l.dp, l.vpp, l.micro_batch);
  const long gpus = long(l.tp) * l.pp * l.dp;
  if (gpus > c.total_devices())
    return fmt::format("tp*pp*dp = {} GPUs exceeds the cluster's {} ({} nodes x {})", gpus,
                       c.total_devices(), c.nodes, c.gpus_per_node);
  if (m.heads % l.tp != 0) return fmt::format("tp {} does not divide heads {}", l.tp, m.heads);
  if (m.kv_head_count() % l.tp != 0)
    return fmt::format("tp {} does not divide kv_heads {} (each rank holds whole key/value groups)", l.tp,
                       m.kv_head_count());
  if (m.ffn_hidden() % l.tp != 0)
    return fmt::format("tp {} does not divide ffn {}", l.tp, m.ffn_hidden());
  const int G = c.gpus_per_node;
  if (l.tp > G) {
    if (!rules.allow_cross_node_tp)
      return fmt::format("tp {} exceeds the {} GPUs of a node (allow with --allow-cross-node-tp)", l.tp, G);
    if (l.tp % G != 0) return fmt::format("tp {} spanning nodes must be a multiple of {} GPUs per node", l.tp, G);
  } else if (G % l.tp != 0) {
    return fmt::format("tp {} does not divide the {} GPUs of a node (a tp group would straddle nodes)", l.tp, G);
  }
  if (m.layers % (l.pp * l.vpp) != 0)
    return fmt::format("pp*vpp = {} does not divide layers {}", l.pp * l.vpp, m.layers);
  if (l.schedule == Schedule::interleaved) {
    if (l.pp < 2) return fmt::format("the interleaved schedule needs pp >= 2 (got pp {})", l.pp);
    if (l.vpp < 2) return fmt::format("the interleaved schedule needs vpp >= 2 (got vpp {})", l.vpp);
  } else if (l.vpp != 1) {
    return fmt::format("vpp {} needs the interleaved schedule (got {})", l.vpp, to_string(l.schedule));
  }
  if (m.global_batch % (long(l.dp) * l.micro_batch) != 0)
    return fmt::format("dp*mbs = {} does not divide global batch {}", long(l.dp) * l.micro_batch, m.global_batch);
  const long mb = micro_batches(m, l);
  if (l.schedule == Schedule::interleaved && mb % l.pp != 0)
    return fmt::format("interleaved schedule: micro-batches {} must be a multiple of pp {}", mb, l.pp);
  if (l.sequence_parallel && m.seq % l.tp != 0)
    return fmt::format("sequence parallel: tp {} does not divide seq {}", l.tp, m.seq);
  return std::nullopt;
}

std::string describe(const Layout& l) {
  std::string s = fmt::format("tp{} pp{} dp{}", l.tp, l.pp, l.dp);
  if (l.vpp > 1) s += fmt::format(" v{}", l.vpp);
  s += fmt::format(" mbs{} {} rc={}", l.micro_batch, to_string(l.schedule), to_string(l.recompute));
  if (l.sequence_parallel) s += " sp";
  if (l.zero1) s += " zero1";
  if (l.precision != Precision::bf16) s += fmt::format(" {}", to_string(l.precision));
  return s;
}

}  // namespace triax::plan
