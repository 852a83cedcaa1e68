// Sum of squares on the GPU (kernels/grad_norm.cu), the building block of the global gradient
// norm (optim/grad_norm.h): per-rank sums over the owned gradients, then one all-reduce.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// acc[0] += sum over i of x[i]^2, in double (like local_grad_sumsq). x is float, bf16 or f16;
// acc is a device double the caller initialises (cudaMemsetAsync to 0 for a fresh sum) so several
// tensors add into one value. NaN/inf propagate. Deterministic: a fixed two-pass reduction (at
// most kSumsqBlocks block partials in a fixed tree order, then one block adds them in order), so
// the bits depend only on n, never on timing. Scratch from cudaMallocAsync on the stream.
inline constexpr int kSumsqBlocks = 1024;

template <class Real>
void sumsq_accumulate(double* acc,    // (1) device
                      const Real* x,  // (n)
                      int64_t n, cudaStream_t stream);

}  // namespace triax::cuda
