// AdamW on the CPU: Adam with bias correction and decoupled weight decay (Loshchilov & Hutter),
// one fused, memory-bound pass over params, grads and the two moment buffers.
#pragma once
#include <cstdint>

namespace triax::ops {

struct AdamWConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled: lr * weight_decay * param, not added to the gradient
};

// With g = grad_scale * grads[i] (grad_scale carries gradient clipping or loss unscaling):
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   param -= lr * ( (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * param )
// step counts from 1. ConfigError for step < 1, lr or weight_decay < 0, a beta outside [0, 1),
// eps <= 0.
template <class Real>
void adamw_step(Real* params,       // (n)
                Real* m,            // (n) first moment, zero before step 1
                Real* v,            // (n) second moment, zero before step 1
                const Real* grads,  // (n)
                int64_t n, const AdamWConfig& cfg, int64_t step, Real grad_scale = Real(1));

}  // namespace triax::ops
