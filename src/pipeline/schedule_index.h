// Private to src/pipeline: where each (op, mb, chunk) sits in a schedule's lists, which message
// end matches which, and which receive each compute consumes. Shared by the checker and the
// simulator; built only for schedules that passed the checker's structural phase.
#pragma once
#include <array>
#include <utility>
#include <vector>

#include "triax/pipeline/schedule.h"

namespace triax::detail {

constexpr int kNumPipeOps = 8;

struct ScheduleIndex {
  int chunks = 1;
  // pos[stage][op][mb * chunks + chunk]: index in the stage's list of the first such instruction, -1 if none.
  std::vector<std::array<std::vector<int>, kNumPipeOps>> pos;
  // match[stage][i]: for a send or receive, {stage, index} of the other end ({-1, -1} if absent
  // or not a message); consumes[stage][i]: for a compute, the index (same stage) of the receive
  // whose data it needs, -1 if none.
  std::vector<std::vector<std::pair<int, int>>> match;
  std::vector<std::vector<int>> consumes;

  int at(int stage, PipeOp op, int mb, int chunk) const {
    return pos[static_cast<size_t>(stage)][static_cast<size_t>(op)][static_cast<size_t>(mb) * chunks + chunk];
  }
};

// Requires every instruction in range (mb < m, chunk < v, stage lists == p).
ScheduleIndex index_schedule(const Schedule& s);

}  // namespace triax::detail
