// Megatron's paired tensor-parallel communication mappings, on host buffers:
//   copy_to_tp:      forward identity,   backward all-reduce  (input of a column-parallel layer)
//   reduce_from_tp:  forward all-reduce, backward identity    (output of a row-parallel layer)
// Each forward function has its backward twin, so a layer's code reads like the math.
#pragma once
#include <span>

#include "triax/dist/comm.h"

namespace triax::tp {

// Sums partial results of a row-parallel layer over the TP group (in place).
inline void reduce_from_tp_forward(Communicator& tp, std::span<float> y) {
  if (tp.size() > 1) tp.all_reduce(y, ReduceOp::sum).wait();
}
// The gradient of a replicated input that fed a column-parallel layer: sum the partial input
// gradients of every shard (in place).
inline void copy_to_tp_backward(Communicator& tp, std::span<float> dx) {
  if (tp.size() > 1) tp.all_reduce(dx, ReduceOp::sum).wait();
}
// The other halves are identities; they exist in the layer code as comments, not calls.

// Vocab-parallel statistics: max and sums over the vocab shards.
inline void max_over_tp(Communicator& tp, std::span<float> v) {
  if (tp.size() > 1) tp.all_reduce(v, ReduceOp::max).wait();
}
inline void sum_over_tp(Communicator& tp, std::span<float> v) {
  if (tp.size() > 1) tp.all_reduce(v, ReduceOp::sum).wait();
}

}  // namespace triax::tp
