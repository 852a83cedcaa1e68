// Causal multi-head self-attention on the GPU (kernels/attention.cu), flash-style like
// ops/attention.h: keys are visited in shared-memory tiles with an online softmax, so the (T, T)
// score matrix is never stored; forward saves one log-sum-exp per query row and backward
// recomputes the probabilities from it. A plain CUDA-core kernel (fp32 arithmetic, one thread per
// query or key): correctness first, not the fast path (see docs/CUDA.md).
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"
#include "triax/ops/attention.h"

namespace triax::cuda {

// Head sizes the kernels are compiled for (C / NH must be one of them).
bool attention_supports_head_size(int hs);

// qkv layout and scores as Backend::attention_forward: per token [NH query heads | NKV key heads |
// NKV value heads], hs = C / NH channels each, W = C + 2 NKV hs elements per token; query head h
// reads key/value head h / (NH / NKV) (grouped-query attention; NKV = 0 means NH, multi-head:
// W = 3C as ops::attention_forward). Scores q.k / sqrt(hs), key <= query. Real is float, bf16 or
// f16. ConfigError for a non-positive size, NH not dividing C, NKV not dividing NH, an
// unsupported head size, a null pointer.
template <class Real>
void attention_forward(Real* out,        // (B, T, C)
                       float* lse,       // (B, NH, T) saved for backward
                       const Real* qkv,  // (B, T, W)
                       int B, int T, int C, int NH, int NKV, cudaStream_t stream);

// dqkv written in full. Unlike the CPU op this takes the forward output `out` as well:
// D_i = dout_i . out_i (= rowsum(P * dP)) is precomputed from it, so the dQ and dK/dV kernels
// each make one pass (no atomics: dQ by query blocks, dK/dV by key blocks of one kv head, which
// add the query heads of its group one after the other; deterministic).
// Scratch for D (B*NH*T floats) comes from the stream's arena (cuda/scratch.h).
template <class Real>
void attention_backward(Real* dqkv,        // (B, T, W)
                        const Real* dout,  // (B, T, C)
                        const Real* qkv,   // (B, T, W) the forward input
                        const Real* out,   // (B, T, C) the forward output
                        const float* lse,  // (B, NH, T) from attention_forward
                        int B, int T, int C, int NH, int NKV, cudaStream_t stream);

// Context-parallel (ring) attention blocks (kernels/attention_block.cu): the contract of
// ops::attention_block_forward/backward (ops/attention.h AttentionBlock: query rows of q against
// key/value rows of kv, causal by true positions) with lse in fp32 and the stream last. Forward
// merges the block into the running out/lse rows (lse = -inf: no block yet; rows that see no key
// untouched). Backward adds (+=) the block's share to dq (q's layout: query columns of the rows)
// and dkv (kv's layout: K and V columns of the key rows), from the final out and lse; D =
// rowsum(dout * out) is computed on the device into the stream's scratch (B*NH*nq floats). No
// atomics: dQ per (b, head, query tile), dK/dV per (b, kv head, key tile) over the group's query
// heads in order. ConfigError: the fields as ops::check_attention_block (naming the field), an
// unsupported head size, B or NH past 65535, a null pointer. A block no query of which sees a key
// launches nothing.
template <class Real>
void attention_block_forward(Real* out, float* lse, const Real* q, const Real* kv, const ops::AttentionBlock& a,
                             cudaStream_t stream);
template <class Real>
void attention_block_backward(Real* dq, Real* dkv, const Real* dout, const Real* q, const Real* kv, const Real* out,
                              const float* lse, const ops::AttentionBlock& a, cudaStream_t stream);

}  // namespace triax::cuda
