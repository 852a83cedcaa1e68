// SwiGLU on the CPU (the Llama MLP's activation): out = silu(gate) * up, silu(g) = g / (1 + e^-g),
// on the fused gate/up projection whose row n is [gate (F) | up (F)].
#pragma once

namespace triax::ops {

template <class Real>
void swiglu_forward(Real* out,      // (N, F)
                    const Real* h,  // (N, 2F) row n = [gate | up]
                    int N, int F);

// dh = [dout * up * silu'(gate) | dout * silu(gate)] (written). dh may not alias h or dout.
template <class Real>
void swiglu_backward(Real* dh,          // (N, 2F)
                     const Real* dout,  // (N, F)
                     const Real* h,     // (N, 2F) the forward input
                     int N, int F);

}  // namespace triax::ops
