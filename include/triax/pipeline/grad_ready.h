// GradReadySink: what the pipeline executor tells the data-parallel gradient reduction while a
// step runs - which parameter's gradient is complete, and when to drive collectives in flight.
// The executor knows only this interface; optim's GradBuffer implements it (the layer above).
#pragma once
#include <cstddef>

namespace triax {

class GradReadySink {
 public:
  virtual ~GradReadySink() = default;
  // During the last micro-batch's backward (every backward when every_backward()): param_index's
  // gradient is complete for this pass.
  virtual void mark_ready(size_t param_index) = 0;
  // Called between compute instructions so nonblocking collectives progress.
  virtual void progress() = 0;
  // true: mark_ready arrives during EVERY backward pass, not only the last micro-batch's (ZeRO-2/3
  // reduce-scatter each unit's gradient per micro-batch and keep only their shard).
  virtual bool every_backward() const { return false; }
};

}  // namespace triax
