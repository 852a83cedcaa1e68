// Layout enums, element sizes, and the validity rules of a 3D layout.
#include "triax/plan/layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "triax/core/error.h"

namespace triax {
// Names of the planner's own enums (the shared ones are in core/enum_names.h).
template <>
struct EnumNames<plan::Precision> {
  static constexpr std::string_view what = "precision";
  static constexpr std::array<EnumName<plan::Precision>, 3> table{
      {{"bf16", plan::Precision::bf16}, {"fp16", plan::Precision::fp16}, {"fp32", plan::Precision::fp32}}};
};
template <>
struct EnumNames<plan::AttentionKernel> {
  static constexpr std::string_view what = "attention kernel";
  static constexpr std::array<EnumName<plan::AttentionKernel>, 2> table{
      {{"fused", plan::AttentionKernel::fused}, {"unfused", plan::AttentionKernel::unfused}}};
};
template <>
struct EnumNames<plan::CpComm> {
  static constexpr std::string_view what = "context-parallel communication";
  static constexpr std::array<EnumName<plan::CpComm>, 2> table{
      {{"p2p", plan::CpComm::p2p}, {"allgather", plan::CpComm::allgather}}};
};
}  // namespace triax

namespace triax::plan {

std::string_view to_string(Schedule s) { return enum_name(s); }
std::string_view to_string(Recompute r) { return enum_name(r); }
std::string_view to_string(Precision p) { return enum_name(p); }
std::string_view to_string(AttentionKernel a) { return enum_name(a); }
std::string_view to_string(CpComm c) { return enum_name(c); }
Schedule parse_schedule(std::string_view s) { return parse_enum<Schedule>(s); }
Recompute parse_recompute(std::string_view s) { return parse_enum<Recompute>(s); }
Precision parse_precision(std::string_view s) { return parse_enum<Precision>(s); }
AttentionKernel parse_attention(std::string_view s) { return parse_enum<AttentionKernel>(s); }
CpComm parse_cp_comm(std::string_view s) { return parse_enum<CpComm>(s); }

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
  if (l.tp < 1 || l.cp < 1 || l.pp < 1 || l.dp < 1 || l.vpp < 1 || l.micro_batch < 1)
    return fmt::format("tp, cp, pp, dp, vpp and micro-batch size must be >= 1 (got tp{} cp{} pp{} dp{} v{} mbs{})",
                       l.tp, l.cp, l.pp, l.dp, l.vpp, l.micro_batch);
  const long gpus = long(l.tp) * l.cp * l.pp * l.dp;
  if (gpus > c.total_devices())
    return fmt::format("{} = {} GPUs exceeds the cluster's {} ({} nodes x {})", l.cp > 1 ? "tp*cp*pp*dp" : "tp*pp*dp",
                       gpus, c.total_devices(), c.nodes, c.gpus_per_node);
  if (auto why = cp_problem(m, l)) return why;
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
  return zero_problem(l);
}

std::optional<std::string> cp_problem(const ModelShape& m, const Layout& l) {
  if (l.cp < 1) return fmt::format("cp {} must be >= 1", l.cp);
  if (l.cp == 1) return std::nullopt;
  if (m.seq % (2 * l.cp) != 0)
    return fmt::format("cp {}: seq {} is not divisible by 2*cp = {} (zigzag chunks)", l.cp, m.seq, 2 * l.cp);
  if (l.sequence_parallel && (m.seq / l.cp) % l.tp != 0)
    return fmt::format("sequence parallel with cp {}: tp {} does not divide the {} tokens of a CP rank", l.cp, l.tp,
                       m.seq / l.cp);
  return std::nullopt;
}

std::optional<std::string> zero_problem(const Layout& l) {
  if (l.zero < 0 || l.zero > 3) return fmt::format("zero {} is not a ZeRO level (0, 1, 2 or 3)", l.zero);
  if (l.zero_shard < 0) return fmt::format("zero shard size {} must be >= 0 (0 = all of dp)", l.zero_shard);
  // The shard groups are taken from the dp x cp ranks that hold the same weights ("dp" without cp).
  const std::string ranks = l.cp > 1 ? fmt::format("dp*cp {}", l.grad_ranks()) : fmt::format("dp {}", l.dp);
  if (l.zero_shard > 0 && l.grad_ranks() % l.zero_shard != 0)
    return fmt::format("zero shard size {} does not divide {}", l.zero_shard, ranks);
  if (l.zero_shard > 1 && l.zero_shard < l.grad_ranks() && l.zero < 2)
    return fmt::format("hybrid sharding (zero shard size {} < {}) needs zero 2 or 3 (got zero {})", l.zero_shard,
                       ranks, l.zero);
  return std::nullopt;
}

bool parse_zero_token(std::string_view token, Layout& l) {
  auto number = [&](std::string_view prefix, int lo, int hi) {
    const std::string_view digits = token.substr(prefix.size());
    int v = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
    if (digits.empty() || ec != std::errc{} || end != digits.data() + digits.size() || v < lo || v > hi)
      TRIAX_THROW(ConfigError, "'{}': expected {}N with N from {} to {}", token, prefix, lo, hi);
    return v;
  };
  if (token.starts_with("zero")) {
    l.zero = number("zero", 0, 3);
    return true;
  }
  if (token.starts_with("hsdp")) {
    l.zero_shard = number("hsdp", 1, 1 << 20);
    return true;
  }
  return false;
}

void parse_zero_spec(std::string_view spec, Layout& l) {
  if (spec.size() == 1 && spec[0] >= '0' && spec[0] <= '3') {
    l.zero = spec[0] - '0';
    return;
  }
  size_t pos = 0;
  while (pos < spec.size()) {
    const size_t end = std::min(spec.find(' ', pos), spec.size());
    const std::string_view token = spec.substr(pos, end - pos);
    if (!token.empty() && !parse_zero_token(token, l))
      TRIAX_THROW(ConfigError, "ZeRO spec '{}': unknown token '{}' (expected 0..3, zero1, zero2, zero3, hsdpN)", spec,
                  token);
    pos = end + 1;
  }
}

std::string describe(const Layout& l) {
  std::string s = fmt::format("tp{}", l.tp);
  if (l.cp > 1) s += fmt::format(" cp{}", l.cp);
  s += fmt::format(" pp{} dp{}", l.pp, l.dp);
  if (l.vpp > 1) s += fmt::format(" v{}", l.vpp);
  s += fmt::format(" mbs{} {} rc={}", l.micro_batch, to_string(l.schedule), to_string(l.recompute));
  if (l.sequence_parallel) s += " sp";
  if (l.cp > 1 && l.cp_comm == CpComm::allgather) s += " cp-allgather";
  if (l.zero > 0) s += fmt::format(" zero{}", l.zero);
  if (l.zero_shard > 0 && l.zero_shard < l.grad_ranks()) s += fmt::format(" hsdp{}", l.zero_shard);
  if (l.precision != Precision::bf16) s += fmt::format(" {}", to_string(l.precision));
  return s;
}

}  // namespace triax::plan
