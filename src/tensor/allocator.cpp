// The allocator registry and the built-in 64-byte aligned CPU allocator.
#include "triax/tensor/allocator.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>

#include "triax/core/error.h"

namespace triax {
namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, int ordinal) override {
    if (ordinal != 0) TRIAX_THROW(ConfigError, "cpu allocator: ordinal {} requested, the cpu device has only 0", ordinal);
    if (nbytes == 0) return nullptr;
    if (nbytes > std::numeric_limits<size_t>::max() - kCpuAlignment)
      TRIAX_THROW(ConfigError, "cpu allocator: {} bytes is not a size that can be allocated", nbytes);
    // aligned_alloc wants a multiple of the alignment.
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    if (!p) TRIAX_THROW(DeviceError, "cpu allocator: out of memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* p, size_t, int) noexcept override { std::free(p); }
  std::string_view name() const override { return "cpu"; }
};

CpuAllocator g_cpu;
constexpr size_t kKinds = 2;  // DeviceKind::cpu, DeviceKind::cuda
std::array<std::atomic<Allocator*>, kKinds> g_allocators{&g_cpu, nullptr};

size_t slot(DeviceKind kind) {
  const auto i = static_cast<size_t>(kind);
  if (i >= kKinds) TRIAX_THROW(ConfigError, "allocator: unknown device kind {}", i);
  return i;
}

}  // namespace

Allocator& cpu_allocator() { return g_cpu; }

void set_allocator(DeviceKind kind, Allocator* allocator) {
  if (kind == DeviceKind::cpu && allocator == nullptr) allocator = &g_cpu;
  g_allocators[slot(kind)].store(allocator);
}

Allocator& allocator_for(DeviceKind kind) {
  Allocator* a = g_allocators[slot(kind)].load();
  if (!a)
    TRIAX_THROW(ConfigError, "no allocator installed for {} memory: the {} backend is not built or not initialised",
                device_kind_name(kind), device_kind_name(kind));
  return *a;
}

}  // namespace triax
