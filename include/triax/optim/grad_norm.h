// Global gradient norm over every shard of the model (replicated copies counted once, via
// ParamSpec::norm_owner), clipping by it, and the agreement of all ranks on a non-finite norm.
#pragma once
#include <span>

#include "triax/distributed/grid.h"
#include "triax/params/param_store.h"
#include "triax/optim/grad_buffer.h"

namespace triax {

// A rank's shard of reduced gradients (ZeRO-1's GradBuffer, or the ZeRO-2/3 engine's): the values,
// how they map onto parameters, and whether this copy counts in the norm (HSDP: one replica group
// counts; the others add 0, or their NaN/inf).
struct GradShard {
  Tensor grads;
  const std::vector<ShardSegment>* segments = nullptr;
  bool counts = true;
};
GradShard shard_of(const GradBuffer& zero);  // ConfigError unless it reduce-scatters
double global_grad_norm(ParamStore& store, ProcessGrid& grid, const GradShard& shard);
bool any_nonfinite_grad(ParamStore& store, ProcessGrid& grid, const GradShard& shard);

// Sum of squares (in double) of the gradients of this rank's norm_owner parameters: the full
// flat gradients, or, under ZeRO-1, only the shard segments of `zero` (a reduce_scatter
// GradBuffer after finish()). NaN/inf propagate.
double local_grad_sumsq(ParamStore& store);
double local_grad_sumsq(ParamStore& store, const GradBuffer& zero);

// L2 norm of the full gradient of the model, after the DP reduction, identical on every rank.
//  - without ZeRO (zero == nullptr): the DP replicas hold the same reduced gradients, so the sum
//    runs over the model-parallel group (tp x pp) of DP rank 0; the other replicas add 0, or
//    their own NaN/inf, so a non-finite value anywhere reaches every rank. MoE expert parameters
//    (ParamSpec::expert) are counted by the ranks of the first EP group (expert_dp rank 0), which
//    together hold every expert once.
//  - with ZeRO: every rank holds a distinct shard of the reduced gradients; the sum runs over
//    tp x pp x dp.
// Both are one all-reduce of one double on grid.world() (tp x pp x dp = world).
double global_grad_norm(ParamStore& store, ProcessGrid& grid, const GradBuffer* zero = nullptr);

// The fp16 loss scaler's overflow flag: whether any rank holds a non-finite gradient element after
// the DP reduction, the same answer on every rank. Each rank counts the non-finite elements of what
// it holds (the full flat gradients, or its ZeRO-1 shard: a NaN reduce-scattered elsewhere is in
// another rank's shard) with Backend::count_nonfinite_into, and one all-reduce (max) of one double
// on grid.world() = tp x pp x dp covers every model-parallel group and the DP group, so all ranks
// skip the step together.
bool any_nonfinite_grad(ParamStore& store, ProcessGrid& grid, const GradBuffer* zero = nullptr);

// max_norm / (norm + 1e-6) when norm > max_norm, else 1 (also when max_norm <= 0: no clipping).
double clip_coefficient(double norm, double max_norm);

// Computes the global norm and, if it is finite and above max_norm, scales the gradients in
// place (the full flat gradients, or the ZeRO shard) by the clip coefficient. Returns the norm
// before clipping. (Optimizer::step folds the coefficient into the AdamW pass instead.)
double clip_grad_norm(ParamStore& store, ProcessGrid& grid, double max_norm, GradBuffer* zero = nullptr);

}  // namespace triax
