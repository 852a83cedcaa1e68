// Optimizer: one training step's update for one pipeline stage, put together from the pieces:
// finish the DP gradient sync (GradBuffer), global gradient norm, skip on a non-finite norm,
// clip, fused AdamW (over the whole store, or this rank's ZeRO-1 shard), ZeRO-1 all-gather.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "triax/distributed/grid.h"
#include "triax/params/param_store.h"
#include "triax/ops/adamw.h"
#include "triax/optim/grad_buffer.h"
#include "triax/optim/loss_scaler.h"
#include "triax/optim/zero.h"
#include "triax/optim/zero_sharding.h"
#include <memory>

namespace triax {

struct OptimizerConfig {
  AdamWConfig adamw;
  double max_grad_norm = 1.0;  // clip the global norm to this; <= 0 disables clipping
  // ZeRO level (docs/OPTIM.md): 0 plain DP; 1 Adam state sharded (GradBuffer reduce-scatters,
  // parameters all-gathered after the step); 2 gradients sharded too; 3 parameters too (ZeroSharding:
  // the store must be finalize_sharded'd at this level over the shard group).
  int zero = 0;
  // HSDP (levels 2 and 3): shard inside groups of this many consecutive DP ranks and all-reduce
  // across the groups; 0 or dp: one group. Must divide dp.
  int zero_shard_size = 0;
  ZeroShardingOptions sharding;  // levels 2/3: prefetch, overlap, resident units (groups come from the grid)
  // Buckets and overlap (levels 0/1). sync is set from zero. For a tied embedding set tied_param;
  // embedding defaults to grid.embedding().
  GradBufferOptions grad_sync;
  // fp16: dynamic loss scaling (loss_scaler.h). The caller multiplies the loss gradient by
  // Optimizer::loss_scale(); step() checks the gradients for inf/NaN on every rank
  // (any_nonfinite_grad), skips the step on all of them together on an overflow, and otherwise
  // unscales the norm and folds 1 / scale into AdamW's grad_scale. Unset: no scaling.
  std::optional<LossScalerConfig> loss_scaler;
};

struct StepReport {
  double grad_norm = 0;       // global norm before clipping (NaN/inf when the step was skipped)
  double clip_coef = 1;       // applied to the gradients (1: not clipped)
  bool skipped = false;       // non-finite norm: parameters and Adam state untouched
  bool overflow = false;      // skipped by the loss scaler: a non-finite gradient on some rank
  double loss_scale = 1;      // the loss scale this step's gradients carried (1 without a scaler)
  int64_t applied_steps = 0;  // steps applied so far (AdamW's t of this step)
  int64_t skipped_steps = 0;  // iterations skipped so far
  GradSyncStats sync;         // the gradient synchronisation of this step
  double update_s = 0;        // norm + AdamW
  double gather_s = 0;        // ZeRO-1/2 parameter all-gather after the update
  GatherStats zero3;          // ZeRO-3: the step's unit all-gathers (exposed and total time)
};

// The DP shard groups of a ZeRO-2/3 run: `shard` (zero_shard_size consecutive DP ranks, or all of
// dp) and `replicate` (the ranks holding the same shard in the other groups; null without HSDP),
// split from grid.dp(). Collective over grid.dp().
struct ZeroGroups {
  std::unique_ptr<Communicator> shard_owned, replicate;
  Communicator* shard = nullptr;  // shard_owned, or grid.dp() itself when there is one group
};
ZeroGroups make_zero_groups(ProcessGrid& grid, int zero_shard_size);
// The ShardSpec a store needs for level `zero` (2/3) over these groups (experts shard over expert-DP).
ShardSpec zero_shard_spec(int zero, const ZeroGroups& g, ProcessGrid& grid, bool force_compute_copy = false);

class Optimizer {
 public:
  // The store must be finalized, with pad_to = grid.dp().size() under ZeRO-1, or finalize_sharded
  // at cfg.zero over groups (make_zero_groups: pass them in, they must outlive the optimizer) for 2/3.
  // Store and grid must outlive the optimizer.
  Optimizer(ParamStore& store, ProcessGrid& grid, const OptimizerConfig& cfg, ZeroGroups groups = {});
  ~Optimizer();

  // What the executor calls mark_ready()/progress() on: the GradBuffer (levels 0/1) or the ZeRO-2/3 engine.
  GradReadySink& grad_sink();
  // Levels 0/1 only (ConfigError otherwise).
  GradBuffer& grad_buffer();
  // Levels 2/3 only (ConfigError otherwise).
  ZeroSharding& sharding();
  // GradBuffer::presync_nonfinite (0 under ZeRO-2/3, whose own gradients never spread).
  double presync_nonfinite() const;

  // After backward of the last micro-batch: finishes the gradient sync (GradBuffer::finish),
  // then updates the parameters with learning rate lr. All ranks take or skip the step together.
  // Afterwards flat_grads hold the DP-reduced, unclipped gradients (plain DP) or this rank's
  // unreduced ones (ZeRO-1), or the shard the reduced ones (2/3); zero them (ParamStore::zero_grads)
  // before the next step's first micro-batch.
  StepReport step(double lr);

  // Under ZeRO-1 with a compute copy (ParamStore::has_compute_copy) the step gathers only the
  // copy, leaving other shards' fp32 masters stale on this rank; this all-gathers the masters
  // over DP (every DP rank calls it together) before something reads them whole (the HF export).
  // Nothing to do otherwise. Returns seconds spent. (ZeRO-3 holds no whole masters: read them with
  // sharding().full_master(i).)
  double gather_master_weights();

  // What to multiply the loss gradient by: the loss scaler's current scale, 1 without one.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }
  const DynamicLossScaler* loss_scaler() const { return scaler_ ? &*scaler_ : nullptr; }
  DynamicLossScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }

  int64_t applied_steps() const { return applied_; }
  int64_t skipped_steps() const { return skipped_; }
  // For checkpoint restore.
  void set_step_counts(int64_t applied, int64_t skipped);
  const OptimizerConfig& config() const { return cfg_; }
  int zero_level() const { return cfg_.zero; }
  // Whether the Adam state (and what ranges() maps) is this rank's shard: ZeRO 1, 2 or 3.
  bool sharded_state() const { return cfg_.zero >= 1; }
  // Whether another replica group holds the same shard (HSDP): only replica 0 writes checkpoints.
  bool replica_writer() const;

  // Adam moments: the whole flat buffer (padded_numel) or, under ZeRO, this rank's shard
  // (layout in zero.h, or ParamStore::shard_segments under 2/3).
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  const std::vector<UpdateRange>& ranges() const { return ranges_; }
  // One Adam moment (0: exp_avg m, 1: exp_avg_sq v) copied to / from host memory, in the layout
  // above: what checkpoints read and write (the moments may live on a device).
  std::vector<float> state_to_host(int moment) const;
  // Elements [begin, end) of one moment into dst (4 (end - begin) bytes, any alignment).
  void state_to_host(int moment, size_t begin, size_t end, std::span<std::byte> dst) const;
  void state_from_host(int moment, std::span<const float> values);  // ConfigError on a wrong size

 private:
  static GradBufferOptions sync_options(const OptimizerConfig& cfg, ProcessGrid& grid);
  void update(const AdamWStep& s);

  ParamStore& store_;
  ProcessGrid& grid_;
  OptimizerConfig cfg_;
  ZeroGroups groups_;
  std::unique_ptr<GradBuffer> grads_;   // levels 0/1
  std::unique_ptr<ZeroSharding> zs_;    // levels 2/3
  std::vector<UpdateRange> ranges_;
  Tensor m_, v_, staging_, staging_masters_;  // on the store's backend
  int64_t applied_ = 0, skipped_ = 0;
  std::optional<DynamicLossScaler> scaler_;
};

}  // namespace triax
