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

// One range of a flat buffer that the ranks of `comm` each hold a piece of: [begin, end) is
// gathered from this rank's piece [piece_begin, piece_begin + piece), staged at shard_offset.
// ZeRO-1 buckets and ZeRO-2/3 units are both described so.
struct PieceRange {
  size_t begin = 0, end = 0, piece_begin = 0, piece = 0, shard_offset = 0;
  Communicator* comm = nullptr;
};
// All-gathers every range of `flat` (a collective per range, all in flight together); staging
// (resized to shard_size elements of flat's type) holds this rank's pieces, since a collective's
// input may not alias its output.
void all_gather_pieces(Backend& be, std::span<const PieceRange> ranges, const Tensor& flat, Tensor& staging,
                       size_t shard_size);
// The flat ranges of a shard's segments, merged where they run on: the ranges whose masters stay
// current when only the compute copy is gathered (ParamStore::mark_masters_sharded).
std::vector<std::pair<size_t, size_t>> segment_ranges(std::span<const ShardSegment> segments);

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
