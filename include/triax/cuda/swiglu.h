// SwiGLU on the GPU (kernels/swiglu.cu), the contract of Backend::swiglu_forward/backward: the
// fused gate/up projection h (N, 2F) holds row n = [gate (F) | up (F)];
// out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)). fp32 arithmetic, rounded once.
// Host launchers; the stream comes last.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16. Element-wise, grid-stride, 16-byte loads and stores when F is a
// multiple of the vector width and the pointers are 16-byte aligned (else one element at a
// time). ConfigError for a non-positive size or a null pointer. out may not alias h.
template <class Real>
void swiglu_forward(Real* out,      // (N, F)
                    const Real* h,  // (N, 2F)
                    int N, int F, cudaStream_t stream);

// dh (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)], written in full;
// silu'(g) = s (1 + g (1 - s)), s = 1 / (1 + exp(-g)). dh may not alias h or dout.
template <class Real>
void swiglu_backward(Real* dh,          // (N, 2F)
                     const Real* dout,  // (N, F)
                     const Real* h,     // (N, 2F) the forward input
                     int N, int F, cudaStream_t stream);

}  // namespace triax::cuda
