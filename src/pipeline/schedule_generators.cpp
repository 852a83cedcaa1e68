// The four schedule generators. Each writes the compute order of every stage; insert_p2p adds the
// messages and check_schedule proves the result before it is returned.
#include <algorithm>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_check.h"

namespace triax {

namespace {

Schedule empty_schedule(ScheduleKind kind, int p, int v, int m) {
  validate_schedule_config(kind, p, v, m);
  Schedule s;
  s.kind = kind;
  s.stages = p;
  s.chunks = v;
  s.micro_batches = m;
  s.lists.resize(p);
  for (int st = 0; st < p; ++st) {
    s.activation_bound.push_back(activation_bound(kind, p, v, m, st));
    s.stash_bound.push_back(stash_bound(kind, p, v, m, st));
  }
  return s;
}

Schedule finish(Schedule s) {
  insert_p2p(s);
  check_schedule(s);
  return s;
}

PipeInstr compute(PipeOp op, int mb, int chunk) { return {op, mb, chunk, -1}; }

}  // namespace

// GPipe: every forward, then every backward. With v chunks the forwards go chunk by chunk (all
// micro-batches of chunk 0, then chunk 1, ...) and the backwards in the reverse chunk order, so
// each chunk's pass streams m micro-batches through the p stages as one GPipe would.
Schedule make_gpipe(int p, int m, int v) {
  Schedule s = empty_schedule(ScheduleKind::gpipe, p, v, m);
  for (int st = 0; st < p; ++st) {
    auto& l = s.lists[st];
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) l.push_back(compute(PipeOp::forward, mb, c));
    for (int c = v - 1; c >= 0; --c)
      for (int mb = 0; mb < m; ++mb) l.push_back(compute(PipeOp::backward, mb, c));
  }
  return finish(std::move(s));
}

// 1F1B (PipeDream-flush, Megatron's non-interleaved schedule): stage s runs p-s-1 warm-up
// forwards, then alternates one forward and one backward, then drains the remaining backwards.
// At most p-s micro-batches are stored at once.
Schedule make_1f1b(int p, int m) {
  Schedule s = empty_schedule(ScheduleKind::one_f_one_b, p, 1, m);
  for (int st = 0; st < p; ++st) {
    auto& l = s.lists[st];
    const int warm = std::min(p - st - 1, m);
    int f = 0, b = 0;
    for (; f < warm; ++f) l.push_back(compute(PipeOp::forward, f, 0));
    for (; f < m; ++f, ++b) {
      l.push_back(compute(PipeOp::forward, f, 0));
      l.push_back(compute(PipeOp::backward, b, 0));
    }
    for (; b < m; ++b) l.push_back(compute(PipeOp::backward, b, 0));
  }
  return finish(std::move(s));
}

// Interleaved 1F1B (Narayanan et al. 2021, Megatron's interleaved schedule). Stage s holds
// chunks c = 0..v-1 (virtual stage c*p + s). The k-th forward of a stage is micro-batch
// (k / (p*v))*p + k % p of chunk (k / p) % v: groups of p micro-batches go through chunk 0, then
// the same group through chunk 1, ...; the k-th backward takes the same micro-batch through chunk
// v-1 - (k / p) % v. Warm-up: 2(p-s-1) + (v-1)p forwards (all m*v when fewer), then one forward
// and one backward alternately, then the remaining backwards.
Schedule make_interleaved_1f1b(int p, int v, int m) {
  Schedule s = empty_schedule(ScheduleKind::interleaved, p, v, m);
  const int total = m * v;
  const auto mb_of = [p, v](int k) { return (k / (p * v)) * p + k % p; };
  const auto fwd_chunk = [p, v](int k) { return (k / p) % v; };
  const auto bwd_chunk = [p, v](int k) { return v - 1 - (k / p) % v; };
  for (int st = 0; st < p; ++st) {
    auto& l = s.lists[st];
    const int warm = std::min(2 * (p - st - 1) + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warm; ++f) l.push_back(compute(PipeOp::forward, mb_of(f), fwd_chunk(f)));
    for (; f < total; ++f, ++b) {
      l.push_back(compute(PipeOp::forward, mb_of(f), fwd_chunk(f)));
      l.push_back(compute(PipeOp::backward, mb_of(b), bwd_chunk(b)));
    }
    for (; b < total; ++b) l.push_back(compute(PipeOp::backward, mb_of(b), bwd_chunk(b)));
  }
  return finish(std::move(s));
}

// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2.1): 1F1B with the
// backward split into B (input gradient, on the critical path) and W (weight gradient). Stage s
// keeps up to s weight passes pending: after each B it runs the oldest W only once more than s
// are pending, so B reaches the previous stage sooner and the s deferred W fill the cool-down.
// Every stage then stores at most p micro-batches (F done, W not done), stage 0's 1F1B peak.
Schedule make_zb_h1(int p, int m) {
  Schedule s = empty_schedule(ScheduleKind::zb_h1, p, 1, m);
  for (int st = 0; st < p; ++st) {
    auto& l = s.lists[st];
    const int warm = std::min(p - st - 1, m);
    int f = 0, b = 0, w = 0;
    const auto backward_then_maybe_w = [&] {
      l.push_back(compute(PipeOp::backward_input, b++, 0));
      if (b - w > st) l.push_back(compute(PipeOp::backward_weight, w++, 0));
    };
    for (; f < warm; ++f) l.push_back(compute(PipeOp::forward, f, 0));
    for (; f < m; ++f) {
      l.push_back(compute(PipeOp::forward, f, 0));
      backward_then_maybe_w();
    }
    while (b < m) backward_then_maybe_w();
    while (w < m) l.push_back(compute(PipeOp::backward_weight, w++, 0));
  }
  return finish(std::move(s));
}

Schedule make_schedule(ScheduleKind kind, int p, int v, int m) {
  switch (kind) {
    case ScheduleKind::gpipe: return make_gpipe(p, m, v);
    case ScheduleKind::one_f_one_b:
      validate_schedule_config(kind, p, v, m);
      return make_1f1b(p, m);
    case ScheduleKind::interleaved: return make_interleaved_1f1b(p, v, m);
    case ScheduleKind::zb_h1:
      validate_schedule_config(kind, p, v, m);
      return make_zb_h1(p, m);
  }
  TRIAX_THROW(ConfigError, "unknown schedule kind {}", static_cast<int>(kind));
}

}  // namespace triax
