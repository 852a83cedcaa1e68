// CpuBackend: each op checks its buffers (defined, dense, on the cpu, of one element type, large
// enough) and calls the fp32 or fp64 template of ops/. Element-wise loops here keep a fixed order
// so that results do not depend on the thread count.
#include "triax/backend/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "triax/core/cpu_isa.h"
#include "triax/core/error.h"
#include "triax/ops/attention.h"
#include "triax/ops/embedding.h"
#include "triax/ops/gelu.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/linear.h"
#include "triax/ops/residual.h"
#include "triax/ops/rmsnorm.h"
#include "triax/ops/rope.h"
#include "triax/ops/softmax_xent.h"
#include "triax/ops/lstm.h"
#include "triax/ops/swiglu.h"
#include "triax/ops/adamw.h"
#include "triax/tensor/allocator.h"

namespace triax {

namespace {

void need(const Tensor& t, const char* op, const char* what, int64_t numel) {
  if (!t.defined()) TRIAX_THROW(ConfigError, "backend {}: {} is undefined", op, what);
  if (!t.device().is_cpu()) TRIAX_THROW(ConfigError, "backend {}: {} is on {}, not cpu", op, what, t.device().str());
  if (!t.is_contiguous()) TRIAX_THROW(ConfigError, "backend {}: {} is not dense", op, what);
  if (numel >= 0 && t.numel() < numel)
    TRIAX_THROW(ConfigError, "backend {}: {} holds {} elements, {} needed", op, what, t.numel(), numel);
}

// Calls f.template operator()<Real>() for the floating dtype of t (f32 or f64).
template <class F>
void by_real(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: TRIAX_THROW(ConfigError, "backend {}: the cpu backend computes in float32 or float64, not {}", op, dtype_name(dt));
  }
}

template <class R>
R* ptr(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != dtype_of<R>())
    TRIAX_THROW(ConfigError, "backend {}: {} is {}, the op computes in {}", op, what, dtype_name(t.dtype()),
                dtype_name(dtype_of<R>()));
  return t.data<R>();
}

// The backend sees a vocabulary shard [v0, v1), not the full vocabulary: tokens are checked
// against the vocabulary by the model on the host; here any token >= 0 outside the shard gives zeros.
constexpr int kAnyVocab = std::numeric_limits<int>::max();

// Elements per token of the fused qkv activation: NH query heads and NKV (0: NH) key and value
// heads of C / NH channels. NH < 1 or a non-dividing NH are left for the op to name.
int64_t qkv_row(int C, int NH, int NKV) {
  if (NH < 1) return int64_t{3} * C;
  return C + int64_t{2} * (NKV > 0 ? NKV : NH) * (C / NH);
}

}  // namespace

// Counts the bytes of every allocation (the allocator-measured memory of the step).
class CpuBackend::Alloc : public Allocator {
 public:
  explicit Alloc(CpuBackend& be) : be_(be) {}
  void* allocate(size_t nbytes, int) override {
    void* p = be_.allocate(nbytes);
    const size_t now = be_.in_use_.fetch_add(nbytes) + nbytes;
    size_t peak = be_.peak_.load();
    while (now > peak && !be_.peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* p, size_t nbytes, int) noexcept override {
    be_.deallocate(p, nbytes);
    be_.in_use_.fetch_sub(nbytes);
  }
  std::string_view name() const override { return "cpu-backend"; }

 private:
  CpuBackend& be_;
};

CpuBackend::CpuBackend(DType compute) : compute_(compute), alloc_(std::make_unique<Alloc>(*this)) {
  if (compute != DType::f32 && compute != DType::f64)
    TRIAX_THROW(ConfigError, "the cpu backend computes in float32 or float64, not {}", dtype_name(compute));
  cpu_isa();  // reads TRIAX_CPU_ISA now: a bad value fails here, not inside an OpenMP loop
}

CpuBackend::~CpuBackend() = default;

void* CpuBackend::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
  void* p = std::aligned_alloc(kCpuAlignment, rounded);
  if (!p)
    TRIAX_THROW(OutOfMemoryError, "cpu backend: out of memory allocating {} bytes ({} in use)", nbytes, in_use_.load());
  return p;
}

void CpuBackend::deallocate(void* p, size_t) noexcept { std::free(p); }

Tensor CpuBackend::empty(const Shape& shape, DType dtype) {
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto st = std::make_shared<Storage>(nbytes, Device::cpu(), *alloc_);
  return Tensor::on_storage(std::move(st), shape, dtype);
}

Tensor Backend::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  fill(t, 0.0);
  return t;
}

CpuBackend::Access CpuBackend::open(std::initializer_list<const Tensor*> ts) {
  if (!checking()) return Access();
  ++depth_;
  for (const Tensor* t : ts)
    if (t && t->defined() && t->numel() > 0) open_range(t->raw_data(), t->nbytes());
  return Access(this);
}

std::shared_ptr<BackendEvent> CpuBackend::record() {
  struct Done : BackendEvent {
    bool ready() const override { return true; }
    void synchronize() override {}
  };
  return std::make_shared<Done>();
}

// ---- copies and fills

void CpuBackend::copy_from_host(const Tensor& dst, const void* src, size_t nbytes) {
  need(dst, "copy_from_host", "dst", -1);
  if (nbytes > dst.nbytes()) TRIAX_THROW(ConfigError, "backend copy_from_host: {} bytes into a {}-byte buffer", nbytes, dst.nbytes());
  auto a = open({&dst});
  if (nbytes) std::memcpy(dst.raw_data(), src, nbytes);
}

void CpuBackend::copy_to_host(void* dst, const Tensor& src, size_t nbytes) {
  need(src, "copy_to_host", "src", -1);
  if (nbytes > src.nbytes()) TRIAX_THROW(ConfigError, "backend copy_to_host: {} bytes from a {}-byte buffer", nbytes, src.nbytes());
  auto a = open({&src});
  if (nbytes) std::memcpy(dst, src.raw_data(), nbytes);
}

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  need(dst, "copy", "dst", -1);
  need(src, "copy", "src", -1);
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype())
    TRIAX_THROW(ConfigError, "backend copy: {} from {}", dst.str(), src.str());
  auto a = open({&dst, &src});
  if (dst.raw_data() != src.raw_data() && src.nbytes()) std::memmove(dst.raw_data(), src.raw_data(), src.nbytes());
}

void CpuBackend::cast(const Tensor& dst, const Tensor& src) {
  need(dst, "cast", "dst", -1);
  need(src, "cast", "src", -1);
  if (dst.numel() != src.numel())
    TRIAX_THROW(ConfigError, "backend cast: dst {} holds {} elements, src {} holds {}", dst.str(), dst.numel(), src.str(),
                src.numel());
  if (dst.dtype() == src.dtype()) {
    copy(dst, src);
    return;
  }
  const auto real = [](DType t) { return t == DType::f32 || t == DType::f64; };
  if (!real(dst.dtype()) || !real(src.dtype()))
    TRIAX_THROW(ConfigError, "backend cast: the cpu backend converts between float32 and float64 only, not {} to {} "
                "(dst {}, src {})", dtype_name(src.dtype()), dtype_name(dst.dtype()), dst.str(), src.str());
  auto a = open({&dst, &src});
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::f32) {
    float* d = dst.data<float>();
    const double* s = src.data<double>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(s[i]);
  } else {
    double* d = dst.data<double>();
    const float* s = src.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<double>(s[i]);
  }
}

void CpuBackend::fill(const Tensor& x, double value) {
  need(x, "fill", "x", -1);
  auto a = open({&x});
  const int64_t n = x.numel();
  switch (x.dtype()) {
    case DType::f32: {
      float* p = x.data<float>();
      const float v = static_cast<float>(value);
      // Both threads for large fills (zeroing a 124M-parameter gradient buffer every step):
      // one thread cannot reach the memory bandwidth.
#pragma omp parallel for simd schedule(static) if (n >= (int64_t{1} << 20))
      for (int64_t i = 0; i < n; ++i) p[i] = v;
      return;
    }
    case DType::f64: {
      double* p = x.data<double>();
      for (int64_t i = 0; i < n; ++i) p[i] = value;
      return;
    }
    case DType::i32: {
      int32_t* p = x.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(value);
      return;
    }
    default:
      if (value == 0.0) {
        std::memset(x.raw_data(), 0, x.nbytes());
        return;
      }
      TRIAX_THROW(ConfigError, "backend fill: {} with {} is not supported", dtype_name(x.dtype()), value);
  }
}

void CpuBackend::scale(const Tensor& x, double s) {
  need(x, "scale", "x", -1);
  auto a = open({&x});
  by_real(x.dtype(), "scale", [&](auto r) {
    using R = decltype(r);
    R* p = ptr<R>(x, "scale", "x");
    const R f = static_cast<R>(s);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) p[i] *= f;
  });
}

void CpuBackend::axpy(const Tensor& y, double s, const Tensor& x) {
  need(y, "axpy", "y", -1);
  need(x, "axpy", "x", y.numel());
  auto a = open({&y, &x});
  by_real(y.dtype(), "axpy", [&](auto r) {
    using R = decltype(r);
    R* py = ptr<R>(y, "axpy", "y");
    const R* px = ptr<R>(x, "axpy", "x");
    const R f = static_cast<R>(s);
    const int64_t n = y.numel();
    if (s == 1.0)
      for (int64_t i = 0; i < n; ++i) py[i] += px[i];
    else
      for (int64_t i = 0; i < n; ++i) py[i] += f * px[i];
  });
}

void CpuBackend::add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) {
  need(x, "add_rows_periodic", "x", int64_t{rows} * C);
  need(src, "add_rows_periodic", "src", int64_t{period} * C);
  auto a = open({&x, &src});
  by_real(x.dtype(), "add_rows_periodic", [&](auto r) {
    using R = decltype(r);
    R* px = ptr<R>(x, "add_rows_periodic", "x");
    const R* ps = ptr<R>(src, "add_rows_periodic", "src");
    for (int i = 0; i < rows; ++i) {
      R* row = px + static_cast<size_t>(i) * C;
      const R* s = ps + static_cast<size_t>((row0 + i) % period) * C;
      for (int c = 0; c < C; ++c) row[c] += s[c];
    }
  });
}

void CpuBackend::sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) {
  need(dsrc, "sum_rows_periodic", "dsrc", int64_t{period} * C);
  need(dx, "sum_rows_periodic", "dx", int64_t{rows} * C);
  auto a = open({&dsrc, &dx});
  by_real(dx.dtype(), "sum_rows_periodic", [&](auto r) {
    using R = decltype(r);
    R* pd = ptr<R>(dsrc, "sum_rows_periodic", "dsrc");
    const R* px = ptr<R>(dx, "sum_rows_periodic", "dx");
    for (int i = 0; i < rows; ++i) {
      R* dst = pd + static_cast<size_t>((row0 + i) % period) * C;
      const R* s = px + static_cast<size_t>(i) * C;
      for (int c = 0; c < C; ++c) dst[c] += s[c];
    }
  });
}

void CpuBackend::add_bias(const Tensor& y, const Tensor& b, int N, int C) {
  need(y, "add_bias", "y", int64_t{N} * C);
  need(b, "add_bias", "b", C);
  auto a = open({&y, &b});
  by_real(y.dtype(), "add_bias", [&](auto r) {
    using R = decltype(r);
    R* py = ptr<R>(y, "add_bias", "y");
    const R* pb = ptr<R>(b, "add_bias", "b");
    for (int i = 0; i < N; ++i) {
      R* row = py + static_cast<size_t>(i) * C;
      for (int c = 0; c < C; ++c) row[c] += pb[c];
    }
  });
}

void CpuBackend::bias_grad(const Tensor& db, const Tensor& d, int N, int C) {
  need(db, "bias_grad", "db", C);
  need(d, "bias_grad", "d", int64_t{N} * C);
  auto a = open({&db, &d});
  by_real(d.dtype(), "bias_grad", [&](auto r) {
    using R = decltype(r);
    R* pb = ptr<R>(db, "bias_grad", "db");
    const R* pd = ptr<R>(d, "bias_grad", "d");
    // Fixed row order: the same bits on every run and every thread count.
    for (int i = 0; i < N; ++i) {
      const R* row = pd + static_cast<size_t>(i) * C;
      for (int c = 0; c < C; ++c) pb[c] += row[c];
    }
  });
}

void CpuBackend::residual(const Tensor& out, const Tensor& x, const Tensor& y) {
  need(out, "residual", "out", -1);
  need(x, "residual", "a", out.numel());
  need(y, "residual", "b", out.numel());
  auto a = open({&out, &x, &y});
  by_real(out.dtype(), "residual", [&](auto r) {
    using R = decltype(r);
    ops::residual_forward(ptr<R>(out, "residual", "out"), ptr<R>(x, "residual", "a"), ptr<R>(y, "residual", "b"),
                          out.numel());
  });
}

// ---- layers

void CpuBackend::linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, int N,
                                int IC, int OC) {
  need(out, "linear_forward", "out", int64_t{N} * OC);
  need(inp, "linear_forward", "inp", int64_t{N} * IC);
  need(w, "linear_forward", "weight", int64_t{OC} * IC);
  if (bias.defined()) need(bias, "linear_forward", "bias", OC);
  auto a = open({&out, &inp, &w, &bias});
  by_real(out.dtype(), "linear_forward", [&](auto r) {
    using R = decltype(r);
    const char* op = "linear_forward";
    ops::linear_forward(ptr<R>(out, op, "out"), ptr<R>(inp, op, "inp"), ptr<R>(w, op, "weight"),
                        static_cast<const R*>(ptr<R>(bias, op, "bias")), N, IC, OC);
  });
}

void CpuBackend::linear_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                 const Tensor& inp, const Tensor& w, int N, int IC, int OC, ops::GradMode mode) {
  const char* op = "linear_backward";
  need(dout, op, "dout", int64_t{N} * OC);
  need(inp, op, "inp", int64_t{N} * IC);
  need(w, op, "weight", int64_t{OC} * IC);
  if (dinp.defined()) need(dinp, op, "dinp", int64_t{N} * IC);
  if (dw.defined()) need(dw, op, "dweight", int64_t{OC} * IC);
  if (db.defined()) need(db, op, "dbias", OC);
  auto a = open({&dinp, &dw, &db, &dout, &inp, &w});
  by_real(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::linear_backward(ptr<R>(dinp, op, "dinp"), ptr<R>(dw, op, "dweight"), ptr<R>(db, op, "dbias"),
                         static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                         static_cast<const R*>(ptr<R>(w, op, "weight")), N, IC, OC, mode);
  });
}

void CpuBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                   const Tensor& w, const Tensor& b, int N, int C) {
  const char* op = "layernorm_forward";
  need(out, op, "out", int64_t{N} * C);
  need(mean, op, "mean", N);
  need(rstd, op, "rstd", N);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  need(b, op, "bias", C);
  auto a = open({&out, &mean, &rstd, &inp, &w, &b});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::layernorm_forward(ptr<R>(out, op, "out"), ptr<R>(mean, op, "mean"), ptr<R>(rstd, op, "rstd"),
                           static_cast<const R*>(ptr<R>(inp, op, "inp")), static_cast<const R*>(ptr<R>(w, op, "weight")),
                           static_cast<const R*>(ptr<R>(b, op, "bias")), N, C);
  });
}

void CpuBackend::layernorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                    const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd, int N,
                                    int C, ops::GradMode mode) {
  const char* op = "layernorm_backward";
  need(dinp, op, "dinp", int64_t{N} * C);
  need(dout, op, "dout", int64_t{N} * C);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  need(mean, op, "mean", N);
  need(rstd, op, "rstd", N);
  if (dw.defined()) need(dw, op, "dweight", C);
  if (db.defined()) need(db, op, "dbias", C);
  auto a = open({&dinp, &dw, &db, &dout, &inp, &w, &mean, &rstd});
  by_real(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::layernorm_backward(ptr<R>(dinp, op, "dinp"), ptr<R>(dw, op, "dweight"), ptr<R>(db, op, "dbias"),
                            static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                            static_cast<const R*>(ptr<R>(w, op, "weight")), static_cast<const R*>(ptr<R>(mean, op, "mean")),
                            static_cast<const R*>(ptr<R>(rstd, op, "rstd")), N, C, mode);
  });
}

void CpuBackend::gelu_forward(const Tensor& out, const Tensor& inp) {
  need(out, "gelu_forward", "out", -1);
  need(inp, "gelu_forward", "inp", out.numel());
  auto a = open({&out, &inp});
  by_real(out.dtype(), "gelu_forward", [&](auto r) {
    using R = decltype(r);
    ops::gelu_forward(ptr<R>(out, "gelu_forward", "out"), static_cast<const R*>(ptr<R>(inp, "gelu_forward", "inp")),
                      out.numel());
  });
}

void CpuBackend::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  need(dinp, "gelu_backward", "dinp", -1);
  need(inp, "gelu_backward", "inp", dinp.numel());
  need(dout, "gelu_backward", "dout", dinp.numel());
  auto a = open({&dinp, &inp, &dout});
  by_real(dinp.dtype(), "gelu_backward", [&](auto r) {
    using R = decltype(r);
    const char* op = "gelu_backward";
    ops::gelu_backward(ptr<R>(dinp, op, "dinp"), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                       static_cast<const R*>(ptr<R>(dout, op, "dout")), dinp.numel());
  });
}

void CpuBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w, int N, int C,
                                 double eps) {
  const char* op = "rmsnorm_forward";
  need(out, op, "out", int64_t{N} * C);
  need(rstd, op, "rstd", N);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  auto a = open({&out, &rstd, &inp, &w});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::rmsnorm_forward(ptr<R>(out, op, "out"), ptr<R>(rstd, op, "rstd"), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                         static_cast<const R*>(ptr<R>(w, op, "weight")), N, C, eps);
  });
}

void CpuBackend::rmsnorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout, const Tensor& inp,
                                  const Tensor& w, const Tensor& rstd, int N, int C, ops::GradMode mode) {
  const char* op = "rmsnorm_backward";
  need(dinp, op, "dinp", int64_t{N} * C);
  need(dout, op, "dout", int64_t{N} * C);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  need(rstd, op, "rstd", N);
  if (dw.defined()) need(dw, op, "dweight", C);
  auto a = open({&dinp, &dw, &dout, &inp, &w, &rstd});
  by_real(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::rmsnorm_backward(ptr<R>(dinp, op, "dinp"), ptr<R>(dw, op, "dweight"),
                          static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                          static_cast<const R*>(ptr<R>(w, op, "weight")), static_cast<const R*>(ptr<R>(rstd, op, "rstd")),
                          N, C, mode);
  });
}

void CpuBackend::swiglu_forward(const Tensor& out, const Tensor& h, int N, int F) {
  const char* op = "swiglu_forward";
  need(out, op, "out", int64_t{N} * F);
  need(h, op, "h", int64_t{N} * 2 * F);
  auto a = open({&out, &h});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::swiglu_forward(ptr<R>(out, op, "out"), static_cast<const R*>(ptr<R>(h, op, "h")), N, F);
  });
}

void CpuBackend::swiglu_backward(const Tensor& dh, const Tensor& dout, const Tensor& h, int N, int F) {
  const char* op = "swiglu_backward";
  need(dh, op, "dh", int64_t{N} * 2 * F);
  need(dout, op, "dout", int64_t{N} * F);
  need(h, op, "h", int64_t{N} * 2 * F);
  auto a = open({&dh, &dout, &h});
  by_real(dh.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::swiglu_backward(ptr<R>(dh, op, "dh"), static_cast<const R*>(ptr<R>(dout, op, "dout")),
                         static_cast<const R*>(ptr<R>(h, op, "h")), N, F);
  });
}

void CpuBackend::lstm_cell_forward(const Tensor& h, const Tensor& c, const Tensor& gates, const Tensor& c_prev, int B,
                                   int H) {
  const char* op = "lstm_cell_forward";
  if (B <= 0 || H <= 0) TRIAX_THROW(ConfigError, "backend {}: B={} and H={} must be positive", op, B, H);
  need(h, op, "h", int64_t{B} * H);
  need(c, op, "c", int64_t{B} * H);
  need(gates, op, "gates", int64_t{B} * 4 * H);
  need(c_prev, op, "c_prev", int64_t{B} * H);
  auto a = open({&h, &c, &gates, &c_prev});
  by_real(gates.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::lstm_cell_forward(ptr<R>(h, op, "h"), ptr<R>(c, op, "c"), ptr<R>(gates, op, "gates"),
                           static_cast<const R*>(ptr<R>(c_prev, op, "c_prev")), B, H);
  });
}

void CpuBackend::lstm_cell_backward(const Tensor& dgates, const Tensor& dc, const Tensor& dh, const Tensor& gates,
                                    const Tensor& c, const Tensor& c_prev, int B, int H) {
  const char* op = "lstm_cell_backward";
  if (B <= 0 || H <= 0) TRIAX_THROW(ConfigError, "backend {}: B={} and H={} must be positive", op, B, H);
  need(dgates, op, "dgates", int64_t{B} * 4 * H);
  need(dc, op, "dc", int64_t{B} * H);
  need(dh, op, "dh", int64_t{B} * H);
  need(gates, op, "gates", int64_t{B} * 4 * H);
  need(c, op, "c", int64_t{B} * H);
  need(c_prev, op, "c_prev", int64_t{B} * H);
  auto a = open({&dgates, &dc, &dh, &gates, &c, &c_prev});
  by_real(gates.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::lstm_cell_backward(ptr<R>(dgates, op, "dgates"), ptr<R>(dc, op, "dc"),
                            static_cast<const R*>(ptr<R>(dh, op, "dh")), static_cast<const R*>(ptr<R>(gates, op, "gates")),
                            static_cast<const R*>(ptr<R>(c, op, "c")), static_cast<const R*>(ptr<R>(c_prev, op, "c_prev")),
                            B, H);
  });
}

void CpuBackend::rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                              int HD) {
  const char* op = "rope_forward";
  need(qkv, op, "qkv", int64_t{B} * T * (NH + 2 * int64_t{NKV > 0 ? NKV : NH}) * HD);
  need(cos, op, "cos", int64_t{T} * (HD / 2));
  need(sin, op, "sin", int64_t{T} * (HD / 2));
  auto a = open({&qkv, &cos, &sin});
  by_real(qkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::rope_forward(ptr<R>(qkv, op, "qkv"), static_cast<const R*>(ptr<R>(cos, op, "cos")),
                      static_cast<const R*>(ptr<R>(sin, op, "sin")), B, T, NH, NKV, HD);
  });
}

void CpuBackend::rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                               int HD) {
  const char* op = "rope_backward";
  need(dqkv, op, "dqkv", int64_t{B} * T * (NH + 2 * int64_t{NKV > 0 ? NKV : NH}) * HD);
  need(cos, op, "cos", int64_t{T} * (HD / 2));
  need(sin, op, "sin", int64_t{T} * (HD / 2));
  auto a = open({&dqkv, &cos, &sin});
  by_real(dqkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::rope_backward(ptr<R>(dqkv, op, "dqkv"), static_cast<const R*>(ptr<R>(cos, op, "cos")),
                       static_cast<const R*>(ptr<R>(sin, op, "sin")), B, T, NH, NKV, HD);
  });
}

void CpuBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C,
                                   int NH, int NKV) {
  const char* op = "attention_forward";
  need(out, op, "out", int64_t{B} * T * C);
  need(lse, op, "lse", int64_t{B} * NH * T);
  need(qkv, op, "qkv", int64_t{B} * T * qkv_row(C, NH, NKV));
  auto a = open({&out, &lse, &qkv});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::attention_forward(ptr<R>(out, op, "out"), ptr<R>(lse, op, "lse"), static_cast<const R*>(ptr<R>(qkv, op, "qkv")),
                           B, T, C, NH, NKV);
  });
}

void CpuBackend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, int B, int T, int C, int NH, int NKV) {
  const char* op = "attention_backward";
  need(dqkv, op, "dqkv", int64_t{B} * T * qkv_row(C, NH, NKV));
  need(dout, op, "dout", int64_t{B} * T * C);
  need(out, op, "out", int64_t{B} * T * C);
  need(qkv, op, "qkv", int64_t{B} * T * qkv_row(C, NH, NKV));
  need(lse, op, "lse", int64_t{B} * NH * T);
  auto a = open({&dqkv, &dout, &qkv, &lse});
  by_real(dqkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::attention_backward(ptr<R>(dqkv, op, "dqkv"), static_cast<const R*>(ptr<R>(dout, op, "dout")),
                            static_cast<const R*>(ptr<R>(qkv, op, "qkv")), static_cast<const R*>(ptr<R>(lse, op, "lse")),
                            B, T, C, NH, NKV);
  });
}

void CpuBackend::attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                         const ops::AttentionBlock& blk) {
  const char* op = "attention_block_forward";
  const ops::AttentionBlockSizes n = ops::attention_block_sizes(op, blk);
  need(out, op, "out", n.out);
  need(lse, op, "lse", n.lse);
  need(q, op, "q", n.q);
  need(kv, op, "kv", n.kv);
  auto a = open({&out, &lse, &q, &kv});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::attention_block_forward(ptr<R>(out, op, "out"), ptr<R>(lse, op, "lse"), static_cast<const R*>(ptr<R>(q, op, "q")),
                                 static_cast<const R*>(ptr<R>(kv, op, "kv")), blk);
  });
}

void CpuBackend::attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                          const Tensor& kv, const Tensor& out, const Tensor& lse,
                                          const ops::AttentionBlock& blk) {
  const char* op = "attention_block_backward";
  const ops::AttentionBlockSizes n = ops::attention_block_sizes(op, blk);
  need(dq, op, "dq", n.q);
  need(q, op, "q", n.q);
  need(dkv, op, "dkv", n.kv);
  need(kv, op, "kv", n.kv);
  need(dout, op, "dout", n.out);
  need(out, op, "out", n.out);
  need(lse, op, "lse", n.lse);
  auto a = open({&dq, &dkv, &dout, &q, &kv, &out, &lse});
  by_real(dq.dtype(), op, [&](auto r) {
    using R = decltype(r);
    const auto in = [&](const Tensor& t, const char* what) { return static_cast<const R*>(ptr<R>(t, op, what)); };
    ops::attention_block_backward(ptr<R>(dq, op, "dq"), ptr<R>(dkv, op, "dkv"), in(dout, "dout"), in(q, "q"),
                                  in(kv, "kv"), in(out, "out"), in(lse, "lse"), blk);
  });
}

void CpuBackend::copy_columns(const Tensor& dst, const Tensor& src, int64_t rows, int dst_width, int dst_col0,
                              int src_width, int src_col0, int ncols) {
  const char* op = "copy_columns";
  need(dst, op, "dst", rows * dst_width);
  need(src, op, "src", rows * src_width);
  if (dst.dtype() != src.dtype())
    TRIAX_THROW(ConfigError, "backend {}: dst {} and src {} differ in type", op, dst.str(), src.str());
  auto a = open({&dst, &src});
  ops::copy_columns(dst.raw_data(), src.raw_data(), static_cast<int>(dtype_size(dst.dtype())), rows, dst_width,
                    dst_col0, src_width, src_col0, ncols);
}

void CpuBackend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, int N, int C, int v0,
                                   int v1) {
  const char* op = "embedding_forward";
  need(out, op, "out", int64_t{N} * C);
  need(tokens, op, "tokens", N);
  need(wte, op, "wte", int64_t{v1 - v0} * C);
  if (tokens.dtype() != DType::i32) TRIAX_THROW(ConfigError, "backend {}: tokens must be int32", op);
  auto a = open({&out, &tokens, &wte});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::embedding_forward(ptr<R>(out, op, "out"), tokens.data<int32_t>(), static_cast<const R*>(ptr<R>(wte, op, "wte")),
                           static_cast<const R*>(nullptr), 1, N, C, kAnyVocab, v0, v1);
  });
}

void CpuBackend::embedding_backward(const Tensor& dwte, const Tensor& dout, const Tensor& tokens, int N, int C, int v0,
                                    int v1) {
  const char* op = "embedding_backward";
  need(dwte, op, "dwte", int64_t{v1 - v0} * C);
  need(dout, op, "dout", int64_t{N} * C);
  need(tokens, op, "tokens", N);
  if (tokens.dtype() != DType::i32) TRIAX_THROW(ConfigError, "backend {}: tokens must be int32", op);
  auto a = open({&dwte, &dout, &tokens});
  by_real(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::embedding_backward(ptr<R>(dwte, op, "dwte"), static_cast<R*>(nullptr),
                            static_cast<const R*>(ptr<R>(dout, op, "dout")), tokens.data<int32_t>(), 1, N, C, kAnyVocab, v0,
                            v1);
  });
}

void CpuBackend::xent_shard_max(const Tensor& row_max, const Tensor& logits, int N, int Vs, int v0, int valid) {
  const char* op = "xent_shard_max";
  need(row_max, op, "row_max", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  auto a = open({&row_max, &logits});
  by_real(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::xent_shard_max(ptr<R>(row_max, op, "row_max"), static_cast<const R*>(ptr<R>(logits, op, "logits")), N, Vs, v0,
                        valid);
  });
}

void CpuBackend::xent_shard_sumexp(const Tensor& sumexp, const Tensor& logits, const Tensor& row_max, int N, int Vs,
                                   int v0, int valid) {
  const char* op = "xent_shard_sumexp";
  need(sumexp, op, "sumexp", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(row_max, op, "row_max", N);
  auto a = open({&sumexp, &logits, &row_max});
  by_real(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::xent_shard_sumexp(ptr<R>(sumexp, op, "sumexp"), static_cast<const R*>(ptr<R>(logits, op, "logits")),
                           static_cast<const R*>(ptr<R>(row_max, op, "row_max")), N, Vs, v0, valid);
  });
}

void CpuBackend::xent_shard_target_logit(const Tensor& target_logit, const Tensor& logits, const Tensor& targets, int N,
                                         int Vs, int v0, int valid) {
  const char* op = "xent_shard_target_logit";
  need(target_logit, op, "target_logit", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(targets, op, "targets", N);
  auto a = open({&target_logit, &logits, &targets});
  by_real(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::xent_shard_target_logit(ptr<R>(target_logit, op, "target_logit"),
                                 static_cast<const R*>(ptr<R>(logits, op, "logits")), targets.data<int32_t>(), N, Vs, v0,
                                 valid);
  });
}

void CpuBackend::xent_loss_from_stats(const Tensor& losses, const Tensor& lse, const Tensor& row_max,
                                      const Tensor& sumexp, const Tensor& target_logit, int N) {
  const char* op = "xent_loss_from_stats";
  need(losses, op, "losses", N);
  need(lse, op, "lse", N);
  need(row_max, op, "row_max", N);
  need(sumexp, op, "sumexp", N);
  need(target_logit, op, "target_logit", N);
  auto a = open({&losses, &lse, &row_max, &sumexp, &target_logit});
  by_real(losses.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::xent_loss_from_stats(ptr<R>(losses, op, "losses"), ptr<R>(lse, op, "lse"),
                              static_cast<const R*>(ptr<R>(row_max, op, "row_max")),
                              static_cast<const R*>(ptr<R>(sumexp, op, "sumexp")),
                              static_cast<const R*>(ptr<R>(target_logit, op, "target_logit")), N);
  });
}

void CpuBackend::xent_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                     const Tensor& targets, double dloss, int N, int Vs, int v0, int valid) {
  const char* op = "xent_shard_backward";
  need(dlogits, op, "dlogits", int64_t{N} * Vs);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(lse, op, "lse", N);
  need(targets, op, "targets", N);
  auto a = open({&dlogits, &logits, &lse, &targets});
  by_real(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    ops::xent_shard_backward(ptr<R>(dlogits, op, "dlogits"), static_cast<const R*>(ptr<R>(logits, op, "logits")),
                             static_cast<const R*>(ptr<R>(lse, op, "lse")), targets.data<int32_t>(), static_cast<R>(dloss),
                             N, Vs, v0, valid);
  });
}

// ---- reductions

double CpuBackend::sum(const Tensor& x) {
  need(x, "sum", "x", -1);
  auto a = open({&x});
  double s = 0.0;
  by_real(x.dtype(), "sum", [&](auto r) {
    using R = decltype(r);
    const R* p = ptr<R>(x, "sum", "x");
    for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(p[i]);
  });
  return s;
}

void CpuBackend::sum_squares_into(const Tensor& acc, int64_t index, const Tensor& x) {
  need(acc, "sum_squares_into", "acc", index + 1);
  need(x, "sum_squares_into", "x", -1);
  auto a = open({&acc, &x});
  double s = 0.0;
  by_real(x.dtype(), "sum_squares_into", [&](auto r) {
    using R = decltype(r);
    const R* p = ptr<R>(x, "sum_squares_into", "x");
    const int64_t n = x.numel();
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * static_cast<double>(p[i]);
  });
  ptr<double>(acc, "sum_squares_into", "acc")[index] += s;
}

void CpuBackend::count_nonfinite_into(const Tensor& acc, int64_t index, const Tensor& x) {
  need(acc, "count_nonfinite_into", "acc", index + 1);
  need(x, "count_nonfinite_into", "x", -1);
  auto a = open({&acc, &x});
  int64_t bad = 0;
  by_real(x.dtype(), "count_nonfinite_into", [&](auto r) {
    using R = decltype(r);
    const R* p = ptr<R>(x, "count_nonfinite_into", "x");
    if constexpr (std::is_same_v<R, float>) {
      // Exponent bits all ones = NaN or Inf. On the bits with 32-bit counters the loop
      // vectorises (std::isfinite per element did not: 1.8 GB/s, a tenth of a 124M step).
      const int64_t n = x.numel();
      for (int64_t i0 = 0; i0 < n; i0 += int64_t{1} << 20) {
        const int64_t i1 = std::min(n, i0 + (int64_t{1} << 20));
        uint32_t c = 0;
        for (int64_t i = i0; i < i1; ++i) c += (std::bit_cast<uint32_t>(p[i]) & 0x7f800000u) == 0x7f800000u;
        bad += c;
      }
    } else {
      for (int64_t i = 0; i < x.numel(); ++i) bad += !std::isfinite(p[i]);
    }
  });
  ptr<double>(acc, "count_nonfinite_into", "acc")[index] += static_cast<double>(bad);
}

void CpuBackend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                       const AdamWConfig& cfg, float weight_decay, const AdamWStep& step, const Tensor& compute_copy) {
  const char* op = "adamw";
  need(param, op, "param", -1);
  need(grad, op, "grad", param.numel());
  need(m, op, "m", param.numel());
  need(v, op, "v", param.numel());
  if (compute_copy.defined()) {
    need(compute_copy, op, "compute_copy", param.numel());
    // The CPU backends compute in the master's own type: their compute copy is a plain copy.
    if (compute_copy.dtype() != param.dtype())
      TRIAX_THROW(ConfigError, "backend {}: the cpu backend keeps no {} compute copy of {} weights", op,
                  dtype_name(compute_copy.dtype()), dtype_name(param.dtype()));
  }
  auto a = open({&param, &grad, &m, &v, &compute_copy});
  const size_t n = static_cast<size_t>(param.numel());
  by_real(param.dtype(), op, [&](auto r) {
    using R = decltype(r);
    adamw_update(std::span<R>(ptr<R>(param, op, "param"), n), std::span<const R>(ptr<R>(grad, op, "grad"), n),
                 std::span<R>(ptr<R>(m, op, "m"), n), std::span<R>(ptr<R>(v, op, "v"), n), cfg, weight_decay, step);
    if (compute_copy.defined() && compute_copy.raw_data() != param.raw_data())
      std::memcpy(compute_copy.raw_data(), param.raw_data(), n * sizeof(R));
  });
}

// ---- MoE row moves

void CpuBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& index, int rows, int C) {
  const char* op = "gather_rows";
  need(out, op, "out", int64_t{rows} * C);
  need(in, op, "in", -1);
  need(index, op, "index", rows);
  auto a = open({&out, &in, &index});
  const int32_t* ix = index.data<int32_t>();
  const int64_t in_rows = in.numel() / std::max(C, 1);
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    R* po = ptr<R>(out, op, "out");
    const R* pi = ptr<R>(in, op, "in");
    for (int i = 0; i < rows; ++i) {
      if (ix[i] < 0 || ix[i] >= in_rows)
        TRIAX_THROW(ConfigError, "backend {}: row index {} at {} outside [0, {})", op, ix[i], i, in_rows);
      std::memcpy(po + static_cast<size_t>(i) * C, pi + static_cast<size_t>(ix[i]) * C, sizeof(R) * C);
    }
  });
}

void CpuBackend::scatter_add_rows(const Tensor& out, const Tensor& in, const Tensor& index, const Tensor& scale,
                                  int rows, int C) {
  const char* op = "scatter_add_rows";
  need(out, op, "out", -1);
  need(in, op, "in", int64_t{rows} * C);
  need(index, op, "index", rows);
  if (scale.defined()) need(scale, op, "scale", rows);
  auto a = open({&out, &in, &index, &scale});
  const int32_t* ix = index.data<int32_t>();
  const int64_t out_rows = out.numel() / std::max(C, 1);
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    R* po = ptr<R>(out, op, "out");
    const R* pi = ptr<R>(in, op, "in");
    const R* ps = ptr<R>(scale, op, "scale");
    for (int i = 0; i < rows; ++i) {
      if (ix[i] < 0 || ix[i] >= out_rows)
        TRIAX_THROW(ConfigError, "backend {}: row index {} at {} outside [0, {})", op, ix[i], i, out_rows);
      R* dst = po + static_cast<size_t>(ix[i]) * C;
      const R* src = pi + static_cast<size_t>(i) * C;
      const R g = ps ? ps[i] : R(1);
      for (int c = 0; c < C; ++c) dst[c] += g * src[c];
    }
  });
}

void CpuBackend::row_dots(const Tensor& dots, const Tensor& x, const Tensor& y, int rows, int C) {
  const char* op = "row_dots";
  need(dots, op, "dots", rows);
  need(x, op, "a", int64_t{rows} * C);
  need(y, op, "b", int64_t{rows} * C);
  auto a = open({&dots, &x, &y});
  double* pd = ptr<double>(dots, op, "dots");
  by_real(x.dtype(), op, [&](auto r) {
    using R = decltype(r);
    const R* pa = ptr<R>(x, op, "a");
    const R* pb = ptr<R>(y, op, "b");
    for (int i = 0; i < rows; ++i) {
      double s = 0.0;
      for (int c = 0; c < C; ++c)
        s += static_cast<double>(pa[static_cast<size_t>(i) * C + c]) * pb[static_cast<size_t>(i) * C + c];
      pd[i] = s;
    }
  });
}

void CpuBackend::scale_rows(const Tensor& out, const Tensor& in, const Tensor& scale, int rows, int C) {
  const char* op = "scale_rows";
  need(out, op, "out", int64_t{rows} * C);
  need(in, op, "in", int64_t{rows} * C);
  need(scale, op, "scale", rows);
  auto a = open({&out, &in, &scale});
  by_real(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    R* po = ptr<R>(out, op, "out");
    const R* pi = ptr<R>(in, op, "in");
    const R* ps = ptr<R>(scale, op, "scale");
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < C; ++c) po[static_cast<size_t>(i) * C + c] = ps[i] * pi[static_cast<size_t>(i) * C + c];
  });
}

// ---- host copies

std::vector<float> to_host_f32(Backend& be, const Tensor& t) {
  if (t.dtype() != DType::f32) TRIAX_THROW(ConfigError, "to_host_f32 of a {} tensor", dtype_name(t.dtype()));
  std::vector<float> out(static_cast<size_t>(t.numel()));
  be.copy_to_host(out.data(), t, out.size() * sizeof(float));
  return out;
}

void from_host_f32(Backend& be, const Tensor& t, std::span<const float> src) {
  if (t.dtype() != DType::f32 || static_cast<size_t>(t.numel()) != src.size())
    TRIAX_THROW(ConfigError, "from_host_f32: {} floats into {}", src.size(), t.str());
  be.copy_from_host(t, src.data(), src.size_bytes());
}

std::unique_ptr<Backend> make_cpu_backend(DType compute) { return std::make_unique<CpuBackend>(compute); }

}  // namespace triax
