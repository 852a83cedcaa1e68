// Storage: owned blocks come from the device's allocator and go back to the same one.
#include "triax/tensor/storage.h"

#include "triax/core/error.h"

namespace triax {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cpu() && device.index != 0)
    TRIAX_THROW(ConfigError, "storage: device {} does not exist (the cpu device is cpu:0)", device.str());
  if (device.index < 0) TRIAX_THROW(ConfigError, "storage: negative device ordinal {}", device.index);
  Allocator& a = allocator_for(device.kind);
  data_ = a.allocate(nbytes, device.index);
  allocator_ = &a;
}

Storage::Storage(size_t nbytes, Device device, Allocator& a) : nbytes_(nbytes), device_(device) {
  data_ = a.allocate(nbytes, device.index);
  allocator_ = &a;
}

Storage::Storage(void* p, size_t nbytes, Device device) : data_(p), nbytes_(nbytes), device_(device) {
  if (!p && nbytes > 0) TRIAX_THROW(ConfigError, "storage: null pointer borrowed for {} bytes on {}", nbytes, device.str());
}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, nbytes_, device_.index);
}

}  // namespace triax
