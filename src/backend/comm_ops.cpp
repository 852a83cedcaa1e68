// Typed spans from backend tensors (Backend::comm_span: host pointers on the CPU backends, device
// pointers on a device backend). The ordering after the kernels that wrote them is the adapted
// communicator's job (Backend::adapt; docs/CUDA.md "How the CUDA backend plugs in").
#include "triax/backend/comm_ops.h"

#include <vector>

namespace triax {

namespace {

template <class F>
Work typed(Backend& be, const Tensor& t, const char* op, F&& f) {
  if (!t.defined()) TRIAX_THROW(ConfigError, "{}: undefined buffer", op);
  if (!t.is_contiguous()) TRIAX_THROW(ConfigError, "{}: {} is not dense", op, t.str());
  switch (t.dtype()) {
    case DType::f32: return f(be.comm_span<float>(t));
    case DType::f64: return f(be.comm_span<double>(t));
    case DType::i32: return f(be.comm_span<int32_t>(t));
    case DType::i64: return f(be.comm_span<int64_t>(t));
    case DType::bf16: return f(be.comm_span<bf16>(t));
    case DType::f16: return f(be.comm_span<f16>(t));
    case DType::u8: return f(be.comm_span<uint8_t>(t));
  }
  TRIAX_THROW(ConfigError, "{}: unknown dtype", op);
}

void same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  if (a.dtype() != b.dtype())
    TRIAX_THROW(ConfigError, "{}: input {} and output {} differ in type", op, a.str(), b.str());
}

}  // namespace

Work all_reduce(Communicator& c, Backend& be, const Tensor& t, ReduceOp op) {
  return typed(be, t, "all_reduce", [&](auto s) { return c.all_reduce(s, op); });
}

Work reduce_scatter(Communicator& c, Backend& be, const Tensor& in, const Tensor& out, ReduceOp op) {
  same_dtype(in, out, "reduce_scatter");
  return typed(be, out, "reduce_scatter", [&](auto so) {
    using T = typename decltype(so)::element_type;
    return c.reduce_scatter(std::span<const T>(be.comm_span<T>(in)), so, op);
  });
}

Work all_gather(Communicator& c, Backend& be, const Tensor& in, const Tensor& out) {
  same_dtype(in, out, "all_gather");
  return typed(be, out, "all_gather", [&](auto so) {
    using T = typename decltype(so)::element_type;
    return c.all_gather(std::span<const T>(be.comm_span<T>(in)), so);
  });
}

Work all_to_all_v(Communicator& c, Backend& be, const Tensor& in, std::span<const int64_t> sc, const Tensor& out,
                  std::span<const int64_t> rc) {
  same_dtype(in, out, "all_to_all_v");
  return typed(be, out, "all_to_all_v", [&](auto so) {
    using T = typename decltype(so)::element_type;
    return c.all_to_all_v(std::span<const T>(be.comm_span<T>(in)), sc, so, rc);
  });
}

Work send(Communicator& c, Backend& be, const Tensor& t, int peer, int tag) {
  return typed(be, t, "send", [&](auto s) {
    using T = typename decltype(s)::element_type;
    return c.send(std::span<const T>(s), peer, tag);
  });
}

Work recv(Communicator& c, Backend& be, const Tensor& t, int peer, int tag) {
  return typed(be, t, "recv", [&](auto s) { return c.recv(s, peer, tag); });
}

Work send_recv(Communicator& c, Backend& be, std::span<const Tensor> sends, int to, std::span<const Tensor> recvs,
               int from, int tag) {
  std::vector<P2POp> ops;
  ops.reserve(sends.size() + recvs.size());
  int t = tag;
  for (const Tensor& x : sends)
    typed(be, x, "send_recv", [&](auto s) {
      using T = typename decltype(s)::element_type;
      ops.push_back(P2POp::send(std::span<const T>(s), to, t++));
      return Work();
    });
  t = tag;
  for (const Tensor& x : recvs)
    typed(be, x, "send_recv", [&](auto s) {
      ops.push_back(P2POp::recv(s, from, t++));
      return Work();
    });
  return c.batch_send_recv(ops);
}

}  // namespace triax
