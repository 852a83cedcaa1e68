// Token + position embedding on the GPU (kernels/embedding.cu), the same contract as
// ops/embedding.h: out[b,t,:] = wte[tokens[b,t] - v0,:] + wpe[t,:] over a vocab-parallel shard
// [v0, v1) of a V-row table. Host launchers; the stream comes last.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Real is float, bf16 or f16 (arithmetic in fp32, one rounding per stored element). wpe == nullptr
// leaves out the position term. Tokens outside the shard give zero rows (plus wpe). Tokens are
// NOT range-checked on the device (that would need a host sync): a token outside [0, V) is treated
// like one outside the shard; validate them where they are read (the data loader).
// ConfigError for a non-positive size, a bad shard range or a null pointer.
template <class Real>
void embedding_forward(Real* out,              // (B, T, C)
                       const int32_t* tokens,  // (B, T) device
                       const Real* wte,        // (v1 - v0, C)
                       const Real* wpe,        // (>= T, C) or nullptr
                       int B, int T, int C, int V, int v0, int v1, cudaStream_t stream);

// dwte[tok - v0] += dout[b,t] for the tokens in the shard; dwpe[t] += sum over b of dout[b,t].
// Either may be nullptr to skip it. dwte and dwpe are parameter gradients: fp32 whatever Real is
// (docs/CUDA.md, "Gradient types"); dout is read in Real and each element widened to fp32 once.
// Deterministic, and bit-identical to the CPU float op run on dout widened to fp32 (for any Real):
// the (b, t) positions are sorted by token with a stable radix sort (CUB), so each table row is
// summed by one thread per channel, starting from its old value, in ascending (b, t) order; dwpe
// is summed over b in order by one thread per (t, channel). No atomics. The price: a row whose
// token occurs k times costs k sequential adds (slow only for very skewed batches). Scratch
// (sort buffers) comes from cudaMallocAsync on the stream.
template <class Real>
void embedding_backward(float* dwte,            // (v1 - v0, C) fp32, +=
                        float* dwpe,            // (>= T, C) fp32, +=
                        const Real* dout,       // (B, T, C)
                        const int32_t* tokens,  // (B, T) device
                        int B, int T, int C, int V, int v0, int v1, cudaStream_t stream);

}  // namespace triax::cuda
