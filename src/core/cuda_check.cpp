// The out-of-line halves of TRIAX_CHECK_{CUDA,NCCL,CUBLAS}: turn a failed code into a
// DeviceError whose message names the expression, where it was, the code and what it means.
#include "triax/core/cuda_check.h"

#include <cublas_api.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "triax/core/error.h"

namespace triax::detail {
namespace {
// "on device 3" when the current device can be read (it cannot after some fatal errors).
std::string device_suffix() {
  int dev = -1;
  if (cudaGetDevice(&dev) != cudaSuccess) return {};
  return fmt::format(" on device {}", dev);
}
}  // namespace

void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(code);
  TRIAX_THROW(DeviceError, "CUDA error {} ({}: {}) in `{}` at {}:{}{}", code, cudaGetErrorName(e),
              cudaGetErrorString(e), expr, file, line, device_suffix());
}

void throw_nccl_error(int code, const char* expr, const char* file, int line) {
  const auto r = static_cast<ncclResult_t>(code);
  const char* last = ncclGetLastError(nullptr);
  TRIAX_THROW(DeviceError, "NCCL error {} ({}) in `{}` at {}:{}{}{}{}", code, ncclGetErrorString(r), expr, file, line,
              device_suffix(), last && *last ? ": " : "", last ? last : "");
}

void throw_cublas_error(int code, const char* expr, const char* file, int line) {
  const auto s = static_cast<cublasStatus_t>(code);
  TRIAX_THROW(DeviceError, "cuBLAS error {} ({}: {}) in `{}` at {}:{}{}", code, cublasGetStatusName(s),
              cublasGetStatusString(s), expr, file, line, device_suffix());
}

}  // namespace triax::detail
