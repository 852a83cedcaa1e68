// Schedule vocabulary (names, parsing, validation, bounds) and the P2P placement shared by every
// generator. The generators themselves are in schedule_generators.cpp.
#include "triax/pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "triax/core/error.h"

namespace triax {

std::string_view pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "forward";
    case PipeOp::backward: return "backward";
    case PipeOp::backward_input: return "backward_input";
    case PipeOp::backward_weight: return "backward_weight";
    case PipeOp::send_activation: return "send_activation";
    case PipeOp::recv_activation: return "recv_activation";
    case PipeOp::send_grad: return "send_grad";
    case PipeOp::recv_grad: return "recv_grad";
  }
  return "?";
}

bool is_compute(PipeOp op) {
  return op == PipeOp::forward || op == PipeOp::backward || op == PipeOp::backward_input ||
         op == PipeOp::backward_weight;
}
bool is_send(PipeOp op) { return op == PipeOp::send_activation || op == PipeOp::send_grad; }
bool is_recv(PipeOp op) { return op == PipeOp::recv_activation || op == PipeOp::recv_grad; }

std::string short_name(const PipeInstr& in, int chunks) {
  std::string_view tag;
  switch (in.op) {
    case PipeOp::forward: tag = "F"; break;
    case PipeOp::backward: tag = "BW"; break;
    case PipeOp::backward_input: tag = "B"; break;
    case PipeOp::backward_weight: tag = "W"; break;
    case PipeOp::send_activation: tag = "SA"; break;
    case PipeOp::recv_activation: tag = "RA"; break;
    case PipeOp::send_grad: tag = "SG"; break;
    case PipeOp::recv_grad: tag = "RG"; break;
  }
  std::string out = chunks > 1 ? fmt::format("{}{}.{}", tag, in.mb, in.chunk) : fmt::format("{}{}", tag, in.mb);
  if (is_send(in.op)) out += fmt::format(">{}", in.peer);
  if (is_recv(in.op)) out += fmt::format("<{}", in.peer);
  return out;
}

std::string describe(const PipeInstr& in) {
  if (is_send(in.op)) return fmt::format("{}(mb={}, chunk={}, to stage {})", pipe_op_name(in.op), in.mb, in.chunk, in.peer);
  if (is_recv(in.op))
    return fmt::format("{}(mb={}, chunk={}, from stage {})", pipe_op_name(in.op), in.mb, in.chunk, in.peer);
  return fmt::format("{}(mb={}, chunk={})", pipe_op_name(in.op), in.mb, in.chunk);
}

std::string Schedule::label() const {
  return fmt::format("{} p={} v={} m={}", forward_only ? std::string_view("forward-only") : schedule_kind_name(kind),
                     stages, chunks, micro_batches);
}

StageChunk next_virtual(const Schedule& s, int stage, int chunk) {
  return stage + 1 < s.stages ? StageChunk{stage + 1, chunk} : StageChunk{0, chunk + 1};
}
StageChunk prev_virtual(const Schedule& s, int stage, int chunk) {
  return stage > 0 ? StageChunk{stage - 1, chunk} : StageChunk{s.stages - 1, chunk - 1};
}

int message_tag(const Schedule& s, int stage, const PipeInstr& in) {
  int sender_chunk = in.chunk;
  switch (in.op) {
    case PipeOp::send_activation:
    case PipeOp::send_grad: break;
    case PipeOp::recv_activation: sender_chunk = prev_virtual(s, stage, in.chunk).chunk; break;
    case PipeOp::recv_grad: sender_chunk = next_virtual(s, stage, in.chunk).chunk; break;
    default: return -1;
  }
  const bool grad = in.op == PipeOp::send_grad || in.op == PipeOp::recv_grad;
  return (in.mb * s.chunks + sender_chunk) * 2 + (grad ? 1 : 0);
}

void validate_schedule_config(ScheduleKind kind, int p, int v, int m) {
  const auto name = schedule_kind_name(kind);
  if (p < 1) TRIAX_THROW(ConfigError, "{} schedule: pipeline size pp must be >= 1, got {}", name, p);
  if (v < 1) TRIAX_THROW(ConfigError, "{} schedule: model chunks per stage vpp must be >= 1, got {}", name, v);
  if (m < 1) TRIAX_THROW(ConfigError, "{} schedule: number of micro-batches must be >= 1, got {}", name, m);
  if (static_cast<std::int64_t>(p) * v * m > (std::int64_t{1} << 24))
    TRIAX_THROW(ConfigError, "{} schedule: pp*vpp*micro-batches = {}*{}*{} is over 2^24 instructions per kind", name, p,
                v, m);
  switch (kind) {
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1:
      if (v != 1)
        TRIAX_THROW(ConfigError, "{} schedule runs one model chunk per stage (vpp=1), got vpp={}; use --schedule "
                    "interleaved for vpp > 1", name, v);
      break;
    case ScheduleKind::interleaved:
      if (v < 2)
        TRIAX_THROW(ConfigError, "interleaved schedule needs vpp >= 2 model chunks per stage, got vpp={} "
                    "(vpp=1 is plain 1f1b)", v);
      if (p < 2)
        TRIAX_THROW(ConfigError, "interleaved schedule needs pp >= 2 stages, got pp={} (with one stage there is no "
                    "bubble to shrink; use 1f1b)", p);
      if (m % p != 0) {
        const int lower = m - m % p, upper = lower + p;
        TRIAX_THROW(ConfigError, "interleaved schedule needs the number of micro-batches to be a multiple of pp: "
                    "m={} pp={} (m % pp = {}); use {}", m, p, m % p,
                    lower > 0 ? fmt::format("m={} or m={}", lower, upper) : fmt::format("m={}", upper));
      }
      break;
    case ScheduleKind::gpipe:
      if (v > 1 && p < 2)
        TRIAX_THROW(ConfigError, "gpipe schedule with vpp={} model chunks needs pp >= 2 stages, got pp={} "
                    "(chunks would hand activations to themselves on one rank)", v, p);
      break;
  }
}

int activation_bound(ScheduleKind kind, int p, int v, int m, int stage) {
  switch (kind) {
    case ScheduleKind::gpipe: return m * v;
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1: return std::min(p - stage, m);
    case ScheduleKind::interleaved: return std::min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
  }
  return 0;
}

int stash_bound(ScheduleKind kind, int p, int v, int m, int stage) {
  if (kind == ScheduleKind::zb_h1) return std::min(p, m);
  return activation_bound(kind, p, v, m, stage);
}

namespace {

// Unit costs of the placement simulation (a full backward is B + W). Integers keep ties exact.
std::int64_t unit_cost(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return 1;
    case PipeOp::backward: return 2;
    case PipeOp::backward_input: return 1;
    case PipeOp::backward_weight: return 1;
    default: return 0;
  }
}

// Sort key of an instruction in the global order: messages at the producer's end time come
// before computes starting at that time; messages are ordered among themselves by an id that both
// ends share (kind, sender's virtual stage, mb), computes by their position in the list.
struct Key {
  std::int64_t time;
  int cls;  // 0 message, 1 compute
  int a, b, c;
  auto tie() const { return std::tie(time, cls, a, b, c); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

}  // namespace

void insert_p2p(Schedule& s) {
  const int p = s.stages, v = s.chunks, m = s.micro_batches;
  if (static_cast<int>(s.lists.size()) != p)
    TRIAX_THROW(ConfigError, "{}: insert_p2p got {} lists for {} stages", s.label(), s.lists.size(), p);
  const auto key_of = [v](int mb, int chunk) { return static_cast<size_t>(mb) * v + chunk; };
  const size_t n_keys = static_cast<size_t>(m) * v;
  // End times of the forward and of the input-gradient pass (backward or B) of each (mb, chunk).
  std::vector<std::vector<std::int64_t>> f_end(p, std::vector<std::int64_t>(n_keys, -1));
  std::vector<std::vector<std::int64_t>> b_end(p, std::vector<std::int64_t>(n_keys, -1));
  std::vector<std::vector<std::int64_t>> start(p);
  for (int st = 0; st < p; ++st) {
    for (size_t i = 0; i < s.lists[st].size(); ++i) {
      const auto& in = s.lists[st][i];
      if (!is_compute(in.op))
        TRIAX_THROW(ConfigError, "{}: insert_p2p expects compute instructions only, stage {} instruction {} is {}",
                    s.label(), st, i, describe(in));
      if (in.mb < 0 || in.mb >= m || in.chunk < 0 || in.chunk >= v)
        TRIAX_THROW(ConfigError, "{}: stage {} instruction {} {} is out of range (mb < {}, chunk < {})", s.label(), st,
                    i, describe(in), m, v);
    }
    start[st].assign(s.lists[st].size(), -1);
  }
  // Unit-cost simulation of the compute orders, stage by stage until nothing moves.
  std::vector<size_t> pc(p, 0);
  std::vector<std::int64_t> clock(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int st = 0; st < p; ++st) {
      for (; pc[st] < s.lists[st].size(); ++pc[st]) {
        const auto& in = s.lists[st][pc[st]];
        const size_t k = key_of(in.mb, in.chunk);
        std::int64_t ready = 0;
        if (in.op == PipeOp::forward) {
          if (!s.is_first_virtual(st, in.chunk)) {
            const auto pv = prev_virtual(s, st, in.chunk);
            ready = f_end[pv.stage][key_of(in.mb, pv.chunk)];
          }
        } else if (in.op == PipeOp::backward || in.op == PipeOp::backward_input) {
          ready = f_end[st][k];  // its own forward first
          if (ready >= 0 && !s.is_last_virtual(st, in.chunk)) {
            const auto nv = next_virtual(s, st, in.chunk);
            const std::int64_t grad = b_end[nv.stage][key_of(in.mb, nv.chunk)];
            ready = grad < 0 ? -1 : std::max(ready, grad);
          }
        } else {  // backward_weight
          ready = b_end[st][k];
        }
        if (ready < 0) break;
        const std::int64_t t0 = std::max(clock[st], ready);
        start[st][pc[st]] = t0;
        clock[st] = t0 + unit_cost(in.op);
        if (in.op == PipeOp::forward) f_end[st][k] = clock[st];
        if (in.op == PipeOp::backward || in.op == PipeOp::backward_input) b_end[st][k] = clock[st];
        moved = true;
      }
    }
  }
  for (int st = 0; st < p; ++st)
    if (pc[st] < s.lists[st].size())
      TRIAX_THROW(ConfigError, "{}: the compute orders cannot complete: stage {} never gets past instruction {} {} "
                  "(its input from a neighbour stage, or its own forward, never comes)", s.label(), st, pc[st],
                  describe(s.lists[st][pc[st]]));

  // Merge computes and both ends of each message into each stage's list by the global key.
  std::vector<std::vector<std::pair<Key, PipeInstr>>> merged(p);
  for (int st = 0; st < p; ++st)
    for (size_t i = 0; i < s.lists[st].size(); ++i)
      merged[st].push_back({Key{start[st][i], 1, static_cast<int>(i), 0, 0}, s.lists[st][i]});
  for (int st = 0; st < p; ++st) {
    for (const auto& in : s.lists[st]) {
      const int vs = s.virtual_stage(st, in.chunk);
      if (in.op == PipeOp::forward && !s.is_last_virtual(st, in.chunk)) {
        const auto nv = next_virtual(s, st, in.chunk);
        const Key key{f_end[st][key_of(in.mb, in.chunk)], 0, 0, vs, in.mb};
        merged[st].push_back({key, {PipeOp::send_activation, in.mb, in.chunk, nv.stage}});
        merged[nv.stage].push_back({key, {PipeOp::recv_activation, in.mb, nv.chunk, st}});
      }
      if ((in.op == PipeOp::backward || in.op == PipeOp::backward_input) && !s.is_first_virtual(st, in.chunk)) {
        const auto pv = prev_virtual(s, st, in.chunk);
        const Key key{b_end[st][key_of(in.mb, in.chunk)], 0, 1, vs, in.mb};
        merged[st].push_back({key, {PipeOp::send_grad, in.mb, in.chunk, pv.stage}});
        merged[pv.stage].push_back({key, {PipeOp::recv_grad, in.mb, pv.chunk, st}});
      }
    }
  }
  for (int st = 0; st < p; ++st) {
    auto& v_st = merged[st];
    std::stable_sort(v_st.begin(), v_st.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    s.lists[st].clear();
    for (const auto& [key, in] : v_st) s.lists[st].push_back(in);
  }
}

std::string format_lists(const Schedule& s) {
  std::string out;
  for (int st = 0; st < static_cast<int>(s.lists.size()); ++st) {
    out += fmt::format("stage {}:", st);
    for (const auto& in : s.lists[st]) {
      out += ' ';
      out += short_name(in, s.chunks);
    }
    out += "\n";
  }
  return out;
}

}  // namespace triax
