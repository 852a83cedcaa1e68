// One optimizer step: sync, norm, skip / clip, fused AdamW, ZeRO-1 gather.
#include "triax/optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "triax/core/clock.h"
#include "triax/optim/grad_norm.h"

namespace triax {

GradBufferOptions Optimizer::sync_options(const OptimizerConfig& cfg, ProcessGrid& grid) {
  GradBufferOptions o = cfg.grad_sync;
  o.sync = cfg.zero == 1 ? GradSync::reduce_scatter : GradSync::all_reduce;
  if (o.tied_param && !o.embedding) o.embedding = grid.embedding();
  if (!o.expert_dp) o.expert_dp = &grid.expert_dp_cp();  // used only if the store holds MoE experts
  return o;
}

ZeroGroups make_zero_groups(ProcessGrid& grid, int zero_shard_size) {
  Communicator& dp = grid.dp_cp();
  const int n = zero_shard_size <= 0 ? dp.size() : zero_shard_size;
  if (dp.size() % n != 0)
    TRIAX_THROW(ConfigError, "--zero-shard-size {} does not divide the data-parallel size {}", n, dp.size());
  ZeroGroups g;
  if (n == dp.size()) {
    g.shard = &dp;
    return g;
  }
  if (grid.ep().size() > 1)
    TRIAX_THROW(ConfigError, "--zero-shard-size {} (HSDP) with expert parallelism (ep {}) is not supported: shard "
                "over all of dp", n, grid.ep().size());
  // Consecutive DP ranks shard together (a node when DP ranks of one node are adjacent).
  g.shard_owned = dp.split(dp.rank() / n, dp.rank(), "dp_shard");
  g.replicate = dp.split(dp.rank() % n, dp.rank(), "dp_replicate");
  g.shard = g.shard_owned.get();
  return g;
}

ShardSpec zero_shard_spec(int zero, const ZeroGroups& g, ProcessGrid& grid, bool force_compute_copy) {
  if (!g.shard) TRIAX_THROW(ConfigError, "ZeRO-{}: no shard group (make_zero_groups)", zero);
  ShardSpec s;
  s.level = zero;
  s.group = g.shard->size();
  s.rank = g.shard->rank();
  // Experts shard over expert-DP when experts are split over EP ranks, else like every parameter.
  const bool split = grid.ep().size() > 1;
  s.expert_group = split ? grid.expert_dp_cp().size() : s.group;
  s.expert_rank = split ? grid.expert_dp_cp().rank() : s.rank;
  s.force_compute_copy = force_compute_copy;
  return s;
}

Optimizer::Optimizer(ParamStore& store, ProcessGrid& grid, const OptimizerConfig& cfg, ZeroGroups groups)
    : store_(store), grid_(grid), cfg_(cfg), groups_(std::move(groups)) {
  validate(cfg_.adamw);
  if (!std::isfinite(cfg_.max_grad_norm))
    TRIAX_THROW(ConfigError, "max_grad_norm = {} must be finite (<= 0 disables clipping)", cfg_.max_grad_norm);
  if (cfg_.zero < 0 || cfg_.zero > 3) TRIAX_THROW(ConfigError, "--zero {} is not a ZeRO level (0, 1, 2 or 3)", cfg_.zero);
  if (cfg_.zero <= 1 && cfg_.zero_shard_size > 0 && cfg_.zero_shard_size != grid.dp_cp().size())
    TRIAX_THROW(ConfigError, "--zero-shard-size {} needs --zero 2 or 3 (ZeRO-{} shards over all of dp)",
                cfg_.zero_shard_size, cfg_.zero);
  Backend& be = store_.backend();
  size_t state = store_.padded_numel();
  if (cfg_.zero >= 2) {
    if (store_.zero_level() != cfg_.zero)
      TRIAX_THROW(ConfigError, "ZeRO-{}: the parameter store is laid out for level {} (ParamStore::finalize_sharded)",
                  cfg_.zero, store_.zero_level());
    if (!groups_.shard) groups_ = make_zero_groups(grid, cfg_.zero_shard_size);
    ZeroShardingOptions o = cfg_.sharding;
    o.overlap = o.overlap && cfg_.grad_sync.overlap;
    o.tied_param = cfg_.grad_sync.tied_param;
    o.embedding = cfg_.grad_sync.embedding ? cfg_.grad_sync.embedding : grid.embedding();
    o.replicate = groups_.replicate.get();
    if (grid.ep().size() > 1) {
      o.expert_shard = &grid.expert_dp_cp();
      o.expert_scale = static_cast<double>(grid.expert_dp_cp().size()) / grid.dp_cp().size();
    }
    zs_ = std::make_unique<ZeroSharding>(store_, *groups_.shard, o);
    ranges_ = update_ranges(store_, store_.shard_segments());
    state = store_.shard_size();
  } else {
    grads_ = std::make_unique<GradBuffer>(store, grid.dp_cp(), sync_options(cfg, grid));
    cfg_.grad_sync = grads_->options();
    ranges_ = cfg_.zero == 1 ? update_ranges(store_, *grads_) : update_ranges(store_);
    if (cfg_.zero == 1) state = grads_->shard_size();
  }
  m_ = be.zeros(Shape{static_cast<int64_t>(state)}, DType::f32);
  v_ = be.zeros(Shape{static_cast<int64_t>(state)}, DType::f32);
  if (cfg_.loss_scaler) scaler_.emplace(*cfg_.loss_scaler);
}

Optimizer::~Optimizer() = default;

GradReadySink& Optimizer::grad_sink() {
  if (zs_) return *zs_;
  return *grads_;
}

GradBuffer& Optimizer::grad_buffer() {
  if (!grads_) TRIAX_THROW(ConfigError, "Optimizer::grad_buffer: ZeRO-{} has no GradBuffer (use sharding())", cfg_.zero);
  return *grads_;
}

ZeroSharding& Optimizer::sharding() {
  if (!zs_) TRIAX_THROW(ConfigError, "Optimizer::sharding: ZeRO-{} does not shard gradients (levels 2 and 3 do)", cfg_.zero);
  return *zs_;
}

double Optimizer::presync_nonfinite() const { return grads_ ? grads_->presync_nonfinite() : 0.0; }

bool Optimizer::replica_writer() const { return !groups_.replicate || groups_.replicate->rank() == 0; }

void Optimizer::set_step_counts(int64_t applied, int64_t skipped) {
  if (applied < 0 || skipped < 0)
    TRIAX_THROW(ConfigError, "optimizer step counts must be >= 0 (got applied {}, skipped {})", applied, skipped);
  applied_ = applied;
  skipped_ = skipped;
}

std::vector<float> Optimizer::state_to_host(int moment) const {
  if (moment != 0 && moment != 1) TRIAX_THROW(ConfigError, "Adam moment {} does not exist (0: m, 1: v)", moment);
  const Tensor& t = moment == 0 ? m_ : v_;
  std::vector<float> out(t.defined() ? static_cast<size_t>(t.numel()) : 0);
  if (!out.empty()) store_.backend().copy_to_host(out.data(), t, out.size() * sizeof(float));
  return out;
}

void Optimizer::state_to_host(int moment, size_t begin, size_t end, std::span<std::byte> dst) const {
  if (moment != 0 && moment != 1) TRIAX_THROW(ConfigError, "Adam moment {} does not exist (0: m, 1: v)", moment);
  const Tensor& t = moment == 0 ? m_ : v_;
  const size_t n = t.defined() ? static_cast<size_t>(t.numel()) : 0;
  if (begin > end || end > n || dst.size() != (end - begin) * sizeof(float))
    TRIAX_THROW(ConfigError, "Adam moment {} ({} values on this rank): elements [{}, {}) do not fit {} bytes", moment,
                n, begin, end, dst.size());
  if (begin < end)
    store_.backend().copy_to_host(dst.data(), t.slice(static_cast<int64_t>(begin), static_cast<int64_t>(end)),
                                  dst.size());
}

void Optimizer::state_from_host(int moment, std::span<const float> values) {
  if (moment != 0 && moment != 1) TRIAX_THROW(ConfigError, "Adam moment {} does not exist (0: m, 1: v)", moment);
  const Tensor& dst = moment == 0 ? m_ : v_;
  const size_t n = dst.defined() ? static_cast<size_t>(dst.numel()) : 0;
  if (values.size() != n)
    TRIAX_THROW(ConfigError, "Adam moment {} holds {} values on this rank, {} were given", moment, n, values.size());
  if (n > 0) store_.backend().copy_from_host(dst, values.data(), n * sizeof(float));
}

StepReport Optimizer::step(double lr) {
  if (!(std::isfinite(lr) && lr >= 0.0)) TRIAX_THROW(ConfigError, "learning rate {} must be finite and >= 0", lr);
  StepReport rep;
  rep.sync = zs_ ? zs_->finish() : grads_->finish();
  if (zs_) rep.zero3 = zs_->take_gather_stats();
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<GradShard> shard;
  if (zs_) shard = GradShard{zs_->shard_grads_t(), &store_.shard_segments(), zs_->counts_in_norm()};
  else if (cfg_.zero == 1) shard = shard_of(*grads_);
  auto skip = [&] {
    ++skipped_;
    rep.skipped = true;
    rep.applied_steps = applied_;
    rep.skipped_steps = skipped_;
    rep.update_s = since(t0);
    return rep;
  };
  rep.loss_scale = loss_scale();
  if (scaler_) {
    // Every rank learns of an overflow anywhere (world all-reduce) and updates its scaler alike.
    rep.overflow = !scaler_->update(shard ? any_nonfinite_grad(store_, grid_, *shard) : any_nonfinite_grad(store_, grid_));
    if (rep.overflow) {
      rep.grad_norm = std::numeric_limits<double>::infinity();
      return skip();
    }
  }
  // Of the unscaled gradients.
  rep.grad_norm = (shard ? global_grad_norm(store_, grid_, *shard) : global_grad_norm(store_, grid_)) / rep.loss_scale;
  if (!std::isfinite(rep.grad_norm)) return skip();
  rep.clip_coef = clip_coefficient(rep.grad_norm, cfg_.max_grad_norm);
  ++applied_;
  update(AdamWStep{static_cast<float>(lr), applied_, static_cast<float>(rep.clip_coef / rep.loss_scale)});
  rep.update_s = since(t0);
  if (cfg_.zero == 1) rep.gather_s = zero_all_gather_params(*grads_, staging_);
  if (cfg_.zero == 2) rep.gather_s = zs_->gather_weights();
  if (cfg_.zero == 3) zs_->weights_changed();  // the next forward gathers the updated units
  rep.applied_steps = applied_;
  rep.skipped_steps = skipped_;
  return rep;
}

// Fused AdamW over ranges_: the masters at flat offsets (their shard offsets under ZeRO-3, where
// params_t() is the shard), gradients and moments at state offsets; the compute copy (when the
// store has one) receives the updated weights in the same pass.
void Optimizer::update(const AdamWStep& s) {
  Backend& be = store_.backend();
  const Tensor params = store_.params_t();
  const Tensor grads = zs_ ? zs_->shard_grads_t() : cfg_.zero == 1 ? grads_->shard_grads_t() : store_.grads_t();
  const Tensor copy = store_.has_compute_copy() ? store_.weights_t() : Tensor();
  const bool shard_masters = cfg_.zero == 3;
  auto at = [](const Tensor& t, size_t off, size_t n) {
    return t.defined() ? t.slice(static_cast<int64_t>(off), static_cast<int64_t>(off + n)) : Tensor();
  };
  for (const auto& r : ranges_) {
    const size_t po = shard_masters ? r.state_offset : r.flat_offset;
    be.adamw(at(params, po, r.count), at(grads, r.state_offset, r.count), at(m_, r.state_offset, r.count),
             at(v_, r.state_offset, r.count), cfg_.adamw, r.decay ? cfg_.adamw.weight_decay : 0.0f, s,
             at(copy, r.flat_offset, r.count));
  }
}

double Optimizer::gather_master_weights() {
  if (cfg_.zero == 1) return zero_all_gather_masters(*grads_, staging_masters_);
  if (cfg_.zero == 2) return zs_->gather_masters();
  return 0.0;
}

}  // namespace triax
