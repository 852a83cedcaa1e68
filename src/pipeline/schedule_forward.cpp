// The forward-only schedule of evaluation: the same instruction lists, P2P insertion and checks
// as training, so the training executor runs validation with no code path of its own.
#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_check.h"

namespace triax {

Schedule make_forward_only(int p, int v, int m) {
  require(p >= 1 && v >= 1 && m >= 1, "forward-only schedule: p={} v={} m={} must all be >= 1", p, v, m);
  require(v == 1 || p >= 2, "forward-only schedule with v={} chunks needs p >= 2 stages, got p={}", v, p);
  Schedule s;
  s.kind = ScheduleKind::gpipe;
  s.forward_only = true;
  s.stages = p;
  s.chunks = v;
  s.micro_batches = m;
  s.lists.resize(static_cast<size_t>(p));
  for (int st = 0; st < p; ++st) {
    // Forwards keep nothing (the executor drops each slot), but the bound counts every one as
    // GPipe would: m * v, what is measured without backward passes.
    s.activation_bound.push_back(m * v);
    s.stash_bound.push_back(m * v);
    for (int c = 0; c < v; ++c)
      for (int mb = 0; mb < m; ++mb) s.lists[static_cast<size_t>(st)].push_back({PipeOp::forward, mb, c, -1});
  }
  insert_p2p(s);
  check_schedule(s);
  return s;
}

}  // namespace triax
