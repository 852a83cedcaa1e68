// The emulated mixed-precision backend: a CPU backend whose compute type is bfloat16 or float16
// (float32 is accepted too: the same checks, no rounding). It holds every buffer in host memory
// and, at every op, checks the CUDA backend's element-type contract (activations and the compute
// copy of the weights in the compute type; statistics -- LayerNorm mean/rstd, attention lse,
// cross-entropy max/sums/target logits/losses -- in float32; parameter gradients, master weights
// and Adam moments in float32), refusing a violation with a ConfigError that names the op and the
// buffer. It computes by widening its half-type inputs to float32, running the plain CPU
// backend's op and rounding half-type outputs back to nearest even, so a bf16/fp16 run's model,
// pipeline and parallel code is exercised on the CPU with the CUDA backend's buffer types.
#pragma once
#include <memory>

#include "triax/backend/backend.h"

namespace triax {

std::unique_ptr<Backend> make_emulated_backend(DType compute);

}  // namespace triax
