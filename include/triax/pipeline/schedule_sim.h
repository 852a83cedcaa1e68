// The schedule simulator: given per-instruction costs, the time line of every stage (start and
// end of each compute instruction, waiting on messages from other stages), the makespan and the
// bubble, to compare a schedule with its closed form before (or after) running it for real.
#pragma once
#include <functional>
#include <vector>

#include "triax/pipeline/schedule.h"

namespace triax {

// Cost of one instruction, i.e. of one (mb, chunk): with v chunks per stage pass per-chunk costs.
struct SimCosts {
  double forward = 1.0;
  double backward = 2.0;         // full backward (input + weight gradient)
  double backward_input = 1.0;   // B
  double backward_weight = 1.0;  // W
  double comm = 0.0;             // latency of one message: it arrives comm after its send is issued
  double cost(PipeOp op) const;  // 0 for P2P instructions
};

// Idle time per stage. Two definitions of "bubble fraction", both reported:
//   ratio       = idle / busy      (relative to the ideal compute time; GPipe/1F1B: (p-1)/m)
//   of_makespan = idle / makespan  (share of the step; GPipe/1F1B: (p-1)/(m+p-1))
struct BubbleStats {
  double makespan = 0;       // earliest start to latest end, over all stages
  std::vector<double> busy;  // per stage: time spent in compute
  std::vector<double> idle;  // per stage: makespan - busy
  double ratio(int stage) const;
  double of_makespan(int stage) const;
  double ratio() const;        // sum idle / sum busy
  double of_makespan() const;  // sum idle / (stages * makespan)
};

struct TimedInstr {
  int index = 0;  // position in the stage's list
  PipeInstr instr;
  double start = 0;
  double end = 0;
};

struct SimResult {
  std::vector<std::vector<TimedInstr>> timeline;  // per stage: compute instructions, list order
  BubbleStats bubble;
};

// Timing model: each stage walks its list; a compute starts when the previous compute of the
// stage has ended and, if it consumes a message, when that message has arrived (send issue time
// + comm). Sends are issued when the walk reaches them (right after their producer) and never
// delay the stage; receive posts cost nothing. The schedule is checked first (eager model), so a
// broken schedule throws the checker's ConfigError.
SimResult simulate_schedule(const Schedule& s, const SimCosts& costs = {});
// Same with any cost per (stage, instruction), e.g. a heavier last stage (the LM head and loss).
using ComputeCostFn = std::function<double(int stage, const PipeInstr& in)>;
SimResult simulate_schedule(const Schedule& s, const ComputeCostFn& cost, double comm);

// The closed-form bubble ratio (idle / ideal compute, zero comm) that simulate_schedule matches
// exactly for uniform costs: GPipe and 1F1B (p-1)/m; interleaved and GPipe with v chunks
// (p-1)/(v*m) (GPipe with v > 1 only when m >= p); ZB-H1 (p-1)(F+B-W) / (m(F+B+W)) when
// W <= F, W <= B and m >= p (Qi et al. 2023). Throws ConfigError outside those conditions.
double theoretical_bubble(ScheduleKind kind, int p, int v, int m, const SimCosts& costs = {});

}  // namespace triax
