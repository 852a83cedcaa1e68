// LayerNorm over the last dimension on the CPU (eps 1e-5, biased variance, as torch and GPT-2):
// out = (x - mean) * rstd * weight + bias, with mean and rstd kept for the backward pass.
#pragma once
#include "triax/ops/grad_mode.h"

namespace triax::ops {

inline constexpr double kLayerNormEps = 1e-5;

template <class Real>
void layernorm_forward(Real* out,           // (N, C)
                       Real* mean,          // (N) saved for backward
                       Real* rstd,          // (N) 1 / sqrt(var + eps), saved for backward
                       const Real* inp,     // (N, C)
                       const Real* weight,  // (C)
                       const Real* bias,    // (C)
                       int N, int C);

// dinp (=, or += with GradMode::accumulate: the residual stream already holds the skip term);
// dweight and dbias accumulated (+=). dweight and dbias may be nullptr to skip them.
template <class Real>
void layernorm_backward(Real* dinp,          // (N, C)
                        Real* dweight,       // (C)
                        Real* dbias,         // (C)
                        const Real* dout,    // (N, C)
                        const Real* inp,     // (N, C)
                        const Real* weight,  // (C)
                        const Real* mean,    // (N)
                        const Real* rstd,    // (N)
                        int N, int C, GradMode dinp_mode = GradMode::overwrite);

}  // namespace triax::ops
