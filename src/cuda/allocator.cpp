// The CUDA tensor allocator: cudaMalloc/cudaFree on the storage's device ordinal, with the
// caller's current device restored afterwards (allocation must not change global state).
#include "triax/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <string>

#include "triax/core/error.h"
#include "triax/core/gpu_count.h"

namespace triax::cuda {
namespace {

// Makes `ordinal` current for its lifetime. DeviceError (naming how many devices there are, and
// why there are none) when it cannot.
class DeviceScope {
 public:
  DeviceScope(int ordinal, const char* what, size_t nbytes) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    const cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      std::string why;
      const int n = cuda_device_count(&why);
      TRIAX_THROW(DeviceError, "cuda allocator: cannot {} {} bytes on cuda:{}: {} ({} device(s) visible{}{})", what,
                  nbytes, ordinal, cudaGetErrorString(e), n, n ? "" : ": ", n ? "" : why);
    }
  }
  ~DeviceScope() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = -1;
};

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, int ordinal) override {
    if (ordinal < 0) TRIAX_THROW(ConfigError, "cuda allocator: negative device ordinal {}", ordinal);
    if (nbytes == 0) return nullptr;
    DeviceScope scope(ordinal, "allocate", nbytes);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, nbytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // out of memory is not sticky: clear it for the caller
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      TRIAX_THROW(DeviceError, "cuda allocator: cudaMalloc of {} bytes on cuda:{} failed: {} ({} of {} bytes free)",
                  nbytes, ordinal, cudaGetErrorString(e), free_b, total_b);
    }
    return p;
  }
  void deallocate(void* p, size_t, int ordinal) noexcept override {
    if (!p) return;
    int prev = -1;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    (void)cudaSetDevice(ordinal);
    (void)cudaFree(p);
    if (have_prev) (void)cudaSetDevice(prev);
  }
  std::string_view name() const override { return "cuda"; }
};

CudaAllocator g_cuda;

}  // namespace

Allocator& cuda_allocator() { return g_cuda; }

void install_cuda_allocator() { set_allocator(DeviceKind::cuda, &g_cuda); }

}  // namespace triax::cuda
