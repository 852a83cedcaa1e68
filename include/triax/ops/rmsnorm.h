// RMSNorm over the last dimension on the CPU (HF LlamaRMSNorm): out = weight * (x * rstd) with
// rstd = 1 / sqrt(mean(x^2) + eps), kept for the backward pass. No mean is subtracted, no bias.
#pragma once
#include "triax/ops/grad_mode.h"

namespace triax::ops {

// The sum of squares and rstd in Real: float for float (as HF computes in fp32), double for double.
template <class Real>
void rmsnorm_forward(Real* out,           // (N, C)
                     Real* rstd,          // (N) 1 / sqrt(mean(x^2) + eps), saved for backward
                     const Real* inp,     // (N, C)
                     const Real* weight,  // (C)
                     int N, int C, double eps);

// dinp (=, or += with GradMode::accumulate: the residual stream already holds the skip term);
// dweight accumulated (+=), or skipped when nullptr.
template <class Real>
void rmsnorm_backward(Real* dinp,          // (N, C)
                      Real* dweight,       // (C)
                      const Real* dout,    // (N, C)
                      const Real* inp,     // (N, C)
                      const Real* weight,  // (C)
                      const Real* rstd,    // (N)
                      int N, int C, GradMode dinp_mode = GradMode::overwrite);

}  // namespace triax::ops
