// CudaBackend's class (private to src/cuda: cuda_backend.cpp holds memory, copies, reductions,
// ordering and make_cuda_backend; cuda_backend_ops.cpp the layers, the optimizer and the row
// moves). Public entry points are in include/triax/cuda/cuda_backend.h.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "triax/core/error.h"
#include "triax/cuda/cuda_backend.h"
#include "triax/cuda/gemm.h"
#include "triax/cuda/scratch.h"

struct CUmemPoolHandle_st;

namespace triax::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& opts);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(dev_); }
  DType compute_dtype() const override { return compute_; }
  bool host_accessible() const override { return false; }

  Tensor empty(const Shape& shape, DType dtype) override;
  size_t bytes_in_use() const override { return in_use_.load(); }
  size_t peak_bytes() const override { return peak_.load(); }
  void reset_peak() override;
  // The device pool's cudaMemPoolAttrUsedMemHigh: every stream-ordered allocation from it (this
  // backend's buffers and scratch, and anything else using the device's default pool).
  uint64_t pool_used_high() const;

  void copy_from_host(const Tensor& dst, const void* src, size_t nbytes) override;
  void copy_to_host(void* dst, const Tensor& src, size_t nbytes) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& x, double value) override;
  void scale(const Tensor& x, double a) override;
  void axpy(const Tensor& y, double a, const Tensor& x) override;
  void add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) override;
  void sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) override;
  void add_bias(const Tensor& y, const Tensor& b, int N, int C) override;
  void bias_grad(const Tensor& db, const Tensor& d, int N, int C) override;
  void residual(const Tensor& out, const Tensor& a, const Tensor& b) override;
  // dst = src converted (f32 <-> bf16, f32 <-> f16; the same type is a copy).
  void cast(const Tensor& dst, const Tensor& src) override;

  void linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, int N, int IC,
                      int OC) override;
  void linear_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout, const Tensor& inp,
                       const Tensor& w, int N, int IC, int OC, ops::GradMode dinp_mode) override;
  void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp, const Tensor& w,
                         const Tensor& b, int N, int C) override;
  void layernorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                          const Tensor& inp, const Tensor& w, const Tensor& mean, const Tensor& rstd, int N, int C,
                          ops::GradMode dinp_mode) override;
  void gelu_forward(const Tensor& out, const Tensor& inp) override;
  void gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) override;
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w, int N, int C,
                       double eps) override;
  void rmsnorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout, const Tensor& inp, const Tensor& w,
                        const Tensor& rstd, int N, int C, ops::GradMode dinp_mode) override;
  void swiglu_forward(const Tensor& out, const Tensor& h, int N, int F) override;
  void swiglu_backward(const Tensor& dh, const Tensor& dout, const Tensor& h, int N, int F) override;
  void lstm_cell_forward(const Tensor& h, const Tensor& c, const Tensor& gates, const Tensor& c_prev, int B,
                         int H) override;
  void lstm_cell_backward(const Tensor& dgates, const Tensor& dc, const Tensor& dh, const Tensor& gates,
                          const Tensor& c, const Tensor& c_prev, int B, int H) override;
  void rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                    int HD) override;
  void rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                     int HD) override;
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C,
                         int NH, int NKV = 0) override;
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          const Tensor& lse, int B, int T, int C, int NH, int NKV = 0) override;
  void attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                               const ops::AttentionBlock& blk) override;
  void attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
                                const Tensor& kv, const Tensor& out, const Tensor& lse,
                                const ops::AttentionBlock& blk) override;
  void copy_columns(const Tensor& dst, const Tensor& src, int64_t rows, int dst_width, int dst_col0, int src_width,
                    int src_col0, int ncols) override;
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, int N, int C, int v0,
                         int v1) override;
  void embedding_backward(const Tensor& dwte, const Tensor& dout, const Tensor& tokens, int N, int C, int v0,
                          int v1) override;
  void xent_shard_max(const Tensor& row_max, const Tensor& logits, int N, int Vs, int v0, int valid) override;
  void xent_shard_sumexp(const Tensor& sumexp, const Tensor& logits, const Tensor& row_max, int N, int Vs, int v0,
                         int valid) override;
  void xent_shard_target_logit(const Tensor& target_logit, const Tensor& logits, const Tensor& targets, int N, int Vs,
                               int v0, int valid) override;
  void xent_loss_from_stats(const Tensor& losses, const Tensor& lse, const Tensor& row_max, const Tensor& sumexp,
                            const Tensor& target_logit, int N) override;
  void xent_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse, const Tensor& targets,
                           double dloss, int N, int Vs, int v0, int valid) override;

  double sum(const Tensor& x) override;
  void sum_squares_into(const Tensor& acc, int64_t index, const Tensor& x) override;
  void count_nonfinite_into(const Tensor& acc, int64_t index, const Tensor& x) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWConfig& cfg,
             float weight_decay, const AdamWStep& step, const Tensor& compute_copy) override;

  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& index, int rows, int C) override;
  void scatter_add_rows(const Tensor& out, const Tensor& in, const Tensor& index, const Tensor& scale, int rows,
                        int C) override;
  void row_dots(const Tensor& dots, const Tensor& a, const Tensor& b, int rows, int C) override;
  void scale_rows(const Tensor& out, const Tensor& in, const Tensor& scale, int rows, int C) override;

  std::shared_ptr<BackendEvent> record() override;
  void wait(const BackendEvent& e) override;
  void synchronize() override;
  // The device communicator over world (cuda/device_comm.h): world's host communicator for host
  // spans, NCCL over the same ranks for this backend's buffers (TRIAX_DEVICE_COMM).
  std::shared_ptr<Communicator> adapt(std::shared_ptr<Communicator> world) override;

  cudaStream_t stream() const { return stream_; }
  const ScratchArena& scratch() const { return *arena_; }

 private:
  class Alloc;
  // Makes the backend's device current (one device per rank: it stays current afterwards).
  void use_device() const;
  // The checks of CpuBackend's need(): defined, on this backend's device, dense, large enough.
  void need(const Tensor& t, const char* op, const char* what, int64_t numel) const;
  // Waits for the stream (after enqueuing the read-back of the device row-error words) and throws
  // ConfigError for a bad row index an earlier gather/scatter found on the device.
  void sync_checked(const char* op);
  void host_wait();  // settle_device_waits, then cudaStreamSynchronize
  void* raw_alloc(size_t nbytes);
  void raw_free(void* p, size_t nbytes) noexcept;

  int dev_;
  DType compute_;
  cudaStream_t stream_ = nullptr;
  CUmemPoolHandle_st* pool_ = nullptr;  // cudaMemPool_t of the device (its default pool)
  std::atomic<size_t> in_use_{0}, peak_{0};
  std::unique_ptr<Alloc> alloc_;
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<ScratchArena> arena_;
  // One small device block: kRowErrorWords int64 row-error words, then the double of sum().
  void* dev_words_ = nullptr;
  // Its pinned host mirror (read back at sync_checked and sum).
  void* host_words_ = nullptr;
};

// ---- argument helpers shared by the two source files.
namespace backend_detail {

// Calls f(Real{}) for an activation type the kernels are compiled for (float32, bfloat16 or float16).
template <class F>
void by_act(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16: f(f16{}); return;
    default:
      TRIAX_THROW(ConfigError, "backend {}: the cuda backend computes in float32, bfloat16 or float16, not {}", op,
                  dtype_name(dt));
  }
}

// Element-wise ops: any floating type.
template <class F>
void by_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16: f(f16{}); return;
    default: TRIAX_THROW(ConfigError, "backend {}: {} is not a floating type", op, dtype_name(dt));
  }
}

// The typed pointer of an optional buffer (nullptr when undefined), its dtype checked.
template <class R>
R* ptr(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != dtype_of<R>())
    TRIAX_THROW(ConfigError, "backend {}: {} is {}, the op computes in {}", op, what, dtype_name(t.dtype()),
                dtype_name(dtype_of<R>()));
  return t.data<R>();
}

// Parameter gradients (and fp32 statistics) are float32 on the cuda backend whatever the compute type.
inline float* f32_ptr(const Tensor& t, const char* op, const char* what, const char* why) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != DType::f32)
    TRIAX_THROW(ConfigError, "backend {}: {} is {}; {} are float32 on the cuda backend", op, what,
                dtype_name(t.dtype()), why);
  return t.data<float>();
}
inline float* grad_ptr(const Tensor& t, const char* op, const char* what) {
  return f32_ptr(t, op, what, "parameter gradients");
}
inline float* stat_ptr(const Tensor& t, const char* op, const char* what) {
  return f32_ptr(t, op, what, "statistics (mean, rstd, lse, max, sums, losses)");
}
inline const int32_t* index_ptr(const Tensor& t, const char* op, const char* what) {
  if (t.dtype() != DType::i32) TRIAX_THROW(ConfigError, "backend {}: {} must be int32, not {}", op, what, dtype_name(t.dtype()));
  return t.data<int32_t>();
}

}  // namespace backend_detail
}  // namespace triax::cuda
