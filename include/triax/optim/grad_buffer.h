// GradBuffer: data-parallel gradient synchronisation over a ParamStore's flat gradient buffer,
// split into buckets that start their collective (all-reduce, or reduce-scatter for ZeRO-1) on
// the DP group as soon as backward has written all of their gradients, overlapping the rest.
//
// Conventions (docs/OPTIM.md):
//  - The model returns the mean loss of one micro-batch; the executor scales each backward by
//    1 / num_micro_batches, so a rank's accumulated grads are those of its mean loss. The DP
//    collective AVERAGES (ReduceOp::avg), giving the gradient of the global-batch mean loss.
//  - Buckets follow reverse parameter order (bucket 0 holds the last parameters, which backward
//    finishes first) and start in bucket order on every rank, whatever order params are marked in.
//  - A tied embedding (first and last pipeline stage both hold wte) gets a bucket of its own that
//    starts last: its gradient is first summed over the embedding group, then DP-reduced.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/params/param_store.h"
#include "triax/pipeline/grad_ready.h"

namespace triax {

enum class GradSync {
  all_reduce,     // every DP rank ends with the full reduced gradient (plain DP)
  reduce_scatter  // every DP rank ends with its shard of the reduced gradient (ZeRO-1)
};

struct GradBufferOptions {
  // Target bucket size; a bucket closes at the first parameter boundary past it, so a parameter
  // larger than this gets a bucket alone. 0 = one bucket (plus the tied one).
  size_t bucket_bytes = size_t{16} << 20;
  // false: nothing starts before finish() (the no-overlap baseline; mark_ready only records).
  bool overlap = true;
  GradSync sync = GradSync::all_reduce;
  // avg (default; see the loss convention above) or sum (the caller pre-scales by 1/dp).
  ReduceOp op = ReduceOp::avg;
  // Tied embedding: this parameter's gradient is all-reduced (sum) over `embedding` before its
  // DP collective. Ignored when embedding is null or has one rank (pp == 1: one copy only).
  std::optional<size_t> tied_param;
  Communicator* embedding = nullptr;
  // MoE experts (ParamSpec::expert): each rank of an expert-parallel group holds different
  // experts, so their gradients are reduced over the expert-data-parallel group (dp / ep ranks
  // holding the same experts; grid.expert_dp()) in buckets of their own. Under avg they are
  // pre-scaled by expert_dp / dp first, so the result is sum over expert_dp / dp: the gradient of
  // the global-batch mean loss, since an expert's local gradient already sums its EP group's
  // tokens. Required when the store holds experts and dp > 1; when it has dp ranks (ep = 1) experts
  // are reduced like every other parameter. Not supported with reduce_scatter (ZeRO-1) when ep > 1.
  Communicator* expert_dp = nullptr;
};

// One bucket: the flat element range [begin, end) of the gradient buffer. Under
// reduce_scatter its length is a multiple of dp, and DP rank r owns the piece
// [begin + r*len/dp, begin + (r+1)*len/dp), stored at shard_offset in the shard buffer.
struct GradBucket {
  size_t begin = 0, end = 0;
  size_t shard_offset = 0;
  std::vector<size_t> params;  // parameters overlapping [begin, end), ascending
  bool tied = false;           // the tied-embedding bucket (launched last)
  bool expert = false;         // holds MoE expert parameters only (reduced over expert_dp)
  size_t size() const { return end - begin; }
};


// Splits the flat range [0, padded) into buckets, in launch order. align: every interior
// boundary is a multiple of it (dp for reduce_scatter, 1 for all_reduce, where boundaries fall on
// parameter starts). A tied parameter gets one bucket (its range widened to align) placed last.
// split_experts: a boundary also goes wherever ParamSpec::expert changes, so no bucket mixes
// experts with other parameters, and GradBucket::expert marks the expert buckets (align must be 1).
// Throws ConfigError if padded is not a multiple of align or smaller than the parameters.
std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamInfo>& params, size_t padded, size_t align,
                                          size_t target_elems, std::optional<size_t> tied_param = std::nullopt,
                                          bool split_experts = false);
// Sets shard_offset of every bucket (pieces concatenated in bucket order) and returns the
// segments of DP rank `rank` of `dp`. Requires every bucket size to be a multiple of dp.
std::vector<ShardSegment> plan_shard_segments(std::vector<GradBucket>& buckets, const std::vector<ParamInfo>& params,
                                              int dp, int rank);

// Timing of one step's gradient synchronisation (seconds, steady clock).
struct GradSyncStats {
  // Time spent inside finish(): communication the caller had to wait for (not overlapped).
  double exposed_s = 0;
  // From the first collective's start to the last one's observed completion.
  double comm_span_s = 0;
  // Sum over buckets of start -> observed completion (completion is observed by progress() or
  // finish(), so this is an upper bound of each collective's duration).
  double bucket_sum_s = 0;
  // Time inside progress() calls (the caller's cost of driving MPI during compute).
  double progress_s = 0;
  size_t buckets = 0;
  size_t started_early = 0;  // buckets started before finish() (0 without overlap)
  size_t bytes = 0;          // gradient bytes sent into DP collectives by this rank
};

struct BucketTiming {
  double start_s = -1;  // since the step's first mark_ready (or finish), -1 if not started
  double done_s = -1;
  bool started_in_finish = false;
};

class GradBuffer final : public GradReadySink {
 public:
  // The store must be finalized; for reduce_scatter its padded size must be a multiple of
  // dp.size() (ParamStore::finalize(dp)). Store and communicators must outlive the buffer.
  GradBuffer(ParamStore& store, Communicator& dp, GradBufferOptions opts = {});
  ~GradBuffer() override;
  GradBuffer(const GradBuffer&) = delete;
  GradBuffer& operator=(const GradBuffer&) = delete;

  // During the LAST micro-batch's backward: param_index's gradient is complete. Starts every
  // bucket that became complete (in bucket order). Marking twice in one step, or an index out
  // of range, throws ConfigError.
  void mark_ready(size_t param_index) override;
  // Drives in-flight collectives (Work::test) and starts buckets whose dependencies finished.
  // Call between compute ops: MPI progresses nonblocking collectives only inside MPI calls.
  void progress() override;
  // Backward is over: treats unmarked params as ready, starts what is left, waits for all,
  // resets for the next step and returns the step's timings. Under reduce_scatter the result is
  // in shard_grads(); flat_grads then still hold this rank's own (unreduced) gradients.
  GradSyncStats finish();

  size_t num_buckets() const { return buckets_.size(); }
  const GradBucket& bucket(size_t i) const { return buckets_.at(i); }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  bool started(size_t bucket) const { return state_.at(bucket).started; }
  // True once the bucket's collective has been observed complete (by progress() or finish()).
  bool done(size_t bucket) const { return state_.at(bucket).done; }
  const std::vector<BucketTiming>& timings() const { return timings_; }
  // Non-finite elements of this rank's own gradients (before an in-place all-reduce over several
  // ranks spreads them) counted as each such bucket starts, on the backend (no read-back during
  // the step; one pass over the gradients, ~17 GB/s on the CPU). The count of the last step, read
  // back on demand: NaN attribution after a skipped step names the ranks where a non-finite value
  // appeared, not every DP copy the all-reduce passed it to. 0 under reduce_scatter and dp 1.
  double presync_nonfinite() const;
  // Called with the bucket index right after its collective starts (tracing, tests).
  void set_start_hook(std::function<void(size_t)> hook) { hook_ = std::move(hook); }

  const GradBufferOptions& options() const { return opts_; }
  ParamStore& store() { return store_; }
  Communicator& dp() { return dp_; }
  // The group bucket b is reduced over: expert_dp for expert buckets when ep > 1, else dp.
  Communicator& comm_of(size_t b) { return buckets_.at(b).expert && experts_split_ ? *opts_.expert_dp : dp_; }

  // reduce_scatter only: this rank's shard of the reduced gradients (shard_size() elements)
  // and how it maps onto parameters.
  const Tensor& shard_grads_t() const { return shard_grads_; }
  // Host view of it (host-accessible backends only: tests and tools).
  std::span<float> shard_grads();
  std::span<const float> shard_grads() const;
  const std::vector<ShardSegment>& shard_segments() const { return segments_; }
  size_t shard_size() const { return shard_grads_.defined() ? static_cast<size_t>(shard_grads_.numel()) : 0; }
  // This rank's piece of bucket b (flat range) for reduce_scatter.
  size_t piece_begin(size_t b) const;
  size_t piece_size(size_t b) const;

 private:
  struct State {
    size_t pending = 0;  // params not yet marked
    bool started = false, done = false;
    bool tied_started = false, tied_done = false;
    Work work, tied_work;
  };
  double now_s() const;
  void try_start(bool in_finish);
  void start_bucket(size_t b, bool in_finish);
  void start_tied(size_t b);
  void poll();
  void trace_buckets(double exposed_s) const;
  void reset();
  void open_step();

  ParamStore& store_;
  Communicator& dp_;
  GradBufferOptions opts_;
  bool tied_active_ = false;
  bool experts_split_ = false;  // expert buckets reduce over expert_dp (ep > 1)
  std::vector<GradBucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_param_;
  std::vector<ShardSegment> segments_;
  Tensor shard_grads_;  // (padded / dp) on the store's backend, reduce_scatter only
  Tensor presync_bad_;  // (1) f64: non-finite count of this rank's gradients before the sync
  std::vector<State> state_;
  std::vector<BucketTiming> timings_;
  std::vector<char> marked_;
  size_t next_start_ = 0;  // buckets start in index order
  bool step_open_ = false;
  std::chrono::steady_clock::time_point t0_;
  double progress_s_ = 0;
  std::function<void(size_t)> hook_;
};

// Sums the tied embedding's gradient (param_index) over the embedding group (first and last
// pipeline stage of one pipeline, same tp and dp coordinates), blocking. No-op when embedding is
// null or has one rank. For callers that do not use GradBuffer's tied_param: call it after
// GradBuffer::finish() under all_reduce (summing over the embedding group and averaging over DP
// commute), but BEFORE the DP collective under reduce_scatter (a shard cannot be summed across
// stages whose buffers are laid out differently) - GradBuffer's tied_param does that for you.
void all_reduce_tied_embedding(ParamStore& store, size_t param_index, Communicator* embedding);

}  // namespace triax
