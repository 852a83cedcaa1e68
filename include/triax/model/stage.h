// Stage: what the pipeline executor runs - one model chunk of a pipeline stage, seen through the
// calls a schedule's instructions make (forward F, backward B or its input half, weight pass W),
// on buffers of the chunk's Backend. GptChunk implements it; the executor knows nothing else.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "triax/backend/backend.h"

namespace triax {

class Stage {
 public:
  virtual ~Stage() = default;
  virtual Backend& backend() = 0;
  // Rows (tokens) of the hidden states this stage takes and returns for a B x T micro-batch, and
  // their width: the P2P messages are (io_rows, hidden).
  virtual int io_rows(int B, int T) const = 0;
  virtual int hidden() const = 0;
  // tokens/targets are host data (only the first / last virtual stage reads them); x_in, x_out
  // are backend buffers (undefined where the stage has no such side). Returns the micro-batch's
  // mean loss on the last stage.
  virtual double forward(int slot, int B, int T, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                        const Tensor& x_in, const Tensor& x_out, bool training, float dloss) = 0;
  virtual void backward(int slot, const Tensor& dx_out, const Tensor& dx_in, bool defer_weight_grads) = 0;
  virtual void backward_weight(int slot) = 0;
  virtual void release(int slot) = 0;
  // Called with a store parameter index once its gradient is final for this step's backward.
  virtual void set_grad_ready_hook(std::function<void(size_t)> hook) = 0;
};

}  // namespace triax
