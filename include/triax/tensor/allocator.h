// How tensor memory is obtained: one Allocator per device kind, looked up when a Storage is made.
// The CPU allocator (64-byte aligned, for AVX-512 loads and no false sharing) is built in; the CUDA
// backend installs its own with set_allocator(DeviceKind::cuda, ...) when it initialises.
#pragma once
#include <cstddef>
#include <string_view>

#include "triax/core/device.h"

namespace triax {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // nbytes may be 0 (a valid, possibly null pointer comes back). Throws on failure
  // (ConfigError for a bad request, DeviceError when the device is out of memory).
  virtual void* allocate(size_t nbytes, int ordinal) = 0;
  // Gives back what allocate(nbytes, ordinal) returned. Must not throw.
  virtual void deallocate(void* p, size_t nbytes, int ordinal) noexcept = 0;
  virtual std::string_view name() const = 0;
};

// The alignment of every CPU allocation, in bytes.
inline constexpr size_t kCpuAlignment = 64;

// The built-in CPU allocator (aligned to kCpuAlignment).
Allocator& cpu_allocator();

// Installs the allocator for one device kind; nullptr removes it (for cpu: restores the built-in
// one). The allocator must outlive every Storage made from it. Not thread-safe against concurrent
// allocation: call it at start-up.
void set_allocator(DeviceKind kind, Allocator* allocator);

// The allocator installed for a kind; ConfigError naming the kind when there is none (a CUDA
// tensor in a build or process where the CUDA backend is not initialised).
Allocator& allocator_for(DeviceKind kind);

}  // namespace triax
