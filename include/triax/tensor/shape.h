// The shape of a tensor: up to kMaxDims int64 extents, stored inline (no allocation), with the
// row-major (contiguous) strides that go with it.
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

namespace triax {

class Shape {
 public:
  static constexpr int kMaxDims = 5;

  Shape() = default;  // 0-d: a scalar, one element
  // ConfigError for more than kMaxDims extents or a negative one.
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);

  int ndim() const { return ndim_; }
  // Unchecked; d in [0, ndim()).
  int64_t operator[](int d) const { return dims_[d]; }
  // Checked: ConfigError naming d and the shape unless 0 <= d < ndim().
  int64_t at(int d) const;
  int64_t numel() const;
  std::span<const int64_t> dims() const { return {dims_.data(), static_cast<size_t>(ndim_)}; }

  // Row-major strides in elements: the last dimension has stride 1.
  std::array<int64_t, kMaxDims> contiguous_strides() const;

  // This shape with dimension d set to n (checked like at()).
  Shape with(int d, int64_t n) const;

  // "(2, 3, 4)"; "()" for a scalar.
  std::string str() const;

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.ndim_ != b.ndim_) return false;
    for (int d = 0; d < a.ndim_; ++d)
      if (a.dims_[d] != b.dims_[d]) return false;
    return true;
  }

 private:
  void assign(std::span<const int64_t> dims);
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace triax
