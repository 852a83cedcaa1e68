// Whether a GEMM operand is used as stored or transposed: a dependency-free small type that the
// CPU GEMM (ops/gemm.h) and the CUDA one (cuda/gemm.h) share, as ops/grad_mode.h is for gradients.
#pragma once
#include <cstdint>

namespace triax::ops {

enum class Trans : uint8_t { no, yes };

}  // namespace triax::ops
