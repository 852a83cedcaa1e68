// Checks for CUDA runtime, NCCL and cuBLAS(Lt) return codes: TRIAX_CHECK_CUDA(expr),
// TRIAX_CHECK_NCCL(expr), TRIAX_CHECK_CUBLAS(expr) throw triax::DeviceError naming the
// expression, file:line, the code and its error string. CUDA builds only (TRIAX_HAVE_CUDA).
#pragma once

// No CUDA, NCCL or cuBLAS header here: the macros compare the returned enum with 0 (the success
// value of all three libraries) and hand the code to out-of-line functions that look up the
// string. So this header costs nothing to include and compiles under nvcc and g++ alike.
namespace triax::detail {
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_nccl_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(int code, const char* expr, const char* file, int line);
}  // namespace triax::detail

#define TRIAX_DETAIL_CHECK(thrower, expr)                                                  \
  do {                                                                                     \
    const auto triax_status_ = (expr);                                                     \
    if (static_cast<int>(triax_status_) != 0)                                              \
      ::triax::detail::thrower(static_cast<int>(triax_status_), #expr, __FILE__, __LINE__); \
  } while (0)

// cudaError_t != cudaSuccess -> DeviceError "CUDA error 2 (cudaErrorMemoryAllocation: out of memory) ..."
#define TRIAX_CHECK_CUDA(expr) TRIAX_DETAIL_CHECK(throw_cuda_error, expr)
// ncclResult_t != ncclSuccess -> DeviceError with ncclGetErrorString and ncclGetLastError.
// ncclInProgress counts as an error: use it for blocking calls; nonblocking communicators poll
// ncclCommGetAsyncError instead (see src/distributed/comm/nccl_comm.cpp).
#define TRIAX_CHECK_NCCL(expr) TRIAX_DETAIL_CHECK(throw_nccl_error, expr)
// cublasStatus_t != CUBLAS_STATUS_SUCCESS -> DeviceError with cublasGetStatusName/String.
#define TRIAX_CHECK_CUBLAS(expr) TRIAX_DETAIL_CHECK(throw_cublas_error, expr)
