// GELU (GPT-2's tanh form) on the GPU (kernels/gelu.cu), the contract of ops/gelu.h:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Host launchers; the stream comes last.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16 (fp32 arithmetic, tanhf). out may alias inp. ConfigError for n < 0 or a
// null pointer with n > 0.
template <class Real>
void gelu_forward(Real* out,        // (n)
                  const Real* inp,  // (n)
                  int64_t n, cudaStream_t stream);

// dinp = gelu'(inp) * dout (written). dinp may alias dout.
template <class Real>
void gelu_backward(Real* dinp,        // (n)
                   const Real* inp,   // (n) the forward input
                   const Real* dout,  // (n)
                   int64_t n, cudaStream_t stream);

}  // namespace triax::cuda
