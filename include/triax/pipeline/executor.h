// PipelineExecutor: walks one stage's instruction list of a Schedule for one training step —
// forward/backward of this stage's model chunks (Stage, on their Backend's buffers), asynchronous P2P of activations and
// gradients with the neighbour stages, and gradient-ready marks for overlapped DP reduction.
// It follows the contract of docs/SCHEDULES.md: sends never wait, a compute waits only for the
// receive it consumes, everything outstanding completes by the end of the list.
#pragma once
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/model/stage.h"
#include "triax/pipeline/grad_ready.h"
#include "triax/pipeline/schedule.h"

namespace triax {

// Where a micro-batch's tokens come from: fills tokens (B, T) and next-token targets (B, T) of
// micro-batch mb of this step (for this DP rank).
using MicroBatchFn = std::function<void(int mb, std::vector<int32_t>& tokens, std::vector<int32_t>& targets)>;

// One compute instruction, for timelines and bubble measurement (seconds from the step's start).
// start is taken after the instruction's receive completed, so [start, end) is busy time only
// (the consumed micro-batch's data fetch included); wait is how long the receive blocked before.
// cpu: CPU time of the calling thread during [start, end): below end - start when the rank lost
// its core to other processes (an oversubscribed or shared machine), which stretches the interval.
struct ExecEvent {
  PipeInstr instr;
  double start = 0, end = 0;
  double wait = 0;
  double cpu = 0;
};

struct StepResult {
  size_t peak_send_buffers = 0;  // most send buffers held at once (released as each send completes)
  double loss_sum = 0;      // sum of micro-batch mean losses (last stage; 0 elsewhere)
  int micro_batches = 0;
  double compute_s = 0;     // inside forward/backward/W
  double p2p_wait_s = 0;    // blocked on receives (and on sends at the end)
  double wall_s = 0;
  // The step's start on std::chrono::steady_clock (seconds since its epoch): events are relative
  // to it. One host's ranks share that clock, so origin + start puts every rank on one time axis.
  double origin_s = 0;
  std::vector<ExecEvent> events;  // compute instructions in execution order (record_events)
};

class PipelineExecutor {
 public:
  // chunks[c] is this stage's chunk c (virtual stage c*p + s). pp: the pipeline communicator
  // (ranks are stages). grads: optional; gets mark_ready during the last backward of each chunk
  // and progress() between instructions.
  // Every chunk computes on the same Backend; messages are (io_rows, hidden) buffers of it.
  PipelineExecutor(std::vector<Stage*> chunks, Communicator& pp, int micro_batch, int seq, int hidden);

  // Runs this stage's list of `schedule` for one step. dloss scales each micro-batch's loss
  // gradient (1/m for a mean over micro-batches).
  StepResult run(const Schedule& schedule, const MicroBatchFn& data, GradReadySink* grads, float dloss,
                 bool record_events = false);
  // The instruction running now, "instruction 5 of 16: backward mb 2 chunk 0", or "" outside run();
  // safe from any thread (the watchdog's dumps).
  std::string position() const;

 private:
  std::atomic<uint64_t> pos_{~uint64_t{0}};  // index 24 bits | op 8 | mb 20 | chunk 12; all ones: idle
  std::atomic<uint64_t> count_{0};
  std::vector<Stage*> chunks_;
  Communicator& pp_;
  int B_, T_, C_;
  int64_t pad_us_ = 0;  // TRIAX_PIPELINE_PAD_US (docs/ENVIRONMENT.md): test padding of every compute
};

}  // namespace triax
