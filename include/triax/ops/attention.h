// Causal multi-head self-attention on the CPU, flash-style: the (T, T) score matrix is never kept.
// Forward saves one log-sum-exp per query row; backward recomputes the probabilities from it.
// Query blocks of kAttentionBlock rows run as GEMMs (gemm.h) against the keys they may see.
#pragma once

namespace triax::ops {

inline constexpr int kAttentionBlock = 64;  // query rows per block

// qkv holds, per token, [q | k | v], each C = NH * hs wide with head h in channels
// [h*hs, (h+1)*hs) of its part; a TP shard passes its local C = C_full/tp and NH = NH_full/tp
// with its heads' columns of the QKV projection. Scores are q.k / sqrt(hs), causal (key <= query).
// ConfigError unless NH divides C.
template <class Real>
void attention_forward(Real* out,        // (B, T, C) head h in channels [h*hs, (h+1)*hs)
                       Real* lse,        // (B, NH, T) log-sum-exp of each scaled score row (saved)
                       const Real* qkv,  // (B, T, 3C)
                       int B, int T, int C, int NH);

// dqkv written in full (q, k and v parts).
template <class Real>
void attention_backward(Real* dqkv,        // (B, T, 3C)
                        const Real* dout,  // (B, T, C)
                        const Real* qkv,   // (B, T, 3C) the forward input
                        const Real* lse,   // (B, NH, T) from attention_forward
                        int B, int T, int C, int NH);

}  // namespace triax::ops
