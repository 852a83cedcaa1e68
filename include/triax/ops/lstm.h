// The LSTM cell on the CPU (Backend::lstm_cell_forward/backward, forecast/lstm.h): PyTorch's
// nn.LSTM gates in the order i, f, g, o, element-wise per (row, unit); the GEMMs around it are
// the backend's linear ops.
#pragma once

namespace triax::ops {

// gates (B, 4H): pre-activations in, activations [sigmoid(i) | sigmoid(f) | tanh(g) | sigmoid(o)]
// out; c = f * c_prev + i * g; h = o * tanh(c). c_prev may alias c.
template <class Real>
void lstm_cell_forward(Real* h, Real* c, Real* gates, const Real* c_prev, int B, int H);

// dc: in, the gradient carried into c from the next step; out, the gradient of c_prev.
// dgates (B, 4H) written: the gradient of the pre-activations.
template <class Real>
void lstm_cell_backward(Real* dgates, Real* dc, const Real* dh, const Real* gates, const Real* c, const Real* c_prev,
                        int B, int H);

}  // namespace triax::ops
