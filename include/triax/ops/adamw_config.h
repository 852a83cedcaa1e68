// The AdamW hyper-parameters and per-step scalars: small types shared by the CPU implementation
// (ops/adamw.h), the Backend seam (backend/backend.h) and the CUDA kernels (cuda/adamw.h).
#pragma once
#include <cstdint>

namespace triax {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  // Decoupled decay coefficient; applied only to parameters whose ParamSpec::weight_decay is set.
  float weight_decay = 0.1f;
};

// Throws ConfigError unless 0 <= beta < 1, eps > 0 and weight_decay >= 0 (all finite).
void validate(const AdamWConfig& cfg);

// Per-step scalars shared by every call of one optimizer step.
struct AdamWStep {
  float lr = 0.0f;
  int64_t t = 1;             // 1-based count of applied steps (bias correction uses beta^t)
  float grad_scale = 1.0f;   // multiplies every gradient first (the clip coefficient)
};

}  // namespace triax
