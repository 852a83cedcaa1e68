// ZeRO-1 distributed optimizer pieces: which elements this rank updates (with the per-range
// weight-decay mask, since a shard may cut through a parameter), and the all-gather that gives
// every DP rank the updated parameters. The gradient reduce-scatter is GradBuffer's.
//
// Layout: the flat buffer (padded to a multiple of dp) is split into buckets (GradBuffer), each a
// multiple of dp long; DP rank r owns piece r of every bucket. Its shard (gradients, Adam m and
// v) is those pieces concatenated in bucket order: padded / dp elements.
#pragma once
#include <span>
#include <vector>

#include "triax/params/param_store.h"
#include "triax/optim/grad_buffer.h"

namespace triax {

// A run that AdamW updates in one call: params at [flat_offset, +count) of the flat buffers,
// gradient and Adam state at [state_offset, +count) of the state buffers, all with one decay flag.
struct UpdateRange {
  size_t flat_offset = 0;
  size_t state_offset = 0;
  size_t count = 0;
  bool decay = true;
};

// Without ZeRO: every parameter (padding excluded), state_offset == flat_offset, adjacent
// parameters with the same decay flag merged.
std::vector<UpdateRange> update_ranges(const ParamStore& store);
// With ZeRO: this rank's shard segments (GradBuffer in reduce_scatter mode), merged where both
// offsets run on and the flag is the same. The ranges cover exactly the parameter elements of
// the shard; padding elements are in none.
std::vector<UpdateRange> update_ranges(const ParamStore& store, const GradBuffer& zero);
// The same over any shard's segments (ZeRO-2/3: ParamStore::shard_segments()).
std::vector<UpdateRange> update_ranges(const ParamStore& store, std::span<const ShardSegment> segments);

// After this rank has updated the parameters of its pieces: all-gathers every bucket over DP (a
// collective per bucket, all in flight together), so every rank holds every updated weight.
// What travels is what the layers read, store.weights_t(): the compute copy when the store has
// one (half the bytes of fp32 with bf16), and the masters are then current only in this rank's
// shard (ParamStore::mark_masters_sharded); else the masters themselves. staging: scratch,
// resized to the shard size. Returns seconds spent.
double zero_all_gather_params(GradBuffer& zero, Tensor& staging);
// All-gathers the fp32 masters (a DP collective: every DP rank calls it together) when they are
// stale after zero_all_gather_params moved only the compute copy, and marks them current; nothing
// when they are current (every DP rank agrees: the state follows the same calls). For readers of
// other shards' masters: the HF export and tests. Checkpoints write each rank's own shard and
// need no gather. Returns seconds spent.
double zero_all_gather_masters(GradBuffer& zero, Tensor& staging);

}  // namespace triax
