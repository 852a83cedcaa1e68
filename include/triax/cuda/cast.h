// Element type conversions on the GPU (kernels/cast.cu): fp32 <-> bf16 and fp32 <-> fp16 with
// round-to-nearest-even, bit-identical to triax::bf16(float) and triax::f16(float) in dtype.h
// except for NaN payloads (the device writes the canonical NaN).
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// (To, From) in {(bf16, float), (f16, float), (float, bf16), (float, f16)}. out must not
// partially overlap in. ConfigError for n < 0 or a null pointer with n > 0.
template <class To, class From>
void cast(To* out, const From* in, int64_t n, cudaStream_t stream);  // both (n)

}  // namespace triax::cuda
