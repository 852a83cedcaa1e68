// The process-wide CUDA Allocator for tensor storage made outside a backend (tensor/allocator.h):
// plain cudaMalloc/cudaFree on the tensor's device ordinal, so it is safe with any stream but
// cudaFree synchronises the device - for tests and tools, not the training step. The CUDA backend
// does not use it: its buffers come from the stream-ordered pool (cuda/cuda_backend.h).
// install_cuda_allocator() registers it for DeviceKind::cuda, after which
// Tensor::empty(shape, dtype, Device::cuda(i)) works. CUDA builds only (TRIAX_HAVE_CUDA).
#pragma once
#include "triax/tensor/allocator.h"

namespace triax::cuda {

// The process-wide CUDA allocator. allocate(n, ordinal) switches to device `ordinal` for the call
// (restoring the caller's current device), returns nullptr for 0 bytes, and throws DeviceError
// naming the device, the size and CUDA's reason on failure (no device, bad ordinal, out of
// memory). deallocate frees on the same device and never throws.
Allocator& cuda_allocator();

// set_allocator(DeviceKind::cuda, &cuda_allocator()). Idempotent.
void install_cuda_allocator();

}  // namespace triax::cuda
