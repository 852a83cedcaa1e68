// CpuBackend: the reference implementation of the Backend seam on host memory - the CPU ops of
// ops/ (OpenBLAS GEMMs, deterministic OpenMP loops) in fp32, or fp64 for gradient checks. Every op
// opens its buffers through open(), which the checking backend (checked_backend.h) overrides to
// make buffer memory accessible only while one of its own calls runs.
#pragma once
#include <atomic>
#include <initializer_list>

#include "triax/backend/backend.h"

namespace triax {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(DType compute = DType::f32);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  DType compute_dtype() const override { return compute_; }
  bool host_accessible() const override { return true; }

  Tensor empty(const Shape& shape, DType dtype) override;
  size_t bytes_in_use() const override { return in_use_.load(); }
  size_t peak_bytes() const override { return peak_.load(); }
  void reset_peak() override { peak_.store(in_use_.load()); }

  void copy_from_host(const Tensor& dst, const void* src, size_t nbytes) override;
  void copy_to_host(void* dst, const Tensor& src, size_t nbytes) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void cast(const Tensor& dst, const Tensor& src) override;
  void fill(const Tensor& x, double value) override;
  void scale(const Tensor& x, double a) override;
  void axpy(const Tensor& y, double a, const Tensor& x) override;
  void add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) override;
  void sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) override;
  void add_bias(const Tensor& y, const Tensor& b, int N, int C) override;
  void bias_grad(const Tensor& db, const Tensor& d, int N, int C) override;
  void residual(const Tensor& out, const Tensor& a, const Tensor& b) override;

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
  void wait(const BackendEvent&) override {}
  void synchronize() override {}

 protected:
  // Makes the listed buffers' memory accessible for the duration of one op (RAII). The plain CPU
  // backend needs nothing; the checking backend unprotects their pages and protects them again.
  class Access {
   public:
    Access() = default;
    explicit Access(CpuBackend* owner) : owner_(owner) {}
    Access(Access&& o) noexcept : owner_(o.owner_) { o.owner_ = nullptr; }
    Access& operator=(Access&&) = delete;
    ~Access() {
      if (owner_ && --owner_->depth_ == 0) owner_->close_all();
    }

   private:
    CpuBackend* owner_ = nullptr;
  };
  Access open(std::initializer_list<const Tensor*> ts);
  virtual void open_range(const void*, size_t) {}
  // Closes every range opened since the outermost open() (the checking backend).
  virtual void close_all() {}
  virtual bool checking() const { return false; }
  // Raw memory for empty(); the checking backend maps pages of its own.
  virtual void* allocate(size_t nbytes);
  virtual void deallocate(void* p, size_t nbytes) noexcept;

 private:
  class Alloc;
  DType compute_;
  std::atomic<size_t> in_use_{0}, peak_{0};
  std::unique_ptr<Alloc> alloc_;
  int depth_ = 0;  // nesting of open(): only the outermost closes
  friend class Access;
};

}  // namespace triax
