// LayerNorm over the last dimension on the GPU (kernels/layernorm.cu), the contract of
// ops/layernorm.h (biased two-pass variance, eps passed by the caller: GPT-2 uses 1e-5): out = (x - mean) * rstd * weight + bias.
// mean and rstd are fp32 whatever the activation type. Host launchers; the stream comes last.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"
#include "triax/ops/grad_mode.h"

namespace triax::cuda {

// Real is float, bf16 or f16 (statistics and arithmetic in fp32). One block per row.
// ConfigError for a non-positive size or eps, or a null pointer.
template <class Real>
void layernorm_forward(Real* out,           // (N, C)
                       float* mean,         // (N) saved for backward
                       float* rstd,         // (N) 1 / sqrt(var + eps)
                       const Real* inp,     // (N, C)
                       const Real* weight,  // (C)
                       const Real* bias,    // (C)
                       int N, int C, float eps, cudaStream_t stream);

// dinp (=, or += with GradMode::accumulate) in Real; dweight and dbias are parameter gradients,
// so fp32 whatever Real is (docs/CUDA.md, "Gradient types"), accumulated (+=), either may be
// nullptr. The weight and bias sums are deterministic without atomics: fixed chunks of rows give
// fp32 partial sums (rows in order), then one thread per column adds the chunks in order onto the
// old fp32 value (no rounding to Real anywhere on the way).
// Scratch for the partials comes from cudaMallocAsync on the stream.
template <class Real>
void layernorm_backward(Real* dinp,          // (N, C)
                        float* dweight,      // (C) fp32, +=
                        float* dbias,        // (C) fp32, +=
                        const Real* dout,    // (N, C)
                        const Real* inp,     // (N, C)
                        const Real* weight,  // (C)
                        const float* mean,   // (N)
                        const float* rstd,   // (N)
                        int N, int C, ops::GradMode dinp_mode, cudaStream_t stream);

}  // namespace triax::cuda
