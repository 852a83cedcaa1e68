// The residual connection on the GPU (kernels/residual.cu), the contract of ops/residual.h:
// out = a + b, and its backward (the gradient reaches both branches, accumulated).
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16. out may alias a or b.
template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n, cudaStream_t stream);  // all (n)

// da += dout and db += dout; either may be nullptr; neither may alias dout (ConfigError).
template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t n, cudaStream_t stream);  // all (n)

}  // namespace triax::cuda
