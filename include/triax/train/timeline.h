// --profile-steps A:B --profile-dir DIR: the trainer's timeline (docs/OBSERVE.md, "Timeline").
// Every rank records iterations A..B with the core recorder (triax/core/trace.h) and writes
// DIR/trace_rank{R}.json; rank 0 then merges them into DIR/trace.json, one track per rank named
// "rank R (tp t, pp p, dp d)", with the measured and simulated pipeline bubble of each recorded
// step in "otherData". Time axis: the steady clock from rank 0's origin (taken after a world
// barrier at the start of iteration A) on the ranks of rank 0's host, which share that clock;
// ranks on other hosts take their own origin right after the barrier (off by its exit skew).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "triax/distributed/grid.h"
#include "triax/pipeline/schedule.h"

namespace triax {

// One recorded step's bubble (idle / compute, summed over the stages of the pipeline tp 0 dp 0):
// a stage's idle time is its window from its first compute start to its last compute end minus
// the compute inside it. measured: from the trace; simulated: simulate_schedule of the same
// schedule with each (stage, chunk, op)'s mean measured duration of that step and no latency;
// theory: the simulator with uniform costs (F 1, full backward 2, B 1, W 1; for GPipe and 1F1B
// this window bubble is (p-1)/(2m), half the makespan-based (p-1)/m, as stage s starts s forward
// steps late and ends s backward steps early).
struct StepBubble {
  int64_t step = 0;
  double measured = 0, simulated = 0, theory = 0;
};

// One compute span of stage `stage` (ts, dur in microseconds), as read back from a trace.
struct ComputeSpan {
  int stage = 0, mb = 0, chunk = 0;
  PipeOp op = PipeOp::forward;
  double ts = 0, dur = 0;
};

// Idle / compute over the stages, each stage over its own window (see StepBubble).
double window_bubble(const std::vector<ComputeSpan>& spans, int stages);
// The step's bubble: measured from spans, simulated with their mean costs on `schedule`.
StepBubble step_bubble(const Schedule& schedule, const std::vector<ComputeSpan>& spans, int64_t step);

class Timeline {
 public:
  // steps "A:B" ("" off) and dir as in TrainConfig.
  Timeline(const std::string& steps, std::string dir);
  bool enabled() const { return first_ > 0; }
  // Before iteration `it` (1-based) runs: at A, a world barrier and the recorder starts.
  void before_step(int64_t it, ProcessGrid& grid);
  // After iteration `it`: at B (or at the run's last iteration when B lies beyond it: last),
  // each rank writes its file; rank 0 merges after a world barrier and logs where the trace is.
  void after_step(int64_t it, bool last, ProcessGrid& grid, const Schedule& schedule);

 private:
  int64_t first_ = 0, last_ = 0;
  std::string dir_;
  bool done_ = false;
  double step_t0_ = -1;  // the recorded iteration's start on the timeline (-1: none open)
};

}  // namespace triax
