// Gradient scaling for mixed precision on the GPU (kernels/grad_scale.cu): multiply in place and
// detect inf/NaN in one pass. Unscaling fp16 gradients by 1/scale before the optimizer (or
// scaling anything by a factor) is this one kernel; the loss scale itself enters through dloss.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// x[i] = round(x[i] * factor) in x's type; *found_nonfinite = 1 (the caller zeroes it first) when
// any element was inf/NaN before or after the multiplication (an fp16 overflow to inf counts).
// found_nonfinite may be nullptr (just scale). Real is float, bf16 or f16. The flag is an int on
// the device, ready to be all-reduced (MAX) over the model-parallel and DP groups so that every
// rank skips together. ConfigError for n < 0 or a null x with n > 0.
template <class Real>
void scale_and_check(Real* x, int64_t n, float factor, int* found_nonfinite, cudaStream_t stream);

}  // namespace triax::cuda
