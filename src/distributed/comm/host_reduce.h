// Element-wise arithmetic of the host-memory communicators (MPI, Gloo) on type-erased buffers:
// the division that turns a sum into ReduceOp::avg, and Gloo's reduction functions (bf16/fp16
// widened to float). Private to src/distributed/comm.
#pragma once
#include <cstddef>

#include "triax/distributed/comm/comm.h"

namespace triax::detail {

// b[i] /= by for every element (integers truncate, 16-bit floats round through float).
void divide_buffer(Buffer b, int by);

// c[i] = a[i] op b[i] for n elements of type t (sum for ReduceOp::avg); nullptr for u8.
using ReduceFn = void (*)(void* c, const void* a, const void* b, size_t n);
ReduceFn reduce_fn(DType t, ReduceOp op);

}  // namespace triax::detail
