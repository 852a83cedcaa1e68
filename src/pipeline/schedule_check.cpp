// The schedule checker: structure, per-stage order, message matching, channel order, a walk of
// every stage under each P2P model (deadlock), and the memory bounds. Each phase throws on the
// first violation, naming the stage and the instruction index.
#include "triax/pipeline/schedule_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "schedule_index.h"
#include "triax/core/error.h"

namespace triax {

std::string_view p2p_model_name(P2pModel m) {
  switch (m) {
    case P2pModel::eager: return "eager";
    case P2pModel::rendezvous: return "rendezvous";
    case P2pModel::blocking: return "blocking";
  }
  return "?";
}

namespace {

using detail::ScheduleIndex;

std::string at(const Schedule& s, int stage, size_t i) {
  return fmt::format("stage {}, instruction {} {}", stage, i, describe(s.lists[stage][i]));
}

// ---- phase 1-2: shape and the order of each stage's own list ----

void check_shape(const Schedule& s, const CheckOptions& o) {
  const auto label = s.label();
  if (s.stages < 1 || s.chunks < 1 || s.micro_batches < 1)
    TRIAX_THROW(ConfigError, "{}: stages, chunks and micro-batches must all be >= 1", label);
  if (static_cast<int>(s.lists.size()) != s.stages)
    TRIAX_THROW(ConfigError, "{}: {} instruction lists for {} stages (one list per stage expected)", label,
                s.lists.size(), s.stages);
  if (o.check_bounds && (static_cast<int>(s.activation_bound.size()) != s.stages ||
                         static_cast<int>(s.stash_bound.size()) != s.stages))
    TRIAX_THROW(ConfigError, "{}: {} activation bounds and {} stash bounds for {} stages (one per stage expected)",
                label, s.activation_bound.size(), s.stash_bound.size(), s.stages);
  for (int st = 0; st < s.stages; ++st) {
    for (size_t i = 0; i < s.lists[st].size(); ++i) {
      const auto& in = s.lists[st][i];
      if (static_cast<unsigned>(in.op) >= static_cast<unsigned>(detail::kNumPipeOps))
        TRIAX_THROW(ConfigError, "{}: stage {}, instruction {} has an unknown op {}", label, st, i,
                    static_cast<int>(in.op));
      if (in.mb < 0 || in.mb >= s.micro_batches || in.chunk < 0 || in.chunk >= s.chunks)
        TRIAX_THROW(ConfigError, "{}: {} is out of range: expected 0 <= mb < {} and 0 <= chunk < {}", label,
                    at(s, st, i), s.micro_batches, s.chunks);
      if (is_compute(in.op)) {
        if (in.peer != -1)
          TRIAX_THROW(ConfigError, "{}: {} is a compute instruction but names peer {} (expected -1)", label,
                      at(s, st, i), in.peer);
        continue;
      }
      // Which neighbour a message goes to (or comes from) is fixed by the virtual pipeline.
      const bool to_next = in.op == PipeOp::send_activation || in.op == PipeOp::recv_grad;
      if (to_next && s.is_last_virtual(st, in.chunk))
        TRIAX_THROW(ConfigError, "{}: {} but stage {} chunk {} is the last virtual stage: there is no next stage to "
                    "talk to", label, at(s, st, i), st, in.chunk);
      if (!to_next && s.is_first_virtual(st, in.chunk))
        TRIAX_THROW(ConfigError, "{}: {} but stage {} chunk {} is the first virtual stage: there is no previous "
                    "stage to talk to", label, at(s, st, i), st, in.chunk);
      const auto nb = to_next ? next_virtual(s, st, in.chunk) : prev_virtual(s, st, in.chunk);
      if (in.peer != nb.stage)
        TRIAX_THROW(ConfigError, "{}: {} names peer {}, expected stage {} (the {} virtual stage, chunk {} there)",
                    label, at(s, st, i), in.peer, nb.stage, to_next ? "next" : "previous", nb.chunk);
    }
  }
}

// Where each instruction of a stage's list stands, per op and (mb, chunk) key mb * chunks + chunk;
// -1: not in the list.
using SeenAt = std::array<std::vector<int>, detail::kNumPipeOps>;

// What never came in stage st's list: forward, backward (and W after B), and the sends of what was
// produced.
void check_nothing_missing(const Schedule& s, int st, const SeenAt& seen) {
  const auto label = s.label();
  const int v = s.chunks;
  for (int mb = 0; mb < s.micro_batches; ++mb) {
    for (int c = 0; c < v; ++c) {
      const size_t k = static_cast<size_t>(mb) * v + c;
      const auto pos = [&](PipeOp op) { return seen[static_cast<size_t>(op)][k]; };
      if (pos(PipeOp::forward) < 0)
        TRIAX_THROW(ConfigError, "{}: stage {} never runs forward(mb={}, chunk={}); every (mb, chunk) is forwarded "
                    "once on every stage", label, st, mb, c);
      if (s.forward_only) {
        for (PipeOp op : {PipeOp::backward, PipeOp::backward_input, PipeOp::backward_weight, PipeOp::send_grad,
                          PipeOp::recv_grad})
          if (pos(op) >= 0)
            TRIAX_THROW(ConfigError, "{}: {} in a forward-only schedule", label, at(s, st, static_cast<size_t>(pos(op))));
        if (!s.is_last_virtual(st, c) && pos(PipeOp::send_activation) < 0)
          TRIAX_THROW(ConfigError, "{}: {} never sends its output: expected send_activation(mb={}, chunk={}, to stage "
                      "{}) after it", label, at(s, st, static_cast<size_t>(pos(PipeOp::forward))), mb, c,
                      next_virtual(s, st, c).stage);
        continue;
      }
      if (pos(PipeOp::backward) < 0 && pos(PipeOp::backward_input) < 0)
        TRIAX_THROW(ConfigError, "{}: {} has no backward (neither backward nor backward_input follows it)", label,
                    at(s, st, static_cast<size_t>(pos(PipeOp::forward))));
      if (pos(PipeOp::backward_input) >= 0 && pos(PipeOp::backward_weight) < 0)
        TRIAX_THROW(ConfigError, "{}: {} has no backward_weight after it (the weight gradient is never computed)",
                    label, at(s, st, static_cast<size_t>(pos(PipeOp::backward_input))));
      if (!s.is_last_virtual(st, c) && pos(PipeOp::send_activation) < 0)
        TRIAX_THROW(ConfigError, "{}: {} never sends its output: expected send_activation(mb={}, chunk={}, to stage "
                    "{}) after it", label, at(s, st, static_cast<size_t>(pos(PipeOp::forward))), mb, c,
                    next_virtual(s, st, c).stage);
      if (!s.is_first_virtual(st, c) && pos(PipeOp::send_grad) < 0) {
        const int b = std::max(pos(PipeOp::backward), pos(PipeOp::backward_input));
        TRIAX_THROW(ConfigError, "{}: {} never sends its input gradient: expected send_grad(mb={}, chunk={}, to "
                    "stage {}) after it", label, at(s, st, static_cast<size_t>(b)), mb, c,
                    prev_virtual(s, st, c).stage);
      }
    }
  }
}

void check_stage_order(const Schedule& s, int st) {
  const auto label = s.label();
  const int v = s.chunks;
  const size_t keys = static_cast<size_t>(s.micro_batches) * v;
  SeenAt seen;
  for (auto& t : seen) t.assign(keys, -1);
  const auto& list = s.lists[st];
  const auto seen_at = [&](PipeOp op, const PipeInstr& in) {
    return seen[static_cast<size_t>(op)][static_cast<size_t>(in.mb) * v + in.chunk];
  };
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& in = list[i];
    const size_t k = static_cast<size_t>(in.mb) * v + in.chunk;
    int& slot = seen[static_cast<size_t>(in.op)][k];
    if (slot >= 0)
      TRIAX_THROW(ConfigError, "{}: {} appears a second time (first at instruction {}); each (mb, chunk) is "
                  "forwarded, backed and sent once per stage", label, at(s, st, i), slot);
    const bool first = s.is_first_virtual(st, in.chunk), last = s.is_last_virtual(st, in.chunk);
    const int f = seen_at(PipeOp::forward, in), bw = seen_at(PipeOp::backward, in),
              b = seen_at(PipeOp::backward_input, in);
    switch (in.op) {
      case PipeOp::forward:
        if (!first && seen_at(PipeOp::recv_activation, in) < 0)
          TRIAX_THROW(ConfigError, "{}: {}: its input was never received: expected recv_activation(mb={}, chunk={}, from "
                      "stage {}) earlier in the list", label, at(s, st, i), in.mb, in.chunk,
                      prev_virtual(s, st, in.chunk).stage);
        break;
      case PipeOp::backward:
      case PipeOp::backward_input: {
        if (f < 0)
          TRIAX_THROW(ConfigError, "{}: {}: comes before the forward(mb={}, chunk={}) it differentiates", label,
                      at(s, st, i), in.mb, in.chunk);
        const int other = in.op == PipeOp::backward ? b : bw;
        if (other >= 0)
          TRIAX_THROW(ConfigError, "{}: {}: (mb={}, chunk={}) already has a {} at instruction {}: use either one full "
                      "backward or B then W", label, at(s, st, i), in.mb, in.chunk,
                      in.op == PipeOp::backward ? "backward_input" : "backward", other);
        if (!last && seen_at(PipeOp::recv_grad, in) < 0)
          TRIAX_THROW(ConfigError, "{}: {}: its output gradient was never received: expected recv_grad(mb={}, chunk={}, "
                      "from stage {}) earlier in the list", label, at(s, st, i), in.mb, in.chunk,
                      next_virtual(s, st, in.chunk).stage);
        break;
      }
      case PipeOp::backward_weight:
        if (bw >= 0)
          TRIAX_THROW(ConfigError, "{}: {}: (mb={}, chunk={}) already had a full backward at instruction {}", label,
                      at(s, st, i), in.mb, in.chunk, bw);
        if (b < 0)
          TRIAX_THROW(ConfigError, "{}: {}: comes before backward_input(mb={}, chunk={}) (W needs what B leaves)", label,
                      at(s, st, i), in.mb, in.chunk);
        break;
      case PipeOp::send_activation:
        if (f < 0)
          TRIAX_THROW(ConfigError, "{}: {}: comes before forward(mb={}, chunk={}), which produces what it sends", label,
                      at(s, st, i), in.mb, in.chunk);
        break;
      case PipeOp::send_grad:
        if (bw < 0 && b < 0)
          TRIAX_THROW(ConfigError, "{}: {}: comes before the backward of (mb={}, chunk={}), which produces what it sends",
                      label, at(s, st, i), in.mb, in.chunk);
        break;
      case PipeOp::recv_activation:
      case PipeOp::recv_grad: break;
    }
    slot = static_cast<int>(i);
  }
  check_nothing_missing(s, st, seen);
}

// ---- phase 3: channels agree on the order ----
// (Every message has its other end once each stage's list passed check_stage_order: a send
// exists for every (mb, chunk) that is not at the end of the virtual pipeline, and the
// neighbour's forward/backward of that micro-batch requires the matching receive before it.)

void check_fifo(const Schedule& s, const ScheduleIndex& ix) {
  // channel (src, dst, grad?) -> indices on the sender and on the receiver, in list order.
  std::map<std::tuple<int, int, bool>, std::pair<std::vector<int>, std::vector<int>>> ch;
  for (int st = 0; st < s.stages; ++st) {
    for (size_t i = 0; i < s.lists[st].size(); ++i) {
      const auto& in = s.lists[st][i];
      const bool grad = in.op == PipeOp::send_grad || in.op == PipeOp::recv_grad;
      if (is_send(in.op)) ch[{st, in.peer, grad}].first.push_back(static_cast<int>(i));
      if (is_recv(in.op)) ch[{in.peer, st, grad}].second.push_back(static_cast<int>(i));
    }
  }
  for (const auto& [key, lists] : ch) {
    const auto [src, dst, grad] = key;
    const auto& [sends, recvs] = lists;
    for (size_t k = 0; k < std::min(sends.size(), recvs.size()); ++k) {
      if (ix.match[src][static_cast<size_t>(sends[k])] == std::pair<int, int>{dst, recvs[k]}) continue;
      TRIAX_THROW(ConfigError, "{}: channel stage {} -> stage {} ({}) is out of order: send #{} is {} but receive "
                  "#{} posted is {}; executors that match messages by channel order (one MPI tag or NCCL stream "
                  "per channel) need both ends in the same order", s.label(), src, dst,
                  grad ? "gradients" : "activations", k, at(s, src, static_cast<size_t>(sends[k])), k,
                  at(s, dst, static_cast<size_t>(recvs[k])));
    }
  }
}

// ---- phase 4: walk all stages together under one P2P model ----

struct Waiting {
  bool blocked = false;
  int stage = -1, index = -1;  // the instruction waited for
  std::string_view verb;       // "issue", "post", "reach"
};

Waiting waits_for(const Schedule& s, const ScheduleIndex& ix, const std::vector<size_t>& pc, int st, P2pModel model) {
  const size_t i = pc[st];
  const auto& in = s.lists[st][i];
  if (is_compute(in.op)) {
    const int r = ix.consumes[st][i];
    if (r < 0) return {};
    const auto [ms, mi] = ix.match[st][static_cast<size_t>(r)];
    return {pc[ms] <= static_cast<size_t>(mi), ms, mi, "issue"};
  }
  const auto [ms, mi] = ix.match[st][i];
  if (is_send(in.op)) {
    if (model == P2pModel::eager) return {};
    if (model == P2pModel::rendezvous) return {pc[ms] <= static_cast<size_t>(mi), ms, mi, "post"};
    return {pc[ms] < static_cast<size_t>(mi), ms, mi, "reach"};
  }
  if (model != P2pModel::blocking) return {};
  return {pc[ms] < static_cast<size_t>(mi), ms, mi, "reach"};
}

void check_deadlock(const Schedule& s, const ScheduleIndex& ix, P2pModel model) {
  std::vector<size_t> pc(s.stages, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int st = 0; st < s.stages; ++st)
      while (pc[st] < s.lists[st].size() && !waits_for(s, ix, pc, st, model).blocked) {
        ++pc[st];
        moved = true;
      }
  }
  std::string stuck;
  for (int st = 0; st < s.stages; ++st) {
    if (pc[st] >= s.lists[st].size()) continue;
    const auto w = waits_for(s, ix, pc, st, model);
    const auto& peer_list = s.lists[w.stage];
    const std::string peer_at = pc[w.stage] < peer_list.size()
                                    ? fmt::format("stage {} is stuck at its instruction {} {}", w.stage, pc[w.stage],
                                                  describe(peer_list[pc[w.stage]]))
                                    : fmt::format("stage {} has finished", w.stage);
    stuck += fmt::format("{}{} waits for stage {} to {} its instruction {} {} ({})", stuck.empty() ? "" : "; ",
                         at(s, st, pc[st]), w.stage, w.verb, w.index, describe(peer_list[static_cast<size_t>(w.index)]),
                         peer_at);
  }
  if (!stuck.empty())
    TRIAX_THROW(ConfigError, "{}: deadlock under the {} P2P model: {}", s.label(), p2p_model_name(model), stuck);
}

// ---- phase 5: stored activations ----

void measure_and_check_bounds(const Schedule& s, bool check, std::vector<StageCheck>& out) {
  for (int st = 0; st < s.stages; ++st) {
    auto& r = out[st];
    int act = 0, stash = 0;
    for (size_t i = 0; i < s.lists[st].size(); ++i) {
      const auto& in = s.lists[st][i];
      ++r.instructions;
      r.computes += is_compute(in.op);
      r.sends += is_send(in.op);
      r.recvs += is_recv(in.op);
      switch (in.op) {
        case PipeOp::forward: ++act, ++stash; break;
        case PipeOp::backward: --act, --stash; break;
        case PipeOp::backward_input: --act; break;
        case PipeOp::backward_weight: --stash; break;
        default: break;
      }
      r.peak_activations = std::max(r.peak_activations, act);
      r.peak_stash = std::max(r.peak_stash, stash);
      if (!check) continue;
      if (act > s.activation_bound[st])
        TRIAX_THROW(ConfigError, "{}: at {}: {} micro-batch activations stored (forward done, backward not yet) "
                    "exceed the schedule's bound {} for stage {}", s.label(), at(s, st, i), act,
                    s.activation_bound[st], st);
      if (stash > s.stash_bound[st])
        TRIAX_THROW(ConfigError, "{}: at {}: {} micro-batches awaiting their weight gradient (forward done, W not "
                    "yet) exceed the schedule's stash bound {} for stage {}", s.label(), at(s, st, i), stash,
                    s.stash_bound[st], st);
    }
  }
}

}  // namespace

CheckReport check_schedule(const Schedule& s, const CheckOptions& opts) {
  check_shape(s, opts);
  for (int st = 0; st < s.stages; ++st) check_stage_order(s, st);
  const auto ix = detail::index_schedule(s);
  if (opts.fifo_channels) check_fifo(s, ix);
  CheckReport rep;
  for (auto m : opts.models) {
    check_deadlock(s, ix, m);
    rep.models.push_back(m);
  }
  rep.stages.resize(s.stages);
  measure_and_check_bounds(s, opts.check_bounds, rep.stages);
  for (const auto& st : rep.stages) rep.messages += st.sends;
  return rep;
}

std::string CheckReport::summary(const Schedule& s) const {
  std::string models_s;
  for (auto m : models) models_s += fmt::format("{}{}", models_s.empty() ? "" : ", ", p2p_model_name(m));
  std::string act, stash;
  for (size_t st = 0; st < stages.size(); ++st) {
    const bool have = st < s.activation_bound.size() && st < s.stash_bound.size();
    act += have ? fmt::format(" {}/{}", stages[st].peak_activations, s.activation_bound[st])
                : fmt::format(" {}", stages[st].peak_activations);
    stash += have ? fmt::format(" {}/{}", stages[st].peak_stash, s.stash_bound[st])
                  : fmt::format(" {}", stages[st].peak_stash);
  }
  return fmt::format("{}: ok; {} messages matched; deadlock-free under {}; peak activations/bound per stage:{}; "
                     "peak awaiting W/bound:{}", s.label(), messages, models_s.empty() ? "(no model run)" : models_s,
                     act, stash);
}

}  // namespace triax
