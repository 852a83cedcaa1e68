// Backend: the seam between the training step and the machine it runs on. The model, the
// parameter store, the gradient buffers, the optimizer and the executor say *what* to compute on
// buffers they never dereference; a Backend (passed explicitly, like a Communicator) owns those
// buffers on its device, orders work on its stream and decides *how*. docs/ARCHITECTURE.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "triax/core/device.h"
#include "triax/core/dtype.h"
#include "triax/distributed/comm/comm.h"
#include "triax/ops/grad_mode.h"
#include "triax/ops/adamw_config.h"
#include "triax/ops/attention.h"
#include "triax/tensor/tensor.h"

namespace triax {

// A point in a backend's stream of work: record() returns one, wait() orders later work after it,
// and synchronize() blocks the host until it is reached. The CPU backend runs in order on the
// calling thread, so its events are complete as soon as they exist.
class BackendEvent {
 public:
  virtual ~BackendEvent() = default;
  virtual bool ready() const = 0;   // non-blocking
  virtual void synchronize() = 0;   // blocks the host until reached
};

// Every operation of the training step. Buffers are Tensors made by this backend (empty/zeros):
// dense (contiguous) views with a dtype and a device. Shapes are given beside each op as in
// llm.c: N rows (tokens), C channels, IC/OC in/out features. Activations and parameters share an
// element type per op (compute_dtype(): f32, bf16/f16 under mixed precision, or f64 for gradient
// checks on the CPU); statistics (mean, rstd, lse, xent stats, losses) are f32 (f64 on an f64
// backend); parameter gradients have their
// own type (f32 everywhere on the CUDA backend, the activation type on the CPU reference), which is
// why a grad appears as its own Tensor in every signature. Parameter gradients always accumulate
// (+=); input gradients are written, or added with ops::GradMode::accumulate.
class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string_view name() const = 0;  // "cpu", "cpu-checked", "cpu-emulated", "cuda"
  virtual Device device() const = 0;
  // The element type of activations and of the compute copy of the weights (f32 unless the
  // backend was built for another precision).
  virtual DType compute_dtype() const = 0;
  // Whether host code may touch this backend's buffers through Tensor::data<T>() (true for the
  // plain CPU backend; false for the checking backend and for devices). Only tests, file I/O and
  // benchmarks use it; the library goes through copies.
  virtual bool host_accessible() const = 0;

  // ---- memory. empty() is uninitialised; zeros() is zero-filled.
  virtual Tensor empty(const Shape& shape, DType dtype) = 0;
  Tensor zeros(const Shape& shape, DType dtype);
  // Bytes currently allocated through this backend and their high-water mark (allocator-measured).
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;

  // ---- copies and fills. host <-> device copies are synchronous for the host pointer.
  virtual void copy_from_host(const Tensor& dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src, size_t nbytes) = 0;
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same numel and dtype, dense
  // dst = src converted to dst's element type (same numel, dense; dtypes may differ): the masters
  // cast into the compute copy of mixed precision (round to nearest even). Same dtype: a copy.
  // The CPU backends convert between float32 and float64 only and refuse other pairs.
  virtual void cast(const Tensor& dst, const Tensor& src) = 0;
  virtual void fill(const Tensor& x, double value) = 0;
  virtual void scale(const Tensor& x, double a) = 0;                    // x *= a
  virtual void axpy(const Tensor& y, double a, const Tensor& x) = 0;    // y += a x
  // Rows [row0, row0 + rows) of x (rows, C) receive rows of src, row i of x from row
  // (row0 + i) % period of src: the position embedding (period = T) added to a sequence's rows.
  virtual void add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) = 0;
  // The backward of add_rows_periodic: dsrc[(row0 + i) % period] += dx[i].
  virtual void sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) = 0;
  // y (N, C) += b (C) on every row; db (C) += the column sums of d (N, C), in a fixed row order.
  virtual void add_bias(const Tensor& y, const Tensor& b, int N, int C) = 0;
  virtual void bias_grad(const Tensor& db, const Tensor& d, int N, int C) = 0;
  // out = a + b (any may alias).
  virtual void residual(const Tensor& out, const Tensor& a, const Tensor& b) = 0;

  // ---- layers.
  // out (N, OC) = inp (N, IC) w^T (OC, IC) + bias (OC, optional: an undefined Tensor for none).
  virtual void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, int N,
                              int IC, int OC) = 0;
  // dinp (N, IC) = dout w (optional); dw += dout^T inp (optional); db += colsum(dout) (optional).
  virtual void linear_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                               const Tensor& inp, const Tensor& w, int N, int IC, int OC,
                               ops::GradMode dinp_mode = ops::GradMode::overwrite) = 0;
  virtual void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                 const Tensor& w, const Tensor& b, int N, int C) = 0;
  virtual void layernorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                  const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd, int N,
                                  int C, ops::GradMode dinp_mode = ops::GradMode::overwrite) = 0;
  // RMSNorm (HF LlamaRMSNorm): out = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), the sum of
  // squares and rstd in f32 (f64 on an f64 backend) whatever the activation type; rstd (N) saved.
  virtual void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w, int N, int C,
                               double eps) = 0;
  // dinp (N, C) written (or added with accumulate); dw (C) += sum over rows of dout * x * rstd.
  virtual void rmsnorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout, const Tensor& inp,
                                const Tensor& w, const Tensor& rstd, int N, int C,
                                ops::GradMode dinp_mode = ops::GradMode::overwrite) = 0;
  virtual void gelu_forward(const Tensor& out, const Tensor& inp) = 0;
  virtual void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) = 0;  // may alias
  // SwiGLU on the fused gate/up projection h (N, 2F), row n = [gate (F) | up (F)]:
  // out (N, F) = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
  virtual void swiglu_forward(const Tensor& out, const Tensor& h, int N, int F) = 0;
  // dh (N, 2F) = [dout * up * silu'(gate) | dout * silu(gate)] (written; dh may not alias h).
  virtual void swiglu_backward(const Tensor& dh, const Tensor& dout, const Tensor& h, int N, int F) = 0;
  // Rotary position embedding (HF's rotate-half layout), in place on the query and key heads of
  // qkv (B, T, (NH + 2 NKV) * HD) (the value heads are untouched): for token t and i < HD/2,
  // (x_i, x_{i+HD/2}) <- (x_i cos - x_{i+HD/2} sin, x_{i+HD/2} cos + x_i sin) with cos, sin =
  // table[t][i]; tables (T, HD/2) in the statistics type (f32, f64 on an f64 backend). Under mixed
  // precision the rotation computes in f32 and rounds once.
  virtual void rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                            int HD) = 0;
  // Its backward, in place on dqkv: the inverse rotation (sin negated) of the q and k gradients.
  virtual void rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                             int HD) = 0;
  // Causal self-attention, heads split over channels: qkv (B, T, C + 2 NKV HD) -> out (B, T, C),
  // lse (B, NH, T), HD = C / NH. Per token qkv holds [NH query heads | NKV key heads | NKV value
  // heads]; query head h reads key/value head h / (NH / NKV) (grouped-query attention). NKV = 0
  // means NH (multi-head: qkv (B, T, 3C)). Every override repeats the default.
  virtual void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C,
                                 int NH, int NKV = 0) = 0;
  // out is the forward output (B, T, C): the CUDA kernel reads rowsum(dout * out) from it; the CPU
  // reference recomputes what it needs and only checks its size. dqkv (like qkv) written in full:
  // a key/value head's gradient sums over the query heads of its group.
  virtual void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                  const Tensor& lse, int B, int T, int C, int NH, int NKV = 0) = 0;
  // Context-parallel (ring) attention, one block of queries against one key/value block
  // (ops/attention.h AttentionBlock: rows, true positions, the causal mask from them). Forward
  // merges the block into the running out (B, q_T, C) / lse (B, NH, q_T) rows (lse = -inf: none
  // yet); backward adds the block's share to dq (q's layout) and dkv (kv's layout), from the final
  // out and lse. Every override repeats the default.
  virtual void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                       const ops::AttentionBlock& blk) = 0;
  virtual void attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                        const Tensor& kv, const Tensor& out, const Tensor& lse,
                                        const ops::AttentionBlock& blk) = 0;
  // dst (rows, dst_width) columns [dst_col0, dst_col0 + ncols) = src (rows, src_width) columns
  // [src_col0, ...): a strided copy of one element type (packs K/V out of qkv, and back).
  virtual void copy_columns(const Tensor& dst, const Tensor& src, int64_t rows, int dst_width, int dst_col0,
                            int src_width, int src_col0, int ncols) = 0;
  // Vocab-sharded lookup: rows of tokens (i32, N) outside [v0, v1) give zeros (the TP reduction
  // fills them in); wte (v1 - v0, C). Backward accumulates into dwte.
  virtual void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, int N, int C, int v0,
                                 int v1) = 0;
  virtual void embedding_backward(const Tensor& dwte, const Tensor& dout, const Tensor& tokens, int N, int C, int v0,
                                  int v1) = 0;
  // Vocab-parallel cross-entropy pieces (ops/softmax_xent.h): logits (N, Vs) cover global
  // columns [v0, v0 + Vs); columns at or past valid_vocab are padding.
  virtual void xent_shard_max(const Tensor& row_max, const Tensor& logits, int N, int Vs, int v0, int valid) = 0;
  virtual void xent_shard_sumexp(const Tensor& sumexp, const Tensor& logits, const Tensor& row_max, int N, int Vs,
                                 int v0, int valid) = 0;
  virtual void xent_shard_target_logit(const Tensor& target_logit, const Tensor& logits, const Tensor& targets, int N,
                                       int Vs, int v0, int valid) = 0;
  virtual void xent_loss_from_stats(const Tensor& losses, const Tensor& lse, const Tensor& row_max,
                                    const Tensor& sumexp, const Tensor& target_logit, int N) = 0;
  virtual void xent_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                   const Tensor& targets, double dloss, int N, int Vs, int v0, int valid) = 0;

  // ---- recurrent cell (forecast/lstm.h): PyTorch's nn.LSTM cell, gates in the order i, f, g, o.
  // gates (B, 4H), row b = [i (H) | f (H) | g (H) | o (H)], holds the pre-activations
  // x W_ih^T + b_ih + h_prev W_hh^T + b_hh on entry and the activations [sigmoid(i) | sigmoid(f) |
  // tanh(g) | sigmoid(o)] on return (saved for the backward); c (B, H) = f * c_prev + i * g and
  // h (B, H) = o * tanh(c) are written. c_prev (B, H) may alias c; h may not alias gates.
  virtual void lstm_cell_forward(const Tensor& h, const Tensor& c, const Tensor& gates, const Tensor& c_prev, int B,
                                 int H) = 0;
  // Its backward through one step: dh (B, H) is the gradient of h; dc (B, H) holds on entry the
  // gradient carried into c from the step after and on return the gradient of c_prev; dgates
  // (B, 4H) is written with the gradient of the pre-activations. gates, c and c_prev are the
  // forward's (gates activated).
  virtual void lstm_cell_backward(const Tensor& dgates, const Tensor& dc, const Tensor& dh, const Tensor& gates,
                                  const Tensor& c, const Tensor& c_prev, int B, int H) = 0;

  // ---- reductions that end on the host (one small read-back each).
  virtual double sum(const Tensor& x) = 0;  // in double, fixed order
  // acc (f64, n) [index] += sum of squares of x, in double: the pieces of a gradient norm gathered
  // on the device and read back once.
  virtual void sum_squares_into(const Tensor& acc, int64_t index, const Tensor& x) = 0;
  // acc (f64, n) [index] += the number of non-finite elements of x (loss-scaler check, NaN attribution).
  virtual void count_nonfinite_into(const Tensor& acc, int64_t index, const Tensor& x) = 0;

  // ---- optimizer: one fused AdamW pass on fp32 master weights, grads and moments (ops/adamw_config.h).
  // compute_copy (optional: an undefined Tensor for none) receives the updated weights rounded to
  // its own element type (the bf16/fp16 compute copy of mixed precision) in the same pass; a
  // compute copy of the master's own type is a plain copy.
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWConfig& cfg, float weight_decay, const AdamWStep& step,
                     const Tensor& compute_copy = Tensor()) = 0;

  // ---- mixture of experts (model/moe.h). Row moves keep the routing on the host (the counts feed
  // all_to_all_v there anyway) and the rows on the device.
  // out row r = in row index[r] (index: i32 host-provided indices, a device Tensor). in (*, C).
  virtual void gather_rows(const Tensor& out, const Tensor& in, const Tensor& index, int rows, int C) = 0;
  // out row index[r] += scale[r] * in row r (scale optional: undefined for 1).
  virtual void scatter_add_rows(const Tensor& out, const Tensor& in, const Tensor& index, const Tensor& scale,
                                int rows, int C) = 0;
  // dots[r] = <a row r, b row r> (f64 out, for gate gradients).
  virtual void row_dots(const Tensor& dots, const Tensor& a, const Tensor& b, int rows, int C) = 0;
  // out row r = scale[r] * in row r.
  virtual void scale_rows(const Tensor& out, const Tensor& in, const Tensor& scale, int rows, int C) = 0;

  // ---- ordering. The CPU backend runs in order on the calling thread: record() gives a complete
  // event, wait() and synchronize() return at once.
  virtual std::shared_ptr<BackendEvent> record() = 0;
  virtual void wait(const BackendEvent& e) = 0;  // later work on this backend's stream waits for e
  virtual void synchronize() = 0;

  // Communication. A Communicator of a host kind (Self, MPI) reads and writes host memory; the
  // backend hands it the span of a buffer here. The checking backend opens the pages of the span
  // for the call and closes them when the Work completes (CheckedComm); the CUDA backend returns
  // device spans for NCCL, which orders them on its own stream after record().
  // The communicator this backend's buffers travel on: world itself for the plain CPU and CUDA
  // backends; the checking backend wraps it so that a call opens the pages of its spans.
  virtual std::shared_ptr<Communicator> adapt(std::shared_ptr<Communicator> world) { return world; }
  template <class T>
  std::span<T> comm_span(const Tensor& t) {
    return std::span<T>(t.data<T>(), static_cast<size_t>(t.numel()));
  }
};

// The plain CPU reference backend (OpenBLAS GEMMs, OpenMP loops, fp32 or fp64).
std::unique_ptr<Backend> make_cpu_backend(DType compute = DType::f32);
// A CPU backend whose buffers are mapped PROT_NONE except while one of its own calls (or a
// communicator call on them, see checked_comm.h) runs: any read or write of buffer memory from
// model, optimizer, executor or trainer code faults at once (SIGSEGV), which tests/dist turn into a
// failure naming the address.
std::unique_ptr<Backend> make_checked_cpu_backend(DType compute = DType::f32);

// Host copies for tests, I/O and benchmarks (not for the training step's hot path).
std::vector<float> to_host_f32(Backend& be, const Tensor& t);
void from_host_f32(Backend& be, const Tensor& t, std::span<const float> src);

}  // namespace triax
