// CudaBackend: the Backend seam (backend/backend.h) on one CUDA device. Every op is enqueued on
// the backend's compute stream (kernels/ and cuBLASLt); record()/wait() are CUDA events on it;
// buffers come from the stream-ordered allocator (cudaMallocAsync on the device's pool) and are
// freed in the compute stream's order (cudaFreeAsync) when their last Tensor goes: a buffer that
// another stream (an NCCL communicator's) still reads or writes must be ordered first - wait() on
// an event recorded on that stream, or keep the Tensor until the communicator's Work completes.
// The backend must outlive the Tensors it made (as the CPU backend). Launcher scratch comes from
// an arena bound to the compute stream (cuda/scratch.h), so no op allocates after warm-up. It lives
// in the cuda layer, above backend/ (scripts/check_layers.py): the seam stays free of CUDA.
// This header includes no CUDA header, so host code of any layer above may name it. CUDA builds
// only (TRIAX_HAVE_CUDA); docs/CUDA.md describes the backend as it is.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "triax/backend/backend.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

struct CudaBackendOptions {
  int device = 0;                // CUDA ordinal (the rank's local rank under a launcher)
  DType compute = DType::f32;    // activations and the compute copy of the weights: f32, bf16 or f16
  // Bytes the device's memory pool keeps reserved when freed (cudaMemPoolAttrReleaseThreshold):
  // the default keeps everything, so the steady state allocates nothing from the driver.
  uint64_t pool_release_threshold = std::numeric_limits<uint64_t>::max();
};

// Throws DeviceError naming CUDA, the ordinal and the device count it saw when the device cannot
// be used (no driver, no GPU, bad ordinal); ConfigError for an unsupported compute type.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts = {});

// The compute stream of a backend made by make_cuda_backend (NCCL communicators order their
// calls after it); nullptr for any other backend.
cudaStream_t compute_stream(const Backend& be);

// The high-water mark of the device memory pool a cuda backend allocates from
// (cudaMemPoolAttrUsedMemHigh: buffers and launcher scratch), reset by reset_peak(); 0 for any
// other backend. bytes_in_use()/peak_bytes() count the backend's own buffers only.
uint64_t pool_used_high(const Backend& be);

}  // namespace triax::cuda
