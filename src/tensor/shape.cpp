// Shape: validation, element count, strides and printing.
#include "triax/tensor/shape.h"

#include <fmt/format.h>

#include "triax/core/error.h"

namespace triax {

Shape::Shape(std::initializer_list<int64_t> dims) { assign({dims.begin(), dims.size()}); }
Shape::Shape(std::span<const int64_t> dims) { assign(dims); }

void Shape::assign(std::span<const int64_t> dims) {
  if (dims.size() > static_cast<size_t>(kMaxDims))
    TRIAX_THROW(ConfigError, "shape: {} dimensions given, at most {} are supported", dims.size(), kMaxDims);
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0) TRIAX_THROW(ConfigError, "shape: extent {} of dimension {} is negative", dims[d], d);
    dims_[d] = dims[d];
  }
  ndim_ = static_cast<int>(dims.size());
}

int64_t Shape::at(int d) const {
  if (d < 0 || d >= ndim_) TRIAX_THROW(ConfigError, "shape {}: dimension {} out of range [0, {})", str(), d, ndim_);
  return dims_[d];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim_; ++d) n *= dims_[d];
  return n;
}

std::array<int64_t, Shape::kMaxDims> Shape::contiguous_strides() const {
  std::array<int64_t, kMaxDims> s{};
  int64_t run = 1;
  for (int d = ndim_ - 1; d >= 0; --d) {
    s[d] = run;
    run *= dims_[d];
  }
  return s;
}

Shape Shape::with(int d, int64_t n) const {
  at(d);
  if (n < 0) TRIAX_THROW(ConfigError, "shape {}: extent {} for dimension {} is negative", str(), n, d);
  Shape s = *this;
  s.dims_[d] = n;
  return s;
}

std::string Shape::str() const {
  std::string out = "(";
  for (int d = 0; d < ndim_; ++d) out += (d ? ", " : "") + std::to_string(dims_[d]);
  return out + ")";
}

}  // namespace triax
