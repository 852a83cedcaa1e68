// Tensor: a typed, shaped view (offset + shape + strides) of a shared Storage on one device.
// Views (slice along dim 0, narrow along any dim, reshape of contiguous views) share the storage;
// the ops themselves take raw pointers with explicit shapes, got from data<T>() here.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "triax/core/device.h"
#include "triax/core/dtype.h"
#include "triax/core/error.h"
#include "triax/tensor/shape.h"
#include "triax/tensor/storage.h"

namespace triax {

class Tensor {
 public:
  // An undefined tensor (no storage); defined() is false and data<T>() throws.
  Tensor() = default;

  // Uninitialised memory from the device's allocator.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // Zero-filled; CPU only (ConfigError otherwise: device fills belong to the CUDA backend).
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  // A contiguous tensor over a storage made elsewhere (a Backend's allocation).
  static Tensor on_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  // A contiguous tensor over caller-owned memory (not freed here; must outlive the tensor).
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim(); }
  // Checked: ConfigError unless 0 <= d < ndim().
  int64_t size(int d) const { return shape_.at(d); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  // In elements.
  int64_t stride(int d) const;
  int64_t offset() const { return offset_; }
  size_t element_size() const { return dtype_size(dtype_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  // The first element, typed. ConfigError naming the mismatch when the tensor is undefined, T is
  // not its dtype (e.g. "data<float32>() on a int32 tensor"), or the view is not contiguous (ops
  // take dense buffers; call contiguous() first). The pointer is a device pointer for cuda.
  template <class T>
  T* data() const {
    check_access(dtype_of<T>());
    return reinterpret_cast<T*>(static_cast<std::byte*>(storage_->data()) +
                                static_cast<size_t>(offset_) * element_size());
  }
  // The first element, untyped and unchecked (also for strided views).
  void* raw_data() const;

  // Views sharing the storage. ConfigError for an empty range or one outside the shape.
  // Rows [begin, end) of dimension 0: contiguous when this is.
  Tensor slice(int64_t begin, int64_t end) const;
  // [start, start + length) of dimension dim (a TP shard of a weight): strided unless dim is the
  // leading non-trivial one.
  Tensor narrow(int dim, int64_t start, int64_t length) const;
  // Same elements, new shape; this must be contiguous and numel must match.
  Tensor reshape(const Shape& shape) const;

  // A contiguous copy (CPU); contiguous() returns *this when already contiguous.
  Tensor clone() const;
  Tensor contiguous() const;
  // Element-wise copy from src (same shape and dtype, any strides; CPU only).
  void copy_from(const Tensor& src);

  // "Tensor(float32, (2, 3), cpu)"
  std::string str() const;

 private:
  void check_access(DType want) const;
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::array<int64_t, Shape::kMaxDims> strides_{};
  int64_t offset_ = 0;  // in elements, from storage_->data()
  DType dtype_ = DType::f32;
};

}  // namespace triax
