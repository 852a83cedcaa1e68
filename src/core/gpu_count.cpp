// cuda_device_count(): compiled in every build (so CPU code may ask), with CUDA only where the
// library was built with it. Never throws: any failure, including a missing driver, means no GPU.
#include "triax/core/gpu_count.h"

#if defined(TRIAX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <fmt/format.h>

namespace triax {

int cuda_device_count(std::string* why) noexcept {
  try {
#if defined(TRIAX_HAVE_CUDA)
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      // Clear the (non-sticky) error so that the next CUDA call of this process does not report it.
      (void)cudaGetLastError();
      if (why) *why = fmt::format("cudaGetDeviceCount failed: {}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
      return 0;
    }
    if (n <= 0) {
      if (why) *why = "cudaGetDeviceCount found no device";
      return 0;
    }
    return n;
#else
    if (why) *why = "triax was built without CUDA (TRIAX_WITH_CUDA=OFF or nvcc/NCCL not found)";
    return 0;
#endif
  } catch (...) {  // fmt or std::string allocation: still "no GPU"
    return 0;
  }
}

}  // namespace triax
