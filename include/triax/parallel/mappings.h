// Megatron's paired tensor-parallel communication mappings, on Backend buffers:
//   copy_to_tp:      forward identity,   backward all-reduce  (input of a column-parallel layer)
//   reduce_from_tp:  forward all-reduce, backward identity    (output of a row-parallel layer)
// Each forward function has its backward twin, so a layer's code reads like the math.
#pragma once
#include "triax/backend/comm_ops.h"
#include "triax/core/trace.h"

namespace triax::tp {

// Sums partial results of a row-parallel layer over the TP group (in place).
inline void reduce_from_tp_forward(Communicator& tp, Backend& be, const Tensor& y) {
  if (tp.size() <= 1) return;
  trace::Span span(trace::Lane::tp, "tp all-reduce (row-parallel output)", -1, -1, static_cast<int64_t>(y.nbytes()));
  all_reduce(tp, be, y, ReduceOp::sum).wait();
}
// The gradient of a replicated input that fed a column-parallel layer: sum the partial input
// gradients of every shard (in place).
inline void copy_to_tp_backward(Communicator& tp, Backend& be, const Tensor& dx) {
  if (tp.size() <= 1) return;
  trace::Span span(trace::Lane::tp, "tp all-reduce (input gradient)", -1, -1, static_cast<int64_t>(dx.nbytes()));
  all_reduce(tp, be, dx, ReduceOp::sum).wait();
}
// The other halves are identities; they exist in the layer code as comments, not calls.

// Vocab-parallel statistics: max and sums over the vocab shards.
inline void max_over_tp(Communicator& tp, Backend& be, const Tensor& v) {
  if (tp.size() <= 1) return;
  trace::Span span(trace::Lane::tp, "tp all-reduce max (vocab)", -1, -1, static_cast<int64_t>(v.nbytes()));
  all_reduce(tp, be, v, ReduceOp::max).wait();
}
inline void sum_over_tp(Communicator& tp, Backend& be, const Tensor& v) {
  if (tp.size() <= 1) return;
  trace::Span span(trace::Lane::tp, "tp all-reduce sum (vocab)", -1, -1, static_cast<int64_t>(v.nbytes()));
  all_reduce(tp, be, v, ReduceOp::sum).wait();
}

// Sequence parallelism (Korthikanti et al. 2022): outside the TP GEMMs the residual stream is
// split by rows (tokens) over the TP group. Entering a column-parallel GEMM gathers the rows
// (backward: reduce-scatter); leaving a row-parallel GEMM reduce-scatters the partial sums
// (backward: all-gather). Rank r holds rows [r*n/tp, (r+1)*n/tp).
inline void gather_from_sequence_parallel(Communicator& tp, Backend& be, const Tensor& local, const Tensor& full) {
  if (tp.size() > 1) {
    trace::Span span(trace::Lane::tp, "tp all-gather (sequence parallel)", -1, -1, static_cast<int64_t>(full.nbytes()));
    all_gather(tp, be, local, full).wait();
  }
  else
    be.copy(full, local);
}
inline void reduce_scatter_to_sequence_parallel(Communicator& tp, Backend& be, const Tensor& full,
                                                const Tensor& local) {
  if (tp.size() > 1) {
    trace::Span span(trace::Lane::tp, "tp reduce-scatter (sequence parallel)", -1, -1,
                     static_cast<int64_t>(full.nbytes()));
    reduce_scatter(tp, be, full, local, ReduceOp::sum).wait();
  }
  else
    be.copy(local, full);
}

}  // namespace triax::tp
