// Flat parameter and gradient buffers with named views.
#include "triax/params/param_store.h"

#include <algorithm>
#include <cstring>

namespace triax {

namespace {
void need_final(bool f, const char* what) {
  if (!f) TRIAX_THROW(ConfigError, "ParamStore::{} before finalize()", what);
}
}  // namespace

size_t ParamStore::add(ParamSpec spec, std::vector<int64_t> local_shape) {
  if (finalized_) TRIAX_THROW(ConfigError, "parameter '{}' added after the store was finalized", spec.name);
  for (const auto& p : infos_)
    if (p.spec.name == spec.name) TRIAX_THROW(ConfigError, "parameter '{}' registered twice", spec.name);
  size_t n = 1;
  for (int64_t d : local_shape) {
    if (d <= 0) TRIAX_THROW(ConfigError, "parameter '{}' has a non-positive dimension {}", spec.name, d);
    n *= static_cast<size_t>(d);
  }
  infos_.push_back(ParamInfo{std::move(spec), std::move(local_shape), used_, n});
  used_ += n;
  return infos_.size() - 1;
}

void ParamStore::begin_unit(std::string name) {
  if (finalized_) TRIAX_THROW(ConfigError, "unit '{}' begun after the store was finalized", name);
  if (!unit_starts_.empty() && unit_starts_.back().first == infos_.size()) unit_starts_.pop_back();  // empty unit
  unit_starts_.emplace_back(infos_.size(), std::move(name));
}

// Units from begin_unit() and expert-flag changes; under ZeRO-2/3 (spec_.level >= 2) each unit's
// flat range is padded to a multiple of its group and offsets move accordingly; shard pieces and
// segments follow. Unsharded stores keep add()'s offsets (group 1: nothing padded).
void ParamStore::layout_units(size_t pad_to) {
  const bool sharded = spec_.level >= 2;
  units_.clear();
  unit_of_.assign(infos_.size(), 0);
  size_t next_start = 0, cursor = 0, shard = 0;
  for (size_t i = 0; i < infos_.size(); ++i) {
    const bool declared = next_start < unit_starts_.size() && unit_starts_[next_start].first == i;
    const bool expert_change = !units_.empty() && infos_[i].spec.expert != units_.back().expert;
    if (units_.empty() || declared || expert_change) {
      ParamUnit u;
      u.name = declared ? unit_starts_[next_start].second : units_.empty() ? std::string("params") : units_.back().name;
      if (expert_change && !declared) u.name += infos_[i].spec.expert ? " experts" : " (dense)";
      u.first = i;
      u.expert = infos_[i].spec.expert;
      u.group = sharded ? (u.expert ? spec_.expert_group : spec_.group) : 1;
      u.rank = sharded ? (u.expert ? spec_.expert_rank : spec_.rank) : 0;
      u.begin = u.end = cursor;
      units_.push_back(std::move(u));
    }
    if (declared) ++next_start;
    ParamUnit& u = units_.back();
    if (sharded) infos_[i].offset = u.end;
    u.end = infos_[i].offset + infos_[i].numel;
    ++u.count;
    unit_of_[i] = units_.size() - 1;
    if (sharded && (i + 1 == infos_.size() || (next_start < unit_starts_.size() && unit_starts_[next_start].first == i + 1) ||
                    infos_[i + 1].spec.expert != u.expert)) {
      const auto g = static_cast<size_t>(u.group);
      u.end = (u.end - u.begin + g - 1) / g * g + u.begin;
      u.shard_offset = shard;
      shard += u.piece();
    }
    cursor = u.end;
  }
  if (sharded) {
    padded_ = cursor;
    shard_size_ = shard;
    segments_.clear();
    for (const auto& u : units_)
      for (size_t i = u.first; i < u.first + u.count; ++i) {
        const size_t lo = std::max(infos_[i].offset, u.piece_begin());
        const size_t hi = std::min(infos_[i].offset + infos_[i].numel, u.piece_begin() + u.piece());
        if (lo < hi) segments_.push_back(ShardSegment{u.shard_offset + (lo - u.piece_begin()), lo, hi - lo, i});
      }
  } else {
    if (pad_to == 0) pad_to = 1;
    padded_ = (used_ + pad_to - 1) / pad_to * pad_to;
  }
}

void ParamStore::finalize(size_t pad_to, bool force_compute_copy) {
  if (finalized_) TRIAX_THROW(ConfigError, "ParamStore::finalize called twice");
  layout_units(pad_to);
  const auto n = static_cast<int64_t>(padded_);
  params_ = be_->zeros(Shape{n}, dtype_);
  grads_ = be_->zeros(Shape{n}, dtype_);
  // The compute copy starts as the zero masters' image; refresh_compute_copy() follows every init.
  weights_ = compute_dtype_ != dtype_ || force_compute_copy ? be_->zeros(Shape{n}, compute_dtype_) : params_;
  stale_.assign(infos_.size(), 0);
  finalized_ = true;
}

void ParamStore::finalize_sharded(const ShardSpec& spec) {
  if (finalized_) TRIAX_THROW(ConfigError, "ParamStore::finalize_sharded called on a finalized store");
  if (spec.level != 2 && spec.level != 3) TRIAX_THROW(ConfigError, "ZeRO level {} is not sharded (2 or 3)", spec.level);
  if (spec.group < 1 || spec.rank < 0 || spec.rank >= spec.group || spec.expert_group < 1 || spec.expert_rank < 0 ||
      spec.expert_rank >= spec.expert_group)
    TRIAX_THROW(ConfigError, "ZeRO-{} shard group {} (rank {}), expert group {} (rank {}) is not a valid group",
                spec.level, spec.group, spec.rank, spec.expert_group, spec.expert_rank);
  spec_ = spec;
  layout_units(1);
  if (spec.level == 2) {
    params_ = be_->zeros(Shape{static_cast<int64_t>(padded_)}, dtype_);
    weights_ = compute_dtype_ != dtype_ || spec.force_compute_copy
                   ? be_->zeros(Shape{static_cast<int64_t>(padded_)}, compute_dtype_) : params_;
  } else {
    params_ = be_->zeros(Shape{static_cast<int64_t>(shard_size_)}, dtype_);
  }
  stale_.assign(infos_.size(), 0);
  finalized_ = true;
}

ParamProvider& ParamStore::need_provider(const char* what) const {
  need_final(finalized_, what);
  if (!provider_)
    TRIAX_THROW(ConfigError, "ParamStore::{}: the store is sharded (ZeRO-{}) and no ZeRO engine serves its views yet",
                what, spec_.level);
  return *provider_;
}

size_t ParamStore::shard_offset_of(size_t b, size_t e) const {
  const auto it = std::upper_bound(units_.begin(), units_.end(), b, [](size_t x, const ParamUnit& u) { return x < u.begin; });
  if (it == units_.begin()) return SIZE_MAX;
  const ParamUnit& u = *(it - 1);
  if (b < u.piece_begin() || e > u.piece_begin() + u.piece()) return SIZE_MAX;
  return u.shard_offset + (b - u.piece_begin());
}

ParamStore::ParamStore(Backend& be) : be_(&be) {
  dtype_ = be.compute_dtype() == DType::f64 ? DType::f64 : DType::f32;
  compute_dtype_ = be.compute_dtype();
}

ParamStore::ParamStore() : own_(make_cpu_backend()), be_(own_.get()) {}

ParamStore::~ParamStore() = default;


Tensor ParamStore::weight_t(size_t i) const {
  need_final(finalized_, "weight_t");
  const auto& p = infos_.at(i);
  if (spec_.level == 3) return need_provider("weight_t").weights(p.offset, p.offset + p.numel);
  return weights_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::param_t(size_t i) const {
  need_final(finalized_, "param_t");
  const auto& p = infos_.at(i);
  if (spec_.level == 3)
    TRIAX_THROW(ConfigError, "parameter '{}' is sharded over the ZeRO-3 group: this rank holds no whole master "
                "(read ranges of its shard with param_to_host(i, begin, end))", p.spec.name);
  return params_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::grad_t(size_t i) const {
  need_final(finalized_, "grad_t");
  const auto& p = infos_.at(i);
  if (spec_.level >= 2) return need_provider("grad_t").grads(p.offset, p.offset + p.numel);
  return grads_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::grads_range(size_t begin, size_t end) const {
  need_final(finalized_, "grads_range");
  if (begin >= end || end > padded_)
    TRIAX_THROW(ConfigError, "gradient range [{}, {}) outside the store's {} elements", begin, end, padded_);
  if (spec_.level >= 2) return need_provider("grads_range").grads(begin, end);
  return grads_.slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
}

namespace {
std::pair<size_t, size_t> span_of(const std::vector<ParamInfo>& infos, size_t first, size_t count) {
  if (count == 0 || first + count > infos.size())
    TRIAX_THROW(ConfigError, "parameters [{}, {}) outside the store's {}", first, first + count, infos.size());
  return {infos[first].offset, infos[first + count - 1].offset + infos[first + count - 1].numel};
}
}  // namespace

Tensor ParamStore::weights_of(size_t first, size_t count) const {
  need_final(finalized_, "weights_of");
  const auto [b, e] = span_of(infos_, first, count);
  if (spec_.level == 3) return need_provider("weights_of").weights(b, e);
  return weights_.slice(static_cast<int64_t>(b), static_cast<int64_t>(e));
}

Tensor ParamStore::grads_of(size_t first, size_t count) const {
  need_final(finalized_, "grads_of");
  const auto [b, e] = span_of(infos_, first, count);
  return grads_range(b, e);
}

std::vector<float> ParamStore::param_to_host(size_t i) const {
  const Tensor t = param_t(i);  // ConfigError under ZeRO-3: no whole master here
  need_current(i, "param_to_host");
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (dtype_ == DType::f32) {
    be_->copy_to_host(out.data(), t, out.size() * sizeof(float));
  } else {
    std::vector<double> d(out.size());
    be_->copy_to_host(d.data(), t, d.size() * sizeof(double));
    for (size_t k = 0; k < d.size(); ++k) out[k] = static_cast<float>(d[k]);
  }
  return out;
}

void ParamStore::param_to_host(size_t i, size_t begin, size_t end, std::span<std::byte> dst) const {
  need_final(finalized_, "param_to_host");
  const ParamInfo& p = infos_.at(i);
  if (begin > end || end > p.numel || dst.size() != (end - begin) * sizeof(float))
    TRIAX_THROW(ConfigError, "parameter '{}' ({} elements): elements [{}, {}) do not fit {} bytes",
                p.spec.name, p.numel, begin, end, dst.size());
  if (begin == end) return;
  Tensor part;
  if (spec_.level == 3) {
    const size_t so = shard_offset_of(p.offset + begin, p.offset + end);
    if (so == SIZE_MAX)
      TRIAX_THROW(ConfigError, "parameter '{}': master elements [{}, {}) are outside this rank's ZeRO-3 shard",
                  p.spec.name, begin, end);
    // so is where element `begin` lies in the shard (which may start after it in the parameter).
    part = params_.slice(static_cast<int64_t>(so), static_cast<int64_t>(so + (end - begin)));
  } else {
    part = param_t(i).slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  }
  if (stale_.at(i)) {
    const size_t b = infos_[i].offset + begin, e = infos_[i].offset + end;
    const bool inside = std::any_of(current_ranges_.begin(), current_ranges_.end(),
                                    [&](const auto& r) { return r.first <= b && e <= r.second; });
    if (!inside)
      TRIAX_THROW(ConfigError, "parameter '{}': master elements [{}, {}) are outside this rank's ZeRO-1 shard and "
                  "stale (the all-gather moved only the compute copy); gather the masters first "
                  "(Optimizer::gather_master_weights)", infos_[i].spec.name, begin, end);
  }
  if (dtype_ == DType::f32) {
    be_->copy_to_host(dst.data(), part, dst.size());
  } else {
    std::vector<double> d(end - begin);
    be_->copy_to_host(d.data(), part, d.size() * sizeof(double));
    for (size_t k = 0; k < d.size(); ++k) {
      const float f = static_cast<float>(d[k]);
      std::memcpy(dst.data() + k * sizeof(float), &f, sizeof(float));
    }
  }
}

void ParamStore::param_from_host(size_t i, std::span<const float> values) {
  need_final(finalized_, "param_from_host");
  if (spec_.level == 3) {  // this rank's pieces of it
    const ParamInfo& p = infos_.at(i);
    if (values.size() != p.numel)
      TRIAX_THROW(ConfigError, "parameter '{}' holds {} elements, {} given", p.spec.name, p.numel, values.size());
    for (const auto& sg : segments_) {
      if (sg.param != i) continue;
      const Tensor dst = params_.slice(static_cast<int64_t>(sg.shard_offset), static_cast<int64_t>(sg.shard_offset + sg.count));
      const float* src = values.data() + (sg.flat_offset - p.offset);
      if (dtype_ == DType::f32) {
        be_->copy_from_host(dst, src, sg.count * sizeof(float));
      } else {
        std::vector<double> d(src, src + sg.count);
        be_->copy_from_host(dst, d.data(), d.size() * sizeof(double));
      }
    }
    return;
  }
  const Tensor t = param_t(i);
  if (values.size() != static_cast<size_t>(t.numel()))
    TRIAX_THROW(ConfigError, "parameter '{}' holds {} elements here, {} given", infos_.at(i).spec.name, t.numel(),
                values.size());
  if (dtype_ == DType::f32) {
    be_->copy_from_host(t, values.data(), values.size_bytes());
  } else {
    std::vector<double> d(values.begin(), values.end());
    be_->copy_from_host(t, d.data(), d.size() * sizeof(double));
  }
  stale_.at(i) = 0;  // the whole master is written: current again
}

std::span<float> ParamStore::host_span(const Tensor& t, size_t off, size_t n) const {
  need_final(finalized_, "host view");
  if (!t.defined() || (spec_.level == 3 && t.raw_data() == params_.raw_data()))
    TRIAX_THROW(ConfigError, "ParamStore host views of whole buffers do not exist under ZeRO-{}: the store holds a "
                "shard (use param_to_host(i, begin, end) or the ZeRO engine)", spec_.level);
  if (!be_->host_accessible() || dtype_ != DType::f32)
    TRIAX_THROW(ConfigError, "ParamStore host views need a host-accessible float32 backend, not '{}' ({}): use "
                "param_to_host / param_from_host", be_->name(), dtype_name(dtype_));
  return std::span<float>(t.data<float>() + off, n);
}

std::span<float> ParamStore::param(size_t i) {
  need_current(i, "param");
  return host_span(params_, infos_.at(i).offset, infos_.at(i).numel);
}
std::span<float> ParamStore::grad(size_t i) { return host_span(grads_, infos_.at(i).offset, infos_.at(i).numel); }
std::span<const float> ParamStore::param(size_t i) const {
  need_current(i, "param");
  return host_span(params_, infos_.at(i).offset, infos_.at(i).numel);
}
std::span<float> ParamStore::flat_params() {
  for (size_t i = 0; i < infos_.size(); ++i) need_current(i, "flat_params");
  return host_span(params_, 0, padded_);
}
std::span<float> ParamStore::flat_grads() { return host_span(grads_, 0, padded_); }
std::span<const float> ParamStore::flat_params() const {
  for (size_t i = 0; i < infos_.size(); ++i) need_current(i, "flat_params");
  return host_span(params_, 0, padded_);
}
std::span<const float> ParamStore::flat_grads() const { return host_span(grads_, 0, padded_); }

size_t ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].spec.name == name) return i;
  TRIAX_THROW(ConfigError, "no parameter named '{}' in this stage", name);
}

void ParamStore::zero_grads() {
  if (!finalized_) return;
  if (spec_.level >= 2) {
    if (provider_) provider_->zero_grads();
    return;
  }
  be_->fill(grads_, 0.0);
}

void ParamStore::need_current(size_t i, const char* what) const {
  if (finalized_ && stale_.at(i))
    TRIAX_THROW(ConfigError, "ParamStore::{}: the master of parameter '{}' is stale on this rank outside its ZeRO-1 "
                "shard (the all-gather moved only the {} compute copy); gather the masters first "
                "(Optimizer::gather_master_weights)", what, infos_[i].spec.name, dtype_name(compute_dtype_));
}

void ParamStore::refresh_compute_copy() {
  need_final(finalized_, "refresh_compute_copy");
  if (spec_.level == 3) {  // the gathered units hold old weights: gather again
    if (provider_) provider_->weights_changed();
    return;
  }
  if (!has_compute_copy()) return;
  for (size_t i = 0; i < infos_.size(); ++i) need_current(i, "refresh_compute_copy");
  be_->cast(weights_, params_);
}

void ParamStore::mark_masters_sharded(std::vector<std::pair<size_t, size_t>> current_ranges) {
  need_final(finalized_, "mark_masters_sharded");
  for (const auto& [b, e] : current_ranges)
    if (b > e || e > padded_)
      TRIAX_THROW(ConfigError, "ParamStore::mark_masters_sharded: range [{}, {}) outside the store's {} elements", b, e,
                  padded_);
  current_ranges_ = std::move(current_ranges);
  std::fill(stale_.begin(), stale_.end(), char{1});
}

void ParamStore::mark_masters_current() {
  std::fill(stale_.begin(), stale_.end(), char{0});
  current_ranges_.clear();
}

bool ParamStore::masters_current() const {
  return std::none_of(stale_.begin(), stale_.end(), [](char c) { return c != 0; });
}

}  // namespace triax
