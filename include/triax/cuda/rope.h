// Rotary position embedding on the GPU (kernels/rope.cu), the contract of
// Backend::rope_forward/backward (HF's rotate-half layout): in place on the NH query heads and
// NKV key heads of qkv (B, T, (NH + 2 NKV) * HD), the NKV value heads untouched. For token t,
// head dim pair (i, i + HD/2), i < HD/2, with c = cos[t][i], s = sin[t][i]:
//   forward  (x_i, x_{i+HD/2}) <- (x_i c - x_{i+HD/2} s, x_{i+HD/2} c + x_i s)
//   backward the inverse rotation (s negated), applied to the q and k gradients in dqkv.
// Tables (T, HD/2) fp32; the rotation in fp32, each output rounded once. Host launchers; the
// stream comes last.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16. One thread per (token, head, 4 pairs) when HD/2 is a multiple of 4
// and the pointers are aligned to 4 elements (the tables to 16 bytes), else one per pair.
// ConfigError for a non-positive size, an odd HD or a null pointer.
template <class Real>
void rope_forward(Real* qkv,          // (B, T, (NH + 2 NKV) * HD), in place
                  const float* cos,   // (T, HD/2)
                  const float* sin,   // (T, HD/2)
                  int B, int T, int NH, int NKV, int HD, cudaStream_t stream);

template <class Real>
void rope_backward(Real* dqkv,         // (B, T, (NH + 2 NKV) * HD), in place
                   const float* cos,   // (T, HD/2)
                   const float* sin,   // (T, HD/2)
                   int B, int T, int NH, int NKV, int HD, cudaStream_t stream);

}  // namespace triax::cuda
