// Causal multi-head self-attention on the CPU, flash-style: the (T, T) score matrix is never kept.
// Forward saves one log-sum-exp per query row; backward recomputes the probabilities from it.
// Query blocks of kAttentionBlock rows run as GEMMs (gemm.h) against the keys they may see.
#pragma once

namespace triax::ops {

inline constexpr int kAttentionBlock = 64;  // query rows per block

// qkv holds, per token, [q | k | v]: q is C = NH * hs wide with head h in channels [h*hs, (h+1)*hs),
// k and v NKV * hs each (grouped-query attention: query head h reads key/value head h / (NH/NKV));
// NKV = 0 means NH, the multi-head [q | k | v] of 3C. A TP shard passes its local C = C_full/tp,
// NH = NH_full/tp and NKV = NKV_full/tp with its heads' columns of the QKV projection. Scores are
// q.k / sqrt(hs), causal (key <= query). ConfigError unless NH divides C and NKV divides NH.
template <class Real>
void attention_forward(Real* out,        // (B, T, C) head h in channels [h*hs, (h+1)*hs)
                       Real* lse,        // (B, NH, T) log-sum-exp of each scaled score row (saved)
                       const Real* qkv,  // (B, T, C + 2 NKV hs)
                       int B, int T, int C, int NH, int NKV = 0);

// dqkv written in full (q, k and v parts); a key/value head's gradient sums over the query heads of
// its group in head order (deterministic).
template <class Real>
void attention_backward(Real* dqkv,        // (B, T, C + 2 NKV hs)
                        const Real* dout,  // (B, T, C)
                        const Real* qkv,   // (B, T, C + 2 NKV hs) the forward input
                        const Real* lse,   // (B, NH, T) from attention_forward
                        int B, int T, int C, int NH, int NKV = 0);

}  // namespace triax::ops
