// The fully connected layer on the CPU: out = inp @ W^T + b, with W stored (out_features,
// in_features) as torch and Megatron do (HF GPT-2's Conv1D stores the transpose; the loader
// transposes). Both passes are GEMMs (gemm.h); the bias pass is a fixed-order column sum.
#pragma once
#include "triax/ops/grad_mode.h"

namespace triax::ops {

// out = inp @ weight^T + bias. bias may be nullptr (no bias).
template <class Real>
void linear_forward(Real* out,           // (N, OC)
                    const Real* inp,     // (N, IC)
                    const Real* weight,  // (OC, IC)
                    const Real* bias,    // (OC) or nullptr
                    int N, int IC, int OC);

// dinp (=, or += with GradMode::accumulate) = dout @ weight; dweight += dout^T @ inp;
// dbias += sum over rows of dout. Any of dinp, dweight, dbias may be nullptr to skip it.
template <class Real>
void linear_backward(Real* dinp,          // (N, IC)
                     Real* dweight,       // (OC, IC)
                     Real* dbias,         // (OC)
                     const Real* dout,    // (N, OC)
                     const Real* inp,     // (N, IC)
                     const Real* weight,  // (OC, IC)
                     int N, int IC, int OC, GradMode dinp_mode = GradMode::overwrite);

}  // namespace triax::ops
