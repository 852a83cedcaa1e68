// Fused softmax + cross-entropy on the GPU (kernels/softmax_xent.cu), the contract of
// ops/softmax_xent.h, including the vocab-parallel shard pieces (max -> allreduce MAX -> sumexp,
// target logit -> allreduce SUM -> loss from stats -> shard backward). Logits are float, bf16 or f16;
// losses and statistics are fp32 (what the all-reduces move). Host launchers; stream last.
#pragma once
#include <cstdint>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// Targets are not range-checked on the host (they live on the device). A target outside
// [0, valid_vocab) makes that row's loss (or target logit) NaN, so it cannot pass unnoticed, and
// its backward row is the plain softmax. Columns at or past valid_vocab are padding: out of the
// softmax, the loss and the gradient (written 0). One block per row.
// ConfigError for a non-positive size, valid_vocab outside [1, V], a negative v0, a null pointer.

// losses[i] = lse[i] - logits[i, targets[i]]; lse[i] = log sum_j exp(logits[i, j]) (valid j).
template <class Real>
void softmax_xent_forward(float* losses,           // (N)
                          float* lse,              // (N) saved for backward
                          const Real* logits,      // (N, V)
                          const int32_t* targets,  // (N)
                          int N, int V, int valid_vocab, cudaStream_t stream);

// dlogits = (softmax - onehot(target)) * dloss, 0 in padding columns. dlogits may alias logits.
template <class Real>
void softmax_xent_backward(Real* dlogits,           // (N, V)
                           const Real* logits,      // (N, V)
                           const float* lse,        // (N)
                           const int32_t* targets,  // (N)
                           float dloss, int N, int V, int valid_vocab, cudaStream_t stream);

// ---- vocab-parallel pieces: a shard's logits are (N, Vs), global columns [v0, v0 + Vs).
// Max over the shard's real columns; -infinity when it has none.
template <class Real>
void xent_shard_max(float* row_max, const Real* logits, int N, int Vs, int v0, int valid_vocab, cudaStream_t stream);

// sum over the shard's real columns of exp(logit - row_max[i]) (row_max: the global max).
template <class Real>
void xent_shard_sumexp(float* sumexp, const Real* logits, const float* row_max, int N, int Vs, int v0,
                       int valid_vocab, cudaStream_t stream);

// logits[i, targets[i] - v0] when the target is in this shard, else 0 (NaN for a bad target).
template <class Real>
void xent_shard_target_logit(float* target_logit, const Real* logits, const int32_t* targets, int N, int Vs, int v0,
                             int valid_vocab, cudaStream_t stream);

// lse = row_max + log(sumexp); losses = lse - target_logit (all global, reduced statistics).
void xent_loss_from_stats(float* losses, float* lse, const float* row_max, const float* sumexp,
                          const float* target_logit, int N, cudaStream_t stream);

// The shard's part of softmax_xent_backward. dlogits may alias logits.
template <class Real>
void xent_shard_backward(Real* dlogits, const Real* logits, const float* lse, const int32_t* targets, float dloss,
                         int N, int Vs, int v0, int valid_vocab, cudaStream_t stream);

}  // namespace triax::cuda
