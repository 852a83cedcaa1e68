// The residual connection on the CPU: out = a + b, and its backward (the gradient reaches both).
#pragma once
#include <cstdint>

namespace triax::ops {

// out may alias a or b.
template <class Real>
void residual_forward(Real* out, const Real* a, const Real* b, int64_t n);  // all (n)

// da += dout and db += dout (accumulated: each branch may already hold a gradient). Either may be
// nullptr; neither may alias dout.
template <class Real>
void residual_backward(Real* da, Real* db, const Real* dout, int64_t n);  // all (n)

}  // namespace triax::ops
