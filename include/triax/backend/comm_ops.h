// Communicator calls on Backend buffers: the bridge between the two seams. Each takes the
// Backend that owns the tensors (for ordering on a device stream) and turns the dense tensors
// into typed spans of their element type (float32 or float64 activations, or any DType).
#pragma once
#include "triax/backend/backend.h"
#include "triax/distributed/comm/comm.h"

namespace triax {

Work all_reduce(Communicator& c, Backend& be, const Tensor& t, ReduceOp op = ReduceOp::sum);
Work reduce_scatter(Communicator& c, Backend& be, const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
Work all_gather(Communicator& c, Backend& be, const Tensor& in, const Tensor& out);
Work all_to_all_v(Communicator& c, Backend& be, const Tensor& in, std::span<const int64_t> send_counts,
                  const Tensor& out, std::span<const int64_t> recv_counts);
Work send(Communicator& c, Backend& be, const Tensor& t, int peer, int tag = 0);
Work recv(Communicator& c, Backend& be, const Tensor& t, int peer, int tag = 0);
// One batched exchange (Communicator::batch_send_recv): every tensor of sends goes to group rank
// `to`, every tensor of recvs arrives from `from`, all started together (a ring step cannot
// deadlock on the order of its halves). Tags are tag, tag + 1, ... in list order.
Work send_recv(Communicator& c, Backend& be, std::span<const Tensor> sends, int to, std::span<const Tensor> recvs,
               int from, int tag = 0);

}  // namespace triax
