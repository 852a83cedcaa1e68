// Flat parameter and gradient buffers with named views.
#include "triax/model/params.h"

#include <algorithm>

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

void ParamStore::finalize(size_t pad_to) {
  if (finalized_) TRIAX_THROW(ConfigError, "ParamStore::finalize called twice");
  if (pad_to == 0) pad_to = 1;
  const size_t total = (used_ + pad_to - 1) / pad_to * pad_to;
  params_.assign(total, 0.0f);
  grads_.assign(total, 0.0f);
  finalized_ = true;
}

size_t ParamStore::find(const std::string& name) const {
  for (size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].spec.name == name) return i;
  TRIAX_THROW(ConfigError, "no parameter named '{}' in this stage", name);
}

std::vector<float> ParamStore::param_to_host(size_t i) const {
  const auto p = param(i);
  return std::vector<float>(p.begin(), p.end());
}

void ParamStore::param_from_host(size_t i, std::span<const float> values) {
  auto p = param(i);
  if (values.size() != p.size())
    TRIAX_THROW(ConfigError, "parameter '{}' holds {} values here, {} were given", infos_.at(i).spec.name, p.size(),
                values.size());
  std::copy(values.begin(), values.end(), p.begin());
}

void ParamStore::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace triax
