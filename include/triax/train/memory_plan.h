// The trainer's memory model at start-up: what each rank will allocate (fp32 parameters,
// gradients, AdamW moments, the activations of the micro-batches in flight, working buffers, the
// generated data's table), computed from the resolved configuration alone, before anything is
// built, so that a run that cannot fit is refused with the numbers instead of being killed.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "triax/config/train_config.h"
#include "triax/core/error.h"
#include "triax/core/memory_limit.h"

namespace triax {

// Bytes one rank needs, by kind (doubles: huge shapes must not overflow on their way to "no").
// Under context parallelism (cp > 1) activations and working buffers count seq / cp rows of every
// sequence, the working buffers include ContextParallel's K/V exchange buffers, and the ZeRO
// shard group is dp x cp (the weights' data-parallel group; the experts': expert_dp x cp).
// The ZeRO levels (docs/OPTIM.md) as the code allocates them, with d = shard_group:
//   0: weights, gradients and AdamW's two moments whole (4 + 4 + 8 bytes a parameter);
//   1: the store padded to a multiple of d; moments of the shard (padded / d), plus the shard's
//      reduce-scattered gradients and the optimizer's all-gather staging (4 bytes x shard each);
//   2: weights whole (every unit padded to a multiple of d), gradients and moments of the shard
//      (sum over units of padded unit / d), plus the larger of the unit gradient buffers alive at
//      once in backward (unit_grads) and the staging of the weights' all-gather after the update;
//   3: as 2 with the masters sharded too, plus the gathered units held at once (gathered).
// Exact for levels 0 and 1 and for the shard terms of 2 and 3; gathered and unit_grads are upper
// bounds (the largest units), exact when the largest units are the ones in flight (equal layers).
struct RankMemory {
  int stage = 0;             // pipeline stage of the rank
  int zero = 0;              // ZeRO level (0..3)
  int shard_group = 1;       // ranks the state is sharded over (dp x cp; --zero-shard-size under 2/3)
  double params = 0;         // parameter values of this rank's part of the model (unsharded, unpadded)
  double shard = 0;          // values of this rank's shard (levels 1..3; params at level 0)
  double weights = 0, grads = 0, moments = 0;
  double gathered = 0;       // ZeRO-3: max_resident largest units in the compute type + their staging pieces
  double unit_grads = 0;     // ZeRO-2/3: unit gradient buffers alive at once (open + max_reducing) + pieces
  double staging = 0;        // the shard's all-gather staging after the update: ZeRO-1 keeps it between
                             // steps, ZeRO-2 holds it while the weights are gathered (not with unit_grads)
  double activations = 0;    // kept for backward, all micro-batches in flight
  double per_micro_batch = 0;  // activations of one (micro-batch, chunk)
  int in_flight = 0;         // (micro-batch, chunk) pairs in flight at most (the schedule's bound)
  double working = 0;        // logits and one layer's backward scratch
  double data = 0;           // the synthetic data's successor table (generated data only)
  double state() const { return weights + grads + moments + gathered + std::max(unit_grads, staging); }
  double total() const { return state() + activations + working + data; }
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

// "N MiB = parameters ... + gradients ... + ..." for messages, naming the ZeRO level and its terms.
std::string describe_rank_memory(const RankMemory& m);

}  // namespace triax
