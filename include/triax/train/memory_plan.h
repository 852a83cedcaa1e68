// The trainer's memory model at start-up: what each rank will allocate (fp32 parameters,
// gradients, AdamW moments, the activations of the micro-batches in flight, working buffers, the
// generated data's table), computed from the resolved configuration alone, before anything is
// built, so that a run that cannot fit is refused with the numbers instead of being killed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "triax/config/train_config.h"
#include "triax/core/error.h"
#include "triax/core/memory_limit.h"

namespace triax {

// Bytes one rank needs, by kind (doubles: huge shapes must not overflow on their way to "no").
struct RankMemory {
  int stage = 0;             // pipeline stage of the rank
  double params = 0;         // parameter values this rank holds (fp32 each)
  double weights = 0, grads = 0, moments = 0;
  double activations = 0;    // kept for backward, all micro-batches in flight
  double per_micro_batch = 0;  // activations of one (micro-batch, chunk)
  int in_flight = 0;         // (micro-batch, chunk) pairs in flight at most (the schedule's bound)
  double working = 0;        // logits and one layer's backward scratch
  double data = 0;           // the synthetic data's successor table (generated data only)
  double total() const { return weights + grads + moments + activations + working + data; }
};

// The prediction for a rank of pipeline stage `stage`.
RankMemory predict_rank_memory(const ResolvedTrainConfig& r, int stage);

// The start-up refusal: an OutOfMemoryError (exit 5) raised before anything was allocated, which
// already carries the whole prediction (the trainer passes it on unchanged).
class MemoryRefused : public OutOfMemoryError {
 public:
  using OutOfMemoryError::OutOfMemoryError;
};

// Refuses (MemoryRefused, exit 5) when the ranks of one host, given by their pipeline stages,
// together need more than `limit`: the message gives the prediction by kind, the limit and where
// it comes from, and the flag to change. Nothing when the limit is unknown.
void refuse_if_over_memory(const ResolvedTrainConfig& r, const std::vector<int>& stages_on_host,
                           const MemoryLimit& limit, const std::string& host);

// "this rank needs about N MiB = parameters ... + gradients ... + ..." for messages.
std::string describe_rank_memory(const RankMemory& m, bool zero1);

}  // namespace triax
