// GELU in GPT-2's tanh form on the CPU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include <cstdint>

namespace triax::ops {

// out may alias inp.
template <class Real>
void gelu_forward(Real* out,        // (n)
                  const Real* inp,  // (n)
                  int64_t n);

// dinp = gelu'(inp) * dout (written). dinp may alias dout.
template <class Real>
void gelu_backward(Real* dinp,        // (n)
                   const Real* inp,   // (n) the forward input
                   const Real* dout,  // (n)
                   int64_t n);

}  // namespace triax::ops
