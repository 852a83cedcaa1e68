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

namespace triax {

struct OptimizerConfig {
  AdamWConfig adamw;
  double max_grad_norm = 1.0;  // clip the global norm to this; <= 0 disables clipping
  bool zero1 = false;          // ZeRO-1: reduce-scatter, sharded Adam state, all-gather params
  // Buckets and overlap. sync is set from zero1. For a tied embedding set tied_param; embedding
  // defaults to grid.embedding().
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
  double gather_s = 0;        // ZeRO-1 parameter all-gather
};

class Optimizer {
 public:
  // The store must be finalized, with pad_to = grid.dp().size() under ZeRO-1. Store and grid
  // must outlive the optimizer.
  Optimizer(ParamStore& store, ProcessGrid& grid, const OptimizerConfig& cfg);

  // The executor calls mark_ready()/progress() on it during the last micro-batch's backward.
  GradBuffer& grad_buffer() { return grads_; }

  // After backward of the last micro-batch: finishes the gradient sync (GradBuffer::finish),
  // then updates the parameters with learning rate lr. All ranks take or skip the step together.
  // Afterwards flat_grads hold the DP-reduced, unclipped gradients (plain DP) or this rank's
  // unreduced ones (ZeRO-1); zero them before the next step's first micro-batch.
  StepReport step(double lr);

  // Under ZeRO-1 with a compute copy (ParamStore::has_compute_copy) the step gathers only the
  // copy, leaving other shards' fp32 masters stale on this rank; this all-gathers the masters
  // over DP (every DP rank calls it together) before something reads them whole (the HF export).
  // Nothing to do otherwise. Returns seconds spent.
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
  bool zero1() const { return cfg_.zero1; }

  // Adam moments: the whole flat buffer (padded_numel) or, under ZeRO-1, this rank's shard
  // (grad_buffer().shard_size(); layout in zero.h).
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

  ParamStore& store_;
  ProcessGrid& grid_;
  OptimizerConfig cfg_;
  GradBuffer grads_;
  std::vector<UpdateRange> ranges_;
  Tensor m_, v_, staging_, staging_masters_;  // on the store's backend
  int64_t applied_ = 0, skipped_ = 0;
  std::optional<DynamicLossScaler> scaler_;
};

}  // namespace triax
