// Fused softmax + cross-entropy over logits on the CPU, never materialising probabilities.
// Columns at or past valid_vocab are vocab padding: out of the softmax, the loss and the gradient.
// The xent_shard_* blocks compute the same over a vocab shard so the TP model can run
// vocab-parallel cross-entropy with two all-reduces (MAX of row_max; SUM of sumexp and
// target_logit) and never gather the logits:
//   xent_shard_max -> allreduce MAX -> xent_shard_sumexp, xent_shard_target_logit ->
//   allreduce SUM (both, one buffer) -> xent_loss_from_stats -> ... -> xent_shard_backward.
#pragma once
#include <cstdint>

namespace triax::ops {

// losses[i] = -log softmax(logits[i, :valid_vocab])[targets[i]]; lse[i] = log sum_j exp(logits[i,j])
// over the valid columns, saved for backward. ConfigError for a target outside [0, valid_vocab)
// (naming the row and value) or valid_vocab outside [1, V].
template <class Real>
void softmax_xent_forward(Real* losses,            // (N)
                          Real* lse,               // (N)
                          const Real* logits,      // (N, V)
                          const int32_t* targets,  // (N)
                          int N, int V, int valid_vocab);

// dlogits = (softmax - onehot(target)) * dloss, 0 in the padding columns. dloss is d(total)/d(loss
// of one row), e.g. 1/N for a mean. dlogits may alias logits (in place).
template <class Real>
void softmax_xent_backward(Real* dlogits,           // (N, V)
                           const Real* logits,      // (N, V)
                           const Real* lse,         // (N)
                           const int32_t* targets,  // (N)
                           Real dloss, int N, int V, int valid_vocab);

// ---- vocab-parallel building blocks. A shard's logits are (N, Vs): global columns [v0, v0 + Vs);
// column c is real when v0 + c < valid_vocab (the padding sits at the end of the last shards).

// Max over the shard's real columns; -infinity when it has none.
template <class Real>
void xent_shard_max(Real* row_max,        // (N)
                    const Real* logits,   // (N, Vs)
                    int N, int Vs, int v0, int valid_vocab);

// sum over the shard's real columns of exp(logit - row_max[i]), row_max being the global max.
template <class Real>
void xent_shard_sumexp(Real* sumexp,          // (N)
                       const Real* logits,    // (N, Vs)
                       const Real* row_max,   // (N) global
                       int N, int Vs, int v0, int valid_vocab);

// logits[i, targets[i] - v0] when the target is in this shard, else 0 (the SUM picks the owner's).
// ConfigError for a target outside [0, valid_vocab).
template <class Real>
void xent_shard_target_logit(Real* target_logit,      // (N)
                             const Real* logits,      // (N, Vs)
                             const int32_t* targets,  // (N)
                             int N, int Vs, int v0, int valid_vocab);

// From the reduced statistics: lse = row_max + log(sumexp); losses = lse - target_logit.
template <class Real>
void xent_loss_from_stats(Real* losses,               // (N)
                          Real* lse,                  // (N)
                          const Real* row_max,        // (N) global
                          const Real* sumexp,         // (N) global
                          const Real* target_logit,   // (N) global
                          int N);

// The shard's part of softmax_xent_backward, with lse from xent_loss_from_stats.
template <class Real>
void xent_shard_backward(Real* dlogits,           // (N, Vs) may alias logits
                         const Real* logits,      // (N, Vs)
                         const Real* lse,         // (N)
                         const int32_t* targets,  // (N)
                         Real dloss, int N, int Vs, int v0, int valid_vocab);

}  // namespace triax::ops
