// One optimizer step: sync, norm, skip / clip, fused AdamW, ZeRO-1 gather.
#include "triax/optim/optimizer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "triax/core/clock.h"
#include "triax/optim/grad_norm.h"

namespace triax {

GradBufferOptions Optimizer::sync_options(const OptimizerConfig& cfg, ProcessGrid& grid) {
  GradBufferOptions o = cfg.grad_sync;
  o.sync = cfg.zero1 ? GradSync::reduce_scatter : GradSync::all_reduce;
  if (o.tied_param && !o.embedding) o.embedding = grid.embedding();
  if (!o.expert_dp) o.expert_dp = &grid.expert_dp();  // used only if the store holds MoE experts
  return o;
}

Optimizer::Optimizer(ParamStore& store, ProcessGrid& grid, const OptimizerConfig& cfg)
    : store_(store), grid_(grid), cfg_(cfg), grads_(store, grid.dp(), sync_options(cfg, grid)) {
  validate(cfg_.adamw);
  if (!std::isfinite(cfg_.max_grad_norm))
    TRIAX_THROW(ConfigError, "max_grad_norm = {} must be finite (<= 0 disables clipping)", cfg_.max_grad_norm);
  cfg_.grad_sync = grads_.options();
  ranges_ = cfg_.zero1 ? update_ranges(store_, grads_) : update_ranges(store_);
  const size_t state = cfg_.zero1 ? grads_.shard_size() : store_.padded_numel();
  Backend& be = store_.backend();
  m_ = be.zeros(Shape{static_cast<int64_t>(state)}, DType::f32);
  v_ = be.zeros(Shape{static_cast<int64_t>(state)}, DType::f32);
  if (cfg_.loss_scaler) scaler_.emplace(*cfg_.loss_scaler);
}

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
  rep.sync = grads_.finish();
  const auto t0 = std::chrono::steady_clock::now();
  const GradBuffer* zero = cfg_.zero1 ? &grads_ : nullptr;
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
    rep.overflow = !scaler_->update(any_nonfinite_grad(store_, grid_, zero));
    if (rep.overflow) {
      rep.grad_norm = std::numeric_limits<double>::infinity();
      return skip();
    }
  }
  rep.grad_norm = global_grad_norm(store_, grid_, zero) / rep.loss_scale;  // of the unscaled gradients
  if (!std::isfinite(rep.grad_norm)) return skip();
  rep.clip_coef = clip_coefficient(rep.grad_norm, cfg_.max_grad_norm);
  ++applied_;
  const AdamWStep s{static_cast<float>(lr), applied_, static_cast<float>(rep.clip_coef / rep.loss_scale)};
  Backend& be = store_.backend();
  const Tensor params = store_.params_t();
  const Tensor grads = cfg_.zero1 ? grads_.shard_grads_t() : store_.grads_t();
  // The compute copy (when the store has one) receives the updated weights in the same pass.
  const Tensor copy = store_.has_compute_copy() ? store_.weights_t() : Tensor();
  auto at = [](const Tensor& t, size_t off, size_t n) {
    return t.defined() ? t.slice(static_cast<int64_t>(off), static_cast<int64_t>(off + n)) : Tensor();
  };
  for (const auto& r : ranges_)
    be.adamw(at(params, r.flat_offset, r.count), at(grads, r.state_offset, r.count), at(m_, r.state_offset, r.count),
             at(v_, r.state_offset, r.count), cfg_.adamw, r.decay ? cfg_.adamw.weight_decay : 0.0f, s,
             at(copy, r.flat_offset, r.count));
  rep.update_s = since(t0);
  if (cfg_.zero1) rep.gather_s = zero_all_gather_params(grads_, staging_);
  rep.applied_steps = applied_;
  rep.skipped_steps = skipped_;
  return rep;
}

double Optimizer::gather_master_weights() {
  return cfg_.zero1 ? zero_all_gather_masters(grads_, staging_masters_) : 0.0;
}

}  // namespace triax
