// Element-wise division and reductions of the host communicators (distributed/comm/host_reduce.h).
#include "host_reduce.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace triax::detail {
namespace {

template <class T, ReduceOp Op>
void reduce_elems(void* c, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>) {
      const float u = static_cast<float>(x[i]), v = static_cast<float>(y[i]);
      o[i] = T(Op == ReduceOp::max ? std::max(u, v) : Op == ReduceOp::min ? std::min(u, v) : u + v);
    } else {
      o[i] = Op == ReduceOp::max ? std::max(x[i], y[i]) : Op == ReduceOp::min ? std::min(x[i], y[i]) : x[i] + y[i];
    }
  }
}

template <class T>
ReduceFn reduce_fn_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return &reduce_elems<T, ReduceOp::max>;
    case ReduceOp::min: return &reduce_elems<T, ReduceOp::min>;
    default: return &reduce_elems<T, ReduceOp::sum>;  // avg: sum, divided on completion
  }
}

}  // namespace

ReduceFn reduce_fn(DType t, ReduceOp op) {
  switch (t) {
    case DType::f32: return reduce_fn_for<float>(op);
    case DType::f64: return reduce_fn_for<double>(op);
    case DType::i32: return reduce_fn_for<int32_t>(op);
    case DType::i64: return reduce_fn_for<int64_t>(op);
    case DType::bf16: return reduce_fn_for<bf16>(op);
    case DType::f16: return reduce_fn_for<f16>(op);
    case DType::u8: break;  // refused before numbering (Communicator::next)
  }
  return nullptr;
}

namespace {

template <class T>
void divide(void* p, size_t n, int by) {
  auto* x = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      x[i] = T(static_cast<float>(x[i]) / static_cast<float>(by));
    else
      x[i] = static_cast<T>(x[i] / static_cast<T>(by));
  }
}

}  // namespace

void divide_buffer(Buffer b, int by) {
  switch (b.dtype) {
    case DType::f32: divide<float>(b.data, b.count, by); break;
    case DType::f64: divide<double>(b.data, b.count, by); break;
    case DType::i32: divide<int32_t>(b.data, b.count, by); break;
    case DType::i64: divide<int64_t>(b.data, b.count, by); break;
    case DType::bf16: divide<bf16>(b.data, b.count, by); break;
    case DType::f16: divide<f16>(b.data, b.count, by); break;
    case DType::u8: break;
  }
}

}  // namespace triax::detail
