// Tensor views and the CPU strided copy.
#include "triax/tensor/tensor.h"

#include <cstring>

namespace triax {

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = shape.contiguous_strides();
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  if (!device.is_cpu())
    TRIAX_THROW(ConfigError, "Tensor::zeros on {}: only cpu tensors can be filled here (device fills are the CUDA backend's)",
                device.str());
  Tensor t = empty(shape, dtype, device);
  if (t.nbytes()) std::memset(t.storage_->data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::on_storage(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype) {
  if (!storage || storage->nbytes() < static_cast<size_t>(shape.numel()) * dtype_size(dtype))
    TRIAX_THROW(ConfigError, "tensor on a storage of {} bytes: {} elements of {} do not fit",
                storage ? storage->nbytes() : 0, shape.numel(), dtype_name(dtype));
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.strides_ = shape.contiguous_strides();
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = shape.contiguous_strides();
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::stride(int d) const {
  shape_.at(d);
  return strides_[d];
}

bool Tensor::is_contiguous() const {
  const auto want = shape_.contiguous_strides();
  for (int d = 0; d < shape_.ndim(); ++d)
    if (shape_[d] > 1 && strides_[d] != want[d]) return false;
  return true;
}

void Tensor::check_access(DType want) const {
  if (!storage_) TRIAX_THROW(ConfigError, "data<{}>() on an undefined tensor", dtype_name(want));
  if (want != dtype_)
    TRIAX_THROW(ConfigError, "data<{}>() on a {} tensor of shape {}: dtype mismatch", dtype_name(want), dtype_name(dtype_),
                shape_.str());
  if (!is_contiguous())
    TRIAX_THROW(ConfigError, "data<{}>() on a strided view of shape {}: ops need a contiguous tensor (call contiguous())",
                dtype_name(want), shape_.str());
}

void* Tensor::raw_data() const {
  if (!storage_) TRIAX_THROW(ConfigError, "raw_data() on an undefined tensor");
  return static_cast<std::byte*>(storage_->data()) + static_cast<size_t>(offset_) * element_size();
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  if (ndim() == 0) TRIAX_THROW(ConfigError, "slice [{}, {}) of a 0-d tensor", begin, end);
  return narrow(0, begin, end - begin);
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  if (!storage_) TRIAX_THROW(ConfigError, "narrow of an undefined tensor");
  const int64_t n = shape_.at(dim);
  if (length <= 0 || start < 0 || start + length > n)
    TRIAX_THROW(ConfigError, "narrow of dimension {} to [{}, {}) is empty or outside [0, {}) of shape {}", dim, start,
                start + length, n, shape_.str());
  Tensor t = *this;
  t.shape_ = shape_.with(dim, length);
  t.offset_ = offset_ + start * strides_[dim];
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (!storage_) TRIAX_THROW(ConfigError, "reshape of an undefined tensor");
  if (!is_contiguous())
    TRIAX_THROW(ConfigError, "reshape of a strided view {} to {}: only contiguous tensors can be reshaped (call contiguous())",
                shape_.str(), shape.str());
  if (shape.numel() != numel())
    TRIAX_THROW(ConfigError, "reshape {} ({} elements) to {} ({} elements): element counts differ", shape_.str(), numel(),
                shape.str(), shape.numel());
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = shape.contiguous_strides();
  return t;
}

Tensor Tensor::clone() const {
  if (!storage_) TRIAX_THROW(ConfigError, "clone of an undefined tensor");
  if (!device().is_cpu()) TRIAX_THROW(ConfigError, "clone of a {} tensor: only cpu tensors are copied here", device().str());
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

void Tensor::copy_from(const Tensor& src) {
  if (!storage_ || !src.storage_) TRIAX_THROW(ConfigError, "copy_from with an undefined tensor");
  if (!device().is_cpu() || !src.device().is_cpu())
    TRIAX_THROW(ConfigError, "copy_from {} to {}: only cpu-to-cpu copies are done here", src.device().str(), device().str());
  if (src.dtype_ != dtype_ || !(src.shape_ == shape_))
    TRIAX_THROW(ConfigError, "copy_from a {} {} into a {} {}: dtype and shape must match", dtype_name(src.dtype_),
                src.shape_.str(), dtype_name(dtype_), shape_.str());
  const int64_t total = numel();
  if (total == 0) return;
  const size_t es = element_size();
  auto* dst = static_cast<std::byte*>(raw_data());
  const auto* from = static_cast<const std::byte*>(src.raw_data());
  const int nd = ndim();
  if (nd == 0 || (is_contiguous() && src.is_contiguous())) {
    std::memmove(dst, from, static_cast<size_t>(total) * es);
    return;
  }
  // Views never change the last dimension's unit stride (there is no transpose), so the copy goes
  // one dense run of the last dimension at a time, walking the outer indices in row-major order.
  const int64_t inner = shape_[nd - 1];
  std::array<int64_t, Shape::kMaxDims> idx{};
  for (int64_t done = 0; done < total; done += inner) {
    int64_t od = 0, os = 0;
    for (int d = 0; d < nd - 1; ++d) {
      od += idx[d] * strides_[d];
      os += idx[d] * src.strides_[d];
    }
    std::memmove(dst + od * es, from + os * es, static_cast<size_t>(inner) * es);
    for (int d = nd - 2; d >= 0; --d) {  // odometer increment of the outer dimensions
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
}

std::string Tensor::str() const {
  if (!storage_) return "Tensor(undefined)";
  return fmt::format("Tensor({}, {}, {})", dtype_name(dtype_), shape_.str(), device().str());
}

}  // namespace triax
