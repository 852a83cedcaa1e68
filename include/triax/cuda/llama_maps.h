// The index arithmetic (and the fp32 element math) of kernels/swiglu.cu and kernels/rope.cu,
// written once as __host__ __device__ functions so the unit test tests/unit/cuda/
// test_llama_maps_host.cpp can run each kernel's loops as a host emulation on odd sizes, without
// a GPU. No CUDA header here.
#pragma once
#include <cstdint>

#include "triax/ops/shared_math.h"

namespace triax::cuda::llama_map {

// SwiGLU: element i of the (N, F) side (out, dout) sits in row i / F at column i % F; its gate is
// h[swiglu_gate(i, F)] and its up h[swiglu_gate(i, F) + F] in h (N, 2F) = [gate | up] rows.
TRIAX_HD_INLINE int64_t swiglu_gate(int64_t i, int64_t F) { return (i / F) * 2 * F + i % F; }
// The same for a vector of W elements (F % W == 0, so a vector never crosses a row): vector v of
// the (N, F) side, as a vector index of h; up is that + F / W.
TRIAX_HD_INLINE int64_t swiglu_gate_vector(int64_t v, int64_t W, int64_t F) { return swiglu_gate(v * W, F) / W; }

// silu(g) = g s and silu'(g) = s (1 + g (1 - s)), s = 1 / (1 + e), e = exp(-g) (the caller's exp).
TRIAX_HD_INLINE float sigmoid_from_exp(float e) { return 1.0f / (1.0f + e); }
TRIAX_HD_INLINE float silu_grad_from_sigmoid(float g, float s) { return s * (1.0f + g * (1.0f - s)); }

// RoPE: rotation pair p of n = B*T*heads*half, heads = NH + NKV (the q heads, then the k heads,
// which are contiguous at the start of a token's row of row = (NH + 2 NKV) * HD elements). Pair p
// rotates qkv[x] with qkv[x + half] by table entry tab of (T, half) tables.
struct RopePairs {
  int64_t half, heads, T, row;
};
TRIAX_HD_INLINE void rope_pair(const RopePairs& r, int64_t p, int64_t& x, int64_t& tab) {
  const int64_t i = p % r.half;
  const int64_t head = (p / r.half) % r.heads;
  const int64_t token = p / (r.half * r.heads);
  x = token * r.row + head * 2 * r.half + i;
  tab = (token % r.T) * r.half + i;
}
// (a, b) <- (a c - b s, b c + a s) in fp32; s is negated for the backward (inverse) rotation.
TRIAX_HD_INLINE void rope_rotate(float& a, float& b, float c, float s) {
  const float a0 = a, b0 = b;
  a = a0 * c - b0 * s;
  b = b0 * c + a0 * s;
}

}  // namespace triax::cuda::llama_map
