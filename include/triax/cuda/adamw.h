// Fused AdamW on the GPU (kernels/adamw.cu) with fp32 master weights: the math of
// ops/adamw.h's adamw_update (bias corrections computed once on the host in double), one pass
// reading grad, master, m, v and writing master, m, v and, optionally, the low-precision copy of
// the parameters the forward pass reads. Host launchers; the stream comes last.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"
#include "triax/ops/adamw_config.h"

namespace triax::cuda {

// Element i: g = grad[i] * step.grad_scale (grad_scale folds in clipping and loss unscaling);
// m, v, master as in triax::adamw_update; then copy[i] = round-to-nearest-even(master[i]).
// Grad is float, bf16 or f16; Copy is bf16 or f16 (copy may be nullptr: no copy written).
// ConfigError as adamw_update (bad config, t < 1), for n < 0, or a null pointer with n > 0.
template <class Grad, class Copy>
void adamw_update(float* master,     // (n) fp32 master weights
                  Copy* copy,        // (n) or nullptr
                  const Grad* grad,  // (n)
                  float* m,          // (n)
                  float* v,          // (n)
                  int64_t n, const AdamWConfig& cfg, float weight_decay, const AdamWStep& step,
                  cudaStream_t stream);

// fp32 training: no low-precision copy.
template <class Grad>
void adamw_update(float* master, const Grad* grad, float* m, float* v, int64_t n, const AdamWConfig& cfg,
                  float weight_decay, const AdamWStep& step, cudaStream_t stream) {
  adamw_update<Grad, bf16>(master, nullptr, grad, m, v, n, cfg, weight_decay, step, stream);
}

}  // namespace triax::cuda
