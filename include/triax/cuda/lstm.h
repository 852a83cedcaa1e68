// The LSTM cell on the GPU (kernels/lstm.cu), the contract of Backend::lstm_cell_forward/backward:
// gates (B, 4H) ordered i, f, g, o as PyTorch's nn.LSTM; fp32 arithmetic, rounded once per output.
// Host launchers; the stream comes last. ConfigError for a non-positive size or a null pointer.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16. One thread per (row, unit), grid-stride. gates: pre-activations in,
// activations out; c = f * c_prev + i * g; h = o * tanh(c). c_prev may alias c.
template <class Real>
void lstm_cell_forward(Real* h, Real* c, Real* gates, const Real* c_prev, int B, int H, cudaStream_t stream);

// dc: in, the gradient carried into c; out, the gradient of c_prev. dgates written.
template <class Real>
void lstm_cell_backward(Real* dgates, Real* dc, const Real* dh, const Real* gates, const Real* c, const Real* c_prev,
                        int B, int H, cudaStream_t stream);

}  // namespace triax::cuda
