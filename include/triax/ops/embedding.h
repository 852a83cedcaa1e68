// Token + learned position embedding on the CPU: out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].
// The token table may be a vocab-parallel shard, rows [v0, v1) of a V-row table: tokens outside
// the shard contribute zeros (the TP model all-reduces the shards' outputs).
#pragma once
#include <cstdint>

namespace triax::ops {

// wpe == nullptr leaves out the position term (add it on one rank only, or after the all-reduce).
// ConfigError naming the position and value for a token outside [0, V), or a bad shard range.
template <class Real>
void embedding_forward(Real* out,              // (B, T, C)
                       const int32_t* tokens,  // (B, T)
                       const Real* wte,        // (v1 - v0, C): rows [v0, v1) of the (V, C) table
                       const Real* wpe,        // (>= T, C) or nullptr
                       int B, int T, int C, int V, int v0, int v1);

// dwte[tok - v0] += dout[b,t] for the tokens in the shard; dwpe[t] += sum over b of dout[b,t].
// Either may be nullptr to skip it. Accumulated in (b, t) order whatever the thread count.
template <class Real>
void embedding_backward(Real* dwte,             // (v1 - v0, C)
                        Real* dwpe,             // (>= T, C)
                        const Real* dout,       // (B, T, C)
                        const int32_t* tokens,  // (B, T)
                        int B, int T, int C, int V, int v0, int v1);

// The whole table (v0 = 0, v1 = V).
template <class Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B, int T, int C, int V) {
  embedding_forward(out, tokens, wte, wpe, B, T, C, V, 0, V);
}
template <class Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B, int T, int C, int V) {
  embedding_backward(dwte, dwpe, dout, tokens, B, T, C, V, 0, V);
}

}  // namespace triax::ops
