// AdamW on flat spans: one fused, memory-bound pass over (param, grad, m, v) with decoupled
// weight decay and bias correction, the only AdamW of the CPU side (the CPU backend's adamw op,
// and the float64 reference of the CUDA kernel's test). The same kernel serves a whole
// ParamStore (one call per parameter) and a ZeRO-1 shard (one call per shard segment), so both
// paths give identical bits.
#pragma once
#include <cstdint>
#include <span>

#include "triax/core/error.h"
#include "triax/ops/adamw_config.h"

namespace triax {

// One fused pass, element i:
//   g    = grad[i] * grad_scale
//   m    = beta1 m + (1 - beta1) g
//   v    = beta2 v + (1 - beta2) g^2
//   p   -= lr * ( (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p )
// weight_decay is the value for this span (the config's, or 0 for parameters without decay).
// All four spans have the same length; ConfigError otherwise, or for t < 1 or a negative lr.
// float: fp32 master weights (training). double: the same update in float64 (the float64 CPU
// backend of the gradient checks, and references in tests), hyper-parameters widened from float.
void adamw_update(std::span<float> param, std::span<const float> grad, std::span<float> m, std::span<float> v,
                  const AdamWConfig& cfg, float weight_decay, const AdamWStep& step);
void adamw_update(std::span<double> param, std::span<const double> grad, std::span<double> m, std::span<double> v,
                  const AdamWConfig& cfg, float weight_decay, const AdamWStep& step);

}  // namespace triax
