// The emulated mixed-precision backend (backend/emulated_backend.h): the CUDA backend's dtype
// contract checked op by op, the arithmetic done by the plain CPU backend in float32 on widened
// copies of the half-type buffers, whose outputs are rounded back to nearest even.
#include "triax/backend/emulated_backend.h"

#include <initializer_list>
#include <vector>

#include "triax/core/error.h"

namespace triax {

namespace {

// What a buffer of an op is, for the contract: an activation (or the compute copy of a weight),
// a statistic, a parameter gradient (or a master/moment), an f64 accumulator, or anything else
// (i32 indices, a free float buffer): unchecked.
enum class Cls { act, stat, grad, f64, any };

struct Arg {
  const Tensor& t;
  Cls cls;
  const char* what;
  bool out;  // written by the op (rounded back after it)
};

bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }

// Element i of a float buffer of any floating type, as a float; and stored back.
float load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::bf16: return static_cast<float>(t.data<bf16>()[i]);
    case DType::f16: return static_cast<float>(t.data<f16>()[i]);
    case DType::f64: return static_cast<float>(t.data<double>()[i]);
    default: return t.data<float>()[i];
  }
}
void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::bf16: t.data<bf16>()[i] = bf16(static_cast<float>(v)); break;
    case DType::f16: t.data<f16>()[i] = f16(static_cast<float>(v)); break;
    case DType::f64: t.data<double>()[i] = v; break;
    default: t.data<float>()[i] = static_cast<float>(v); break;
  }
}

class EmulatedBackend final : public Backend {
 public:
  explicit EmulatedBackend(DType compute) : cpu_(make_cpu_backend(DType::f32)), ct_(compute) {
    if (!is_half(compute) && compute != DType::f32)
      TRIAX_THROW(ConfigError, "the emulated backend computes in bfloat16, float16 or float32, not {}",
                  dtype_name(compute));
  }

  std::string_view name() const override { return "cpu-emulated"; }
  Device device() const override { return cpu_->device(); }
  DType compute_dtype() const override { return ct_; }
  bool host_accessible() const override { return true; }

  Tensor empty(const Shape& shape, DType dtype) override { return cpu_->empty(shape, dtype); }
  size_t bytes_in_use() const override { return cpu_->bytes_in_use(); }
  size_t peak_bytes() const override { return cpu_->peak_bytes(); }
  void reset_peak() override { cpu_->reset_peak(); }

  void copy_from_host(const Tensor& dst, const void* src, size_t nbytes) override {
    cpu_->copy_from_host(dst, src, nbytes);
  }
  void copy_to_host(void* dst, const Tensor& src, size_t nbytes) override { cpu_->copy_to_host(dst, src, nbytes); }
  void copy(const Tensor& dst, const Tensor& src) override { cpu_->copy(dst, src); }
  void cast(const Tensor& dst, const Tensor& src) override {
    const char* op = "cast";
    defined(dst, op, "dst");
    defined(src, op, "src");
    if (dst.numel() != src.numel())
      TRIAX_THROW(ConfigError, "backend cast: dst {} holds {} elements, src {} holds {}", dst.str(), dst.numel(),
                  src.str(), src.numel());
    if (!dtype_is_float(dst.dtype()) || !dtype_is_float(src.dtype()))
      TRIAX_THROW(ConfigError, "backend cast: {} to {}: floating types only", dtype_name(src.dtype()),
                  dtype_name(dst.dtype()));
    if (dst.dtype() == DType::f64 && src.dtype() == DType::f64) return cpu_->copy(dst, src);
    for (int64_t i = 0; i < dst.numel(); ++i) store(dst, i, load(src, i));
  }
  void fill(const Tensor& x, double value) override {
    if (!is_half(x.dtype())) return cpu_->fill(x, value);
    defined(x, "fill", "x");
    for (int64_t i = 0; i < x.numel(); ++i) store(x, i, value);
  }
  void scale(const Tensor& x, double a) override {
    run("scale", {{x, Cls::any, "x", true}}, [&](auto& w) { cpu_->scale(w[0], a); });
  }
  void axpy(const Tensor& y, double a, const Tensor& x) override {
    if (y.dtype() != x.dtype())
      TRIAX_THROW(ConfigError, "backend axpy: y is {}, x is {}", dtype_name(y.dtype()), dtype_name(x.dtype()));
    run("axpy", {{y, Cls::any, "y", true}, {x, Cls::any, "x", false}}, [&](auto& w) { cpu_->axpy(w[0], a, w[1]); });
  }
  void add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) override {
    run("add_rows_periodic", {{x, Cls::act, "x", true}, {src, Cls::act, "src", false}},
        [&](auto& w) { cpu_->add_rows_periodic(w[0], w[1], rows, C, row0, period); });
  }
  void sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) override {
    run("sum_rows_periodic", {{dsrc, Cls::grad, "dsrc", true}, {dx, Cls::act, "dx", false}},
        [&](auto& w) { cpu_->sum_rows_periodic(w[0], w[1], rows, C, row0, period); });
  }
  void add_bias(const Tensor& y, const Tensor& b, int N, int C) override {
    run("add_bias", {{y, Cls::act, "y", true}, {b, Cls::act, "b", false}},
        [&](auto& w) { cpu_->add_bias(w[0], w[1], N, C); });
  }
  void bias_grad(const Tensor& db, const Tensor& d, int N, int C) override {
    run("bias_grad", {{db, Cls::grad, "db", true}, {d, Cls::act, "d", false}},
        [&](auto& w) { cpu_->bias_grad(w[0], w[1], N, C); });
  }
  void residual(const Tensor& out, const Tensor& a, const Tensor& b) override {
    run("residual", {{out, Cls::act, "out", true}, {a, Cls::act, "a", false}, {b, Cls::act, "b", false}},
        [&](auto& w) { cpu_->residual(w[0], w[1], w[2]); });
  }

  void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, int N, int IC,
                      int OC) override {
    run("linear_forward",
        {{out, Cls::act, "out", true}, {inp, Cls::act, "inp", false}, {w, Cls::act, "weight", false},
         {bias, Cls::act, "bias", false}},
        [&](auto& v) { cpu_->linear_forward(v[0], v[1], v[2], v[3], N, IC, OC); });
  }
  void linear_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& inp,
                       const Tensor& w, int N, int IC, int OC, ops::GradMode mode) override {
    run("linear_backward",
        {{dinp, Cls::act, "dinp", true}, {dw, Cls::grad, "dweight", true}, {db, Cls::grad, "dbias", true},
         {dout, Cls::act, "dout", false}, {inp, Cls::act, "inp", false}, {w, Cls::act, "weight", false}},
        [&](auto& v) { cpu_->linear_backward(v[0], v[1], v[2], v[3], v[4], v[5], N, IC, OC, mode); });
  }
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp, const Tensor& w,
                         const Tensor& b, int N, int C) override {
    run("layernorm_forward",
        {{out, Cls::act, "out", true}, {mean, Cls::stat, "mean", true}, {rstd, Cls::stat, "rstd", true},
         {inp, Cls::act, "inp", false}, {w, Cls::act, "weight", false}, {b, Cls::act, "bias", false}},
        [&](auto& v) { cpu_->layernorm_forward(v[0], v[1], v[2], v[3], v[4], v[5], N, C); });
  }
  void layernorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                          const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd, int N, int C,
                          ops::GradMode mode) override {
    run("layernorm_backward",
        {{dinp, Cls::act, "dinp", true}, {dw, Cls::grad, "dweight", true}, {db, Cls::grad, "dbias", true},
         {dout, Cls::act, "dout", false}, {inp, Cls::act, "inp", false}, {w, Cls::act, "weight", false},
         {mean, Cls::stat, "mean", false}, {rstd, Cls::stat, "rstd", false}},
        [&](auto& v) { cpu_->layernorm_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], N, C, mode); });
  }
  void gelu_forward(const Tensor& out, const Tensor& inp) override {
    run("gelu_forward", {{out, Cls::act, "out", true}, {inp, Cls::act, "inp", false}},
        [&](auto& v) { cpu_->gelu_forward(v[0], v[1]); });
  }
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override {
    run("gelu_backward", {{dinp, Cls::act, "dinp", true}, {inp, Cls::act, "inp", false}, {dout, Cls::act, "dout", false}},
        [&](auto& v) { cpu_->gelu_backward(v[0], v[1], v[2]); });
  }
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w, int N, int C,
                       double eps) override {
    run("rmsnorm_forward",
        {{out, Cls::act, "out", true}, {rstd, Cls::stat, "rstd", true}, {inp, Cls::act, "inp", false},
         {w, Cls::act, "weight", false}},
        [&](auto& v) { cpu_->rmsnorm_forward(v[0], v[1], v[2], v[3], N, C, eps); });
  }
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& rstd, int N, int C, ops::GradMode mode) override {
    run("rmsnorm_backward",
        {{dinp, Cls::act, "dinp", true}, {dw, Cls::grad, "dweight", true}, {dout, Cls::act, "dout", false},
         {inp, Cls::act, "inp", false}, {w, Cls::act, "weight", false}, {rstd, Cls::stat, "rstd", false}},
        [&](auto& v) { cpu_->rmsnorm_backward(v[0], v[1], v[2], v[3], v[4], v[5], N, C, mode); });
  }
  void swiglu_forward(const Tensor& out, const Tensor& h, int N, int F) override {
    run("swiglu_forward", {{out, Cls::act, "out", true}, {h, Cls::act, "h", false}},
        [&](auto& v) { cpu_->swiglu_forward(v[0], v[1], N, F); });
  }
  void lstm_cell_forward(const Tensor& h, const Tensor& c, const Tensor& gates, const Tensor& c_prev, int B,
                         int H) override {
    run("lstm_cell_forward",
        {{h, Cls::act, "h", true}, {c, Cls::act, "c", true}, {gates, Cls::act, "gates", true},
         {c_prev, Cls::act, "c_prev", false}},
        [&](auto& v) { cpu_->lstm_cell_forward(v[0], v[1], v[2], v[3], B, H); });
  }
  void lstm_cell_backward(const Tensor& dgates, const Tensor& dc, const Tensor& dh, const Tensor& gates,
                          const Tensor& c, const Tensor& c_prev, int B, int H) override {
    run("lstm_cell_backward",
        {{dgates, Cls::act, "dgates", true}, {dc, Cls::act, "dc", true}, {dh, Cls::act, "dh", false},
         {gates, Cls::act, "gates", false}, {c, Cls::act, "c", false}, {c_prev, Cls::act, "c_prev", false}},
        [&](auto& v) { cpu_->lstm_cell_backward(v[0], v[1], v[2], v[3], v[4], v[5], B, H); });
  }
  void swiglu_backward(const Tensor& dh, const Tensor& dout, const Tensor& h, int N, int F) override {
    run("swiglu_backward", {{dh, Cls::act, "dh", true}, {dout, Cls::act, "dout", false}, {h, Cls::act, "h", false}},
        [&](auto& v) { cpu_->swiglu_backward(v[0], v[1], v[2], N, F); });
  }
  void rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                    int HD) override {
    run("rope_forward", {{qkv, Cls::act, "qkv", true}, {cos, Cls::stat, "cos", false}, {sin, Cls::stat, "sin", false}},
        [&](auto& v) { cpu_->rope_forward(v[0], v[1], v[2], B, T, NH, NKV, HD); });
  }
  void rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                     int HD) override {
    run("rope_backward", {{dqkv, Cls::act, "dqkv", true}, {cos, Cls::stat, "cos", false}, {sin, Cls::stat, "sin", false}},
        [&](auto& v) { cpu_->rope_backward(v[0], v[1], v[2], B, T, NH, NKV, HD); });
  }
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C,
                         int NH, int NKV = 0) override {
    run("attention_forward", {{out, Cls::act, "out", true}, {lse, Cls::stat, "lse", true}, {qkv, Cls::act, "qkv", false}},
        [&](auto& v) { cpu_->attention_forward(v[0], v[1], v[2], B, T, C, NH, NKV); });
  }
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int B, int T, int C, int NH, int NKV = 0) override {
    run("attention_backward",
        {{dqkv, Cls::act, "dqkv", true}, {dout, Cls::act, "dout", false}, {qkv, Cls::act, "qkv", false},
         {out, Cls::act, "out", false}, {lse, Cls::stat, "lse", false}},
        [&](auto& v) { cpu_->attention_backward(v[0], v[1], v[2], v[3], v[4], B, T, C, NH, NKV); });
  }
  void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                               const ops::AttentionBlock& blk) override {
    run("attention_block_forward",
        {{out, Cls::act, "out", true}, {lse, Cls::stat, "lse", true}, {q, Cls::act, "q", false},
         {kv, Cls::act, "kv", false}},
        [&](auto& v) { cpu_->attention_block_forward(v[0], v[1], v[2], v[3], blk); });
  }
  void attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const ops::AttentionBlock& blk) override {
    run("attention_block_backward",
        {{dq, Cls::act, "dq", true}, {dkv, Cls::act, "dkv", true}, {dout, Cls::act, "dout", false},
         {q, Cls::act, "q", false}, {kv, Cls::act, "kv", false}, {out, Cls::act, "out", false},
         {lse, Cls::stat, "lse", false}},
        [&](auto& v) { cpu_->attention_block_backward(v[0], v[1], v[2], v[3], v[4], v[5], v[6], blk); });
  }
  void copy_columns(const Tensor& dst, const Tensor& src, int64_t rows, int dst_width, int dst_col0, int src_width,
                    int src_col0, int ncols) override {
    cpu_->copy_columns(dst, src, rows, dst_width, dst_col0, src_width, src_col0, ncols);
  }
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, int N, int C, int v0,
                         int v1) override {
    run("embedding_forward", {{out, Cls::act, "out", true}, {tokens, Cls::any, "tokens", false}, {wte, Cls::act, "wte", false}},
        [&](auto& v) { cpu_->embedding_forward(v[0], v[1], v[2], N, C, v0, v1); });
  }
  void embedding_backward(const Tensor& dwte, const Tensor& dout, const Tensor& tokens, int N, int C, int v0,
                          int v1) override {
    run("embedding_backward",
        {{dwte, Cls::grad, "dwte", true}, {dout, Cls::act, "dout", false}, {tokens, Cls::any, "tokens", false}},
        [&](auto& v) { cpu_->embedding_backward(v[0], v[1], v[2], N, C, v0, v1); });
  }
  void xent_shard_max(const Tensor& row_max, const Tensor& logits, int N, int Vs, int v0, int valid) override {
    run("xent_shard_max", {{row_max, Cls::stat, "row_max", true}, {logits, Cls::act, "logits", false}},
        [&](auto& v) { cpu_->xent_shard_max(v[0], v[1], N, Vs, v0, valid); });
  }
  void xent_shard_sumexp(const Tensor& sumexp, const Tensor& logits, const Tensor& row_max, int N, int Vs, int v0,
                         int valid) override {
    run("xent_shard_sumexp",
        {{sumexp, Cls::stat, "sumexp", true}, {logits, Cls::act, "logits", false}, {row_max, Cls::stat, "row_max", false}},
        [&](auto& v) { cpu_->xent_shard_sumexp(v[0], v[1], v[2], N, Vs, v0, valid); });
  }
  void xent_shard_target_logit(const Tensor& target_logit, const Tensor& logits, const Tensor& targets, int N,
                               int Vs, int v0, int valid) override {
    run("xent_shard_target_logit",
        {{target_logit, Cls::stat, "target_logit", true}, {logits, Cls::act, "logits", false},
         {targets, Cls::any, "targets", false}},
        [&](auto& v) { cpu_->xent_shard_target_logit(v[0], v[1], v[2], N, Vs, v0, valid); });
  }
  void xent_loss_from_stats(const Tensor& losses, const Tensor& lse, const Tensor& row_max, const Tensor& sumexp,
                            const Tensor& target_logit, int N) override {
    run("xent_loss_from_stats",
        {{losses, Cls::stat, "losses", true}, {lse, Cls::stat, "lse", true}, {row_max, Cls::stat, "row_max", false},
         {sumexp, Cls::stat, "sumexp", false}, {target_logit, Cls::stat, "target_logit", false}},
        [&](auto& v) { cpu_->xent_loss_from_stats(v[0], v[1], v[2], v[3], v[4], N); });
  }
  void xent_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                           double dloss, int N, int Vs, int v0, int valid) override {
    run("xent_shard_backward",
        {{dlogits, Cls::act, "dlogits", true}, {logits, Cls::act, "logits", false}, {lse, Cls::stat, "lse", false},
         {targets, Cls::any, "targets", false}},
        [&](auto& v) { cpu_->xent_shard_backward(v[0], v[1], v[2], v[3], dloss, N, Vs, v0, valid); });
  }

  double sum(const Tensor& x) override {
    double r = 0;
    run("sum", {{x, Cls::any, "x", false}}, [&](auto& v) { r = cpu_->sum(v[0]); });
    return r;
  }
  void sum_squares_into(const Tensor& acc, int64_t index, const Tensor& x) override {
    run("sum_squares_into", {{acc, Cls::f64, "acc", true}, {x, Cls::any, "x", false}},
        [&](auto& v) { cpu_->sum_squares_into(v[0], index, v[1]); });
  }
  void count_nonfinite_into(const Tensor& acc, int64_t index, const Tensor& x) override {
    run("count_nonfinite_into", {{acc, Cls::f64, "acc", true}, {x, Cls::any, "x", false}},
        [&](auto& v) { cpu_->count_nonfinite_into(v[0], index, v[1]); });
  }

  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
             float weight_decay, const AdamWStep& step, const Tensor& compute_copy) override {
    run("adamw",
        {{param, Cls::grad, "param (master weights)", true}, {grad, Cls::grad, "grad", false},
         {m, Cls::grad, "m (Adam moments)", true}, {v, Cls::grad, "v (Adam moments)", true},
         {compute_copy, Cls::act, "compute_copy", false}},
        [&](auto& w) { cpu_->adamw(w[0], w[1], w[2], w[3], cfg, weight_decay, step); });
    if (compute_copy.defined()) cast(compute_copy, param);
  }

  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& index, int rows, int C) override {
    if (out.dtype() != in.dtype())
      TRIAX_THROW(ConfigError, "backend gather_rows: out is {}, in is {}", dtype_name(out.dtype()), dtype_name(in.dtype()));
    run("gather_rows", {{out, Cls::any, "out", true}, {in, Cls::any, "in", false}, {index, Cls::any, "index", false}},
        [&](auto& v) { cpu_->gather_rows(v[0], v[1], v[2], rows, C); });
  }
  void scatter_add_rows(const Tensor& out, const Tensor& in, const Tensor& index, const Tensor& scale, int rows,
                        int C) override {
    run("scatter_add_rows",
        {{out, Cls::act, "out", true}, {in, Cls::act, "in", false}, {index, Cls::any, "index", false},
         {scale, Cls::act, "scale", false}},
        [&](auto& v) { cpu_->scatter_add_rows(v[0], v[1], v[2], v[3], rows, C); });
  }
  void row_dots(const Tensor& dots, const Tensor& a, const Tensor& b, int rows, int C) override {
    run("row_dots", {{dots, Cls::f64, "dots", true}, {a, Cls::act, "a", false}, {b, Cls::act, "b", false}},
        [&](auto& v) { cpu_->row_dots(v[0], v[1], v[2], rows, C); });
  }
  void scale_rows(const Tensor& out, const Tensor& in, const Tensor& scale, int rows, int C) override {
    run("scale_rows", {{out, Cls::act, "out", true}, {in, Cls::act, "in", false}, {scale, Cls::act, "scale", false}},
        [&](auto& v) { cpu_->scale_rows(v[0], v[1], v[2], rows, C); });
  }

  std::shared_ptr<BackendEvent> record() override { return cpu_->record(); }
  void wait(const BackendEvent& e) override { cpu_->wait(e); }
  void synchronize() override { cpu_->synchronize(); }

 private:
  static void defined(const Tensor& t, const char* op, const char* what) {
    if (!t.defined()) TRIAX_THROW(ConfigError, "backend {}: {} is undefined", op, what);
  }

  // The CUDA backend's contract for one buffer of an op (cuda_backend_ops.cpp).
  void check(const char* op, const Arg& a) const {
    if (!a.t.defined()) return;  // optional buffers; the CPU op checks the required ones
    const DType d = a.t.dtype();
    auto refuse = [&](DType want, const char* cls) {
      TRIAX_THROW(ConfigError, "backend {} (cpu-emulated, computing in {}): {} is {}, but {} must be {}", op,
                  dtype_name(ct_), a.what, dtype_name(d), cls, dtype_name(want));
    };
    switch (a.cls) {
      case Cls::act:
        if (d != ct_) refuse(ct_, "activations and the compute copy of the weights");
        break;
      case Cls::stat:
        if (d != DType::f32) refuse(DType::f32, "statistics (mean, rstd, lse, max, sums, losses)");
        break;
      case Cls::grad:
        if (d != DType::f32) refuse(DType::f32, "parameter gradients, master weights and Adam moments");
        break;
      case Cls::f64:
        if (d != DType::f64) refuse(DType::f64, "an accumulator");
        break;
      case Cls::any:
        break;
    }
  }

  // A float32 copy of a half-type buffer (the buffer itself otherwise).
  Tensor widen(const Tensor& t) {
    if (!t.defined() || !is_half(t.dtype())) return t;
    Tensor w = cpu_->empty(Shape{t.numel()}, DType::f32);
    float* p = w.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = load(t, i);
    return w;
  }

  // Checks every buffer, widens the half-type ones, runs f on the widened list and rounds the
  // written half-type buffers back (round to nearest even).
  template <class F>
  void run(const char* op, std::initializer_list<Arg> args, F&& f) {
    for (const Arg& a : args) check(op, a);
    std::vector<Tensor> w;
    w.reserve(args.size());
    for (const Arg& a : args) w.push_back(widen(a.t));
    f(w);
    size_t k = 0;
    for (const Arg& a : args) {
      const Tensor& src = w[k++];
      if (!a.out || !a.t.defined() || !is_half(a.t.dtype())) continue;
      const float* p = src.data<float>();
      for (int64_t i = 0; i < a.t.numel(); ++i) store(a.t, i, p[i]);
    }
  }

  std::unique_ptr<Backend> cpu_;
  DType ct_;
};

}  // namespace

std::unique_ptr<Backend> make_emulated_backend(DType compute) { return std::make_unique<EmulatedBackend>(compute); }

}  // namespace triax
