// Rotary position embedding on the CPU in HF's rotate-half layout, in place on the query and key
// heads of the fused qkv activation (the value heads are untouched). For token t, a q or k head x
// and i < HD/2, with c = cos[t][i], s = sin[t][i]:
//   (x_i, x_{i+HD/2}) <- (x_i c - x_{i+HD/2} s, x_{i+HD/2} c + x_i s)
// which is HF's x * cos + rotate_half(x) * sin with cos and sin repeated twice along HD.
#pragma once

namespace triax::ops {

// qkv per token: [NH query heads | NKV key heads | NKV value heads] of HD each (NKV = 0 means NH).
// cos and sin: (T, HD/2) for positions 0..T-1 (the caller builds them from the inverse
// frequencies, GptConfig::rope_inv_freq). ConfigError unless HD is even.
template <class Real>
void rope_forward(Real* qkv,        // (B, T, (NH + 2 NKV) HD) rotated in place
                  const Real* cos,  // (T, HD/2)
                  const Real* sin,  // (T, HD/2)
                  int B, int T, int NH, int NKV, int HD);

// The backward: the inverse rotation (sin negated) of the q and k gradients, in place on dqkv.
template <class Real>
void rope_backward(Real* dqkv,       // (B, T, (NH + 2 NKV) HD)
                   const Real* cos,  // (T, HD/2)
                   const Real* sin,  // (T, HD/2)
                   int B, int T, int NH, int NKV, int HD);

}  // namespace triax::ops
