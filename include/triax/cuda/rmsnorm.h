// RMSNorm over the last dimension on the GPU (kernels/rmsnorm.cu), the contract of
// Backend::rmsnorm_forward/backward (HF's LlamaRMSNorm): out = weight * (x * rstd),
// rstd = 1 / sqrt(mean(x^2) + eps). The sum of squares, rstd and every product are fp32 whatever
// the activation type; the output is rounded once. Host launchers; the stream comes last.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"
#include "triax/ops/grad_mode.h"

namespace triax::cuda {

// Real is float, bf16 or f16. One block per row. ConfigError for a non-positive size or eps, or a
// null pointer.
template <class Real>
void rmsnorm_forward(Real* out,           // (N, C)
                     float* rstd,         // (N) saved for backward
                     const Real* inp,     // (N, C)
                     const Real* weight,  // (C)
                     int N, int C, float eps, cudaStream_t stream);

// dinp = rstd * (g - x * rstd^2 * mean(g * x)), g = dout * weight: written (overwrite) or added
// (GradMode::accumulate) in Real; dinp may not alias dout or inp. dweight (C) is a parameter
// gradient, fp32 whatever Real is, += sum over rows of dout * x * rstd, deterministic without
// atomics (fixed row chunks, then the chunks added in order, as layernorm_backward); nullptr
// skips it. Scratch for the partials from the stream's arena (cuda/scratch.h).
template <class Real>
void rmsnorm_backward(Real* dinp,          // (N, C)
                      float* dweight,      // (C) fp32, +=
                      const Real* dout,    // (N, C)
                      const Real* inp,     // (N, C)
                      const Real* weight,  // (C)
                      const float* rstd,   // (N) from rmsnorm_forward
                      int N, int C, ops::GradMode dinp_mode, cudaStream_t stream);

}  // namespace triax::cuda
