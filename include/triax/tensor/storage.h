// A block of memory on one device that tensors share (through std::shared_ptr<Storage>): either
// owned (from the device's Allocator, freed when the last tensor lets go) or borrowed (external
// memory, e.g. a mapped file or a buffer owned by the caller, never freed here).
#pragma once
#include <cstddef>

#include "triax/core/device.h"
#include "triax/tensor/allocator.h"

namespace triax {

class Storage {
 public:
  // Owned: nbytes from allocator_for(device.kind).
  Storage(size_t nbytes, Device device);
  // Owned: nbytes from the given allocator (a Backend's own), which must outlive this storage.
  Storage(size_t nbytes, Device device, Allocator& allocator);
  // Borrowed: the caller keeps p alive (and valid for nbytes) while any tensor uses it.
  Storage(void* p, size_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool owned() const { return allocator_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;  // null when borrowed
};

}  // namespace triax
