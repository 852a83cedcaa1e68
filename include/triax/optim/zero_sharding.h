// ZeRO-2 and ZeRO-3 (FSDP-style): the engine behind a sharded ParamStore (finalize_sharded).
//
// Units (ParamStore::units: a transformer layer, the embedding, the head, a layer's experts) are
// what moves. Each DP rank of the shard group owns piece `rank` of every unit (its shard: fp32
// gradients, Adam m and v and, under ZeRO-3, the fp32 masters).
//  - Gradients (2 and 3): a unit's gradient buffer is allocated when backward first touches the
//    unit, accumulates that pass, and is reduce-scattered (avg) into this rank's shard as soon as
//    every parameter of the unit has been marked ready (the executor marks on every backward:
//    every_backward()); a later write to the unit opens a fresh buffer. So gradients are reduced
//    once per micro-batch and unit, overlapped with the backward of the units below, and a rank
//    holds its shard plus the unit buffers in flight (at most max_reducing + 1). The tied embedding
//    of a pipeline (pp > 1) keeps its buffer through the step and is summed over the embedding
//    group in finish(), then reduce-scattered.
//  - Weights (3): weights(b, e) returns the unit gathered (all-gather of the pieces, cast to the
//    compute type), waiting for it when it is in flight; touching unit u prefetches its neighbour
//    in the direction of travel (u + 1 in forward, u - 1 in backward). At most max_resident units
//    are held; the least recently used is dropped (views keep a dropped buffer alive while held).
//  - HSDP (`--zero-shard-size N`): shards live in groups of N DP ranks; each reduced piece is then
//    all-reduced (avg) over the dp / N replica groups, in unit order.
// Collectives are issued at points every DP rank reaches in the same order (weights(), mark_ready,
// finish), never from progress(), which only tests what is in flight (docs/OPTIM.md).
#pragma once
#include <chrono>
#include <cstddef>
#include <deque>
#include <optional>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/optim/grad_buffer.h"
#include "triax/optim/zero.h"
#include "triax/params/param_store.h"
#include "triax/pipeline/grad_ready.h"

namespace triax {

struct ZeroShardingOptions {
  bool overlap = true;          // false: no reduce-scatter before finish(), no prefetch (the baseline)
  bool prefetch = true;         // ZeRO-3: gather the next unit while this one computes
  size_t max_resident = 2;      // ZeRO-3: gathered units held at once (the current one and the prefetched one)
  size_t max_reducing = 2;      // unit reduce-scatters in flight; the next one waits for the oldest
  std::optional<size_t> tied_param;  // tied embedding (pp > 1): summed over `embedding` in finish()
  Communicator* embedding = nullptr;
  Communicator* replicate = nullptr;     // HSDP: the same shard's ranks in the other groups (null: none)
  Communicator* expert_shard = nullptr;  // experts' shard group (expert-DP); required when the store holds experts
  // Expert gradients are pre-scaled so avg over expert-DP gives the global-batch mean (grad_buffer.h).
  double expert_scale = 1.0;
};

// One step's ZeRO-3 parameter traffic (seconds, steady clock).
struct GatherStats {
  double exposed_s = 0;  // compute waited for a gather (blocking gathers and waits on prefetches)
  double total_s = 0;    // sum over gathers of issue -> observed completion
  size_t gathers = 0, prefetched = 0;
  size_t bytes = 0;      // received by this rank
  size_t peak_resident = 0;
};

class ZeroSharding final : public GradReadySink, public ParamProvider {
 public:
  // store: finalize_sharded'd with group = shard.size(), rank = shard.rank(). Installs itself as the
  // store's provider (and removes itself on destruction). Everything must outlive it.
  ZeroSharding(ParamStore& store, Communicator& shard, ZeroShardingOptions opts = {});
  ~ZeroSharding() override;
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;

  // GradReadySink
  void mark_ready(size_t param_index) override;
  void progress() override;
  bool every_backward() const override { return true; }
  // ParamProvider
  Tensor weights(size_t begin, size_t end) override;
  Tensor grads(size_t begin, size_t end) override;
  void zero_grads() override;
  void weights_changed() override;

  // Backward is over: reduces what is left (the tied unit, units never marked), waits for all,
  // and returns the step's reduce-scatter timings; shard_grads_t() then holds this rank's piece of
  // the global-batch mean gradient. The gather statistics of the step are in gather_stats().
  GradSyncStats finish();
  GatherStats take_gather_stats();

  // ZeRO-2, after AdamW updated this rank's pieces: all-gathers every unit's weights (the compute
  // copy when there is one, marking the masters sharded, else the masters). Returns seconds.
  double gather_weights();
  // ZeRO-2 with a compute copy: all-gathers the masters too (before the HF export). Returns seconds.
  double gather_masters();
  // A whole master of parameter i, in f32 on the host (collective over the shard group: every rank
  // of it calls it for the same i): the HF export and the tests under ZeRO-3.
  std::vector<float> full_master(size_t i);

  const Tensor& shard_grads_t() const { return shard_grads_; }
  const std::vector<ShardSegment>& shard_segments() const { return store_.shard_segments(); }
  size_t shard_size() const { return store_.shard_size(); }
  // Whether this rank's shard counts in the gradient norm: one replica group does (HSDP).
  bool counts_in_norm() const { return !opts_.replicate || opts_.replicate->rank() == 0; }
  ParamStore& store() { return store_; }
  Communicator& shard_comm() { return shard_; }
  const ZeroShardingOptions& options() const { return opts_; }

 private:
  struct Resident {
    size_t unit = 0;
    Tensor buf;            // the unit's weights (unit size, compute type)
    Tensor staging;        // this rank's piece on its way in (the gather may not alias its output)
    Work work;
    bool in_flight = false;
    double issued_s = 0;
    uint64_t used = 0;     // last touch (LRU)
  };
  struct Reducing {
    size_t unit = 0;
    Tensor grads;          // the unit's gradient buffer (unit size)
    Tensor piece;          // this rank's reduced piece
    Work work;
    int stage = 0;         // 0: reduce-scatter in flight, 1: the replica all-reduce in flight
    double issued_s = 0;
  };
  Communicator& comm_of(size_t unit);
  std::vector<PieceRange> unit_ranges();
  double now_s() const;
  Resident* find_resident(size_t unit);
  Resident& gather(size_t unit, bool prefetch);
  void wait_resident(Resident& r);
  void gather_done(Resident& r);
  void evict_for_one_more();
  void start_reduce(size_t unit);
  void advance(Reducing& r, bool block);
  void drain(size_t keep);
  void open_step();

  ParamStore& store_;
  Communicator& shard_;
  ZeroShardingOptions opts_;
  std::optional<size_t> tied_unit_;
  Tensor shard_grads_;
  std::vector<Tensor> open_grads_;           // per unit: the gradient buffer of the current pass
  std::vector<std::vector<char>> marked_;    // per unit: parameters marked since it opened
  std::vector<size_t> marked_count_;
  std::deque<Reducing> reducing_;
  std::vector<Resident> resident_;
  uint64_t clock_ = 0;
  std::optional<size_t> last_unit_;
  GradSyncStats sync_;
  GatherStats gstats_;
  bool step_open_ = false;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace triax
