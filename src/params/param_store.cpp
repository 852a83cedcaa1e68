// Flat parameter and gradient buffers with named views.
#include "triax/params/param_store.h"

#include <algorithm>
#include <cstring>

namespace triax {

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

void ParamStore::finalize(size_t pad_to, bool force_compute_copy) {
  if (finalized_) TRIAX_THROW(ConfigError, "ParamStore::finalize called twice");
  if (pad_to == 0) pad_to = 1;
  padded_ = (used_ + pad_to - 1) / pad_to * pad_to;
  const auto n = static_cast<int64_t>(padded_);
  params_ = be_->zeros(Shape{n}, dtype_);
  grads_ = be_->zeros(Shape{n}, dtype_);
  // The compute copy starts as the zero masters' image; refresh_compute_copy() follows every init.
  weights_ = compute_dtype_ != dtype_ || force_compute_copy ? be_->zeros(Shape{n}, compute_dtype_) : params_;
  stale_.assign(infos_.size(), 0);
  finalized_ = true;
}

ParamStore::ParamStore(Backend& be) : be_(&be) {
  dtype_ = be.compute_dtype() == DType::f64 ? DType::f64 : DType::f32;
  compute_dtype_ = be.compute_dtype();
}

ParamStore::ParamStore() : own_(make_cpu_backend()), be_(own_.get()) {}

ParamStore::~ParamStore() = default;

namespace {
void need_final(bool f, const char* what) {
  if (!f) TRIAX_THROW(ConfigError, "ParamStore::{} before finalize()", what);
}
}  // namespace

Tensor ParamStore::weight_t(size_t i) const {
  need_final(finalized_, "weight_t");
  const auto& p = infos_.at(i);
  return weights_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::param_t(size_t i) const {
  need_final(finalized_, "param_t");
  const auto& p = infos_.at(i);
  return params_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::grad_t(size_t i) const {
  need_final(finalized_, "grad_t");
  const auto& p = infos_.at(i);
  return grads_.slice(static_cast<int64_t>(p.offset), static_cast<int64_t>(p.offset + p.numel));
}

Tensor ParamStore::grads_range(size_t begin, size_t end) const {
  need_final(finalized_, "grads_range");
  if (begin >= end || end > padded_)
    TRIAX_THROW(ConfigError, "gradient range [{}, {}) outside the store's {} elements", begin, end, padded_);
  return grads_.slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
}

std::vector<float> ParamStore::param_to_host(size_t i) const {
  const Tensor t = param_t(i);
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
  const Tensor t = param_t(i);
  if (begin > end || end > static_cast<size_t>(t.numel()) || dst.size() != (end - begin) * sizeof(float))
    TRIAX_THROW(ConfigError, "parameter '{}' ({} elements): elements [{}, {}) do not fit {} bytes",
                infos_.at(i).spec.name, t.numel(), begin, end, dst.size());
  if (begin == end) return;
  if (stale_.at(i)) {
    const size_t b = infos_[i].offset + begin, e = infos_[i].offset + end;
    const bool inside = std::any_of(current_ranges_.begin(), current_ranges_.end(),
                                    [&](const auto& r) { return r.first <= b && e <= r.second; });
    if (!inside)
      TRIAX_THROW(ConfigError, "parameter '{}': master elements [{}, {}) are outside this rank's ZeRO-1 shard and "
                  "stale (the all-gather moved only the compute copy); gather the masters first "
                  "(Optimizer::gather_master_weights)", infos_[i].spec.name, begin, end);
  }
  const Tensor part = t.slice(static_cast<int64_t>(begin), static_cast<int64_t>(end));
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
  if (finalized_) be_->fill(grads_, 0.0);
}

void ParamStore::need_current(size_t i, const char* what) const {
  if (finalized_ && stale_.at(i))
    TRIAX_THROW(ConfigError, "ParamStore::{}: the master of parameter '{}' is stale on this rank outside its ZeRO-1 "
                "shard (the all-gather moved only the {} compute copy); gather the masters first "
                "(Optimizer::gather_master_weights)", what, infos_[i].spec.name, dtype_name(compute_dtype_));
}

void ParamStore::refresh_compute_copy() {
  need_final(finalized_, "refresh_compute_copy");
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
