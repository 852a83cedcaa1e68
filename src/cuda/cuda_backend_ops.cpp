// CudaBackend's layers, rows, optimizer and MoE row moves: each op checks its buffers as the CPU
// backend does (defined, on this device, dense, large enough, of the right element type), then
// enqueues the launcher on the compute stream. Activations are float32, bfloat16 or float16 (Real);
// parameter gradients and statistics are float32 whatever Real is.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>

#include "cuda_backend_impl.h"
#include "triax/core/cuda_check.h"
#include "triax/cuda/adamw.h"
#include "triax/cuda/attention.h"
#include "triax/cuda/cudnn_attention.h"
#include "triax/cuda/backend_ops.h"
#include "triax/cuda/embedding.h"
#include "triax/cuda/gelu.h"
#include "triax/cuda/layernorm.h"
#include "triax/cuda/linear.h"
#include "triax/cuda/rmsnorm.h"
#include "triax/cuda/rope.h"
#include "triax/cuda/softmax_xent.h"
#include "triax/cuda/lstm.h"
#include "triax/cuda/swiglu.h"
#include "triax/ops/layernorm.h"

namespace triax::cuda {

using namespace backend_detail;

namespace {
// The backend sees a vocabulary shard [v0, v1), not the full vocabulary (as the CPU backend).
constexpr int kAnyVocab = std::numeric_limits<int>::max();

// Elements per token of qkv for attention with NKV key/value heads (0: NH): C + 2 NKV (C / NH).
// ConfigError for head counts that do not fit (checked before any size is computed from them).
int64_t qkv_width(const char* op, int C, int NH, int NKV) {
  if (NH <= 0 || C <= 0 || C % NH != 0)
    TRIAX_THROW(ConfigError, "backend {}: NH={} heads must be positive and divide C={}", op, NH, C);
  const int nkv = NKV == 0 ? NH : NKV;
  if (nkv < 0 || NH % nkv != 0)
    TRIAX_THROW(ConfigError, "backend {}: NKV={} key/value heads must be positive and divide NH={}", op, NKV, NH);
  return C + int64_t{2} * nkv * (C / NH);
}
}  // namespace

// ---- rows and biases

void CudaBackend::add_rows_periodic(const Tensor& x, const Tensor& src, int rows, int C, int row0, int period) {
  const char* op = "add_rows_periodic";
  need(x, op, "x", int64_t{rows} * C);
  need(src, op, "src", int64_t{period} * C);
  use_device();
  by_act(x.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::add_rows_periodic(ptr<R>(x, op, "x"), static_cast<const R*>(ptr<R>(src, op, "src")), rows, C, row0, period,
                            stream_);
  });
}

void CudaBackend::sum_rows_periodic(const Tensor& dsrc, const Tensor& dx, int rows, int C, int row0, int period) {
  const char* op = "sum_rows_periodic";
  need(dsrc, op, "dsrc", int64_t{period} * C);
  need(dx, op, "dx", int64_t{rows} * C);
  use_device();
  by_act(dx.dtype(), op, [&](auto r) {
    using R = decltype(r);
    const R* pdx = ptr<R>(dx, op, "dx");
    // dsrc is a parameter gradient (the position embedding's): float32 whatever R is.
    cuda::sum_rows_periodic(grad_ptr(dsrc, op, "dsrc"), pdx, rows, C, row0, period, stream_);
  });
}

void CudaBackend::add_bias(const Tensor& y, const Tensor& b, int N, int C) {
  const char* op = "add_bias";
  need(y, op, "y", int64_t{N} * C);
  need(b, op, "b", C);
  use_device();
  by_act(y.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::add_bias(ptr<R>(y, op, "y"), static_cast<const R*>(ptr<R>(b, op, "b")), N, C, stream_);
  });
}

void CudaBackend::bias_grad(const Tensor& db, const Tensor& d, int N, int C) {
  const char* op = "bias_grad";
  need(db, op, "db", C);
  need(d, op, "d", int64_t{N} * C);
  if (N == 0 || C == 0) return;
  use_device();
  by_act(d.dtype(), op, [&](auto r) {
    using R = decltype(r);
    linear_bias_backward(grad_ptr(db, op, "db"), static_cast<const R*>(ptr<R>(d, op, "d")), N, C, stream_);
  });
}

// ---- layers

void CudaBackend::linear_forward(const Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& bias, int N,
                                 int IC, int OC) {
  const char* op = "linear_forward";
  need(out, op, "out", int64_t{N} * OC);
  need(inp, op, "inp", int64_t{N} * IC);
  need(w, op, "weight", int64_t{OC} * IC);
  if (bias.defined()) need(bias, op, "bias", OC);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::linear_forward(ptr<R>(out, op, "out"), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                         static_cast<const R*>(ptr<R>(w, op, "weight")), static_cast<const R*>(ptr<R>(bias, op, "bias")),
                         N, IC, OC, *gemm_, stream_);
  });
}

void CudaBackend::linear_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
                                  const Tensor& inp, const Tensor& w, int N, int IC, int OC, ops::GradMode mode) {
  const char* op = "linear_backward";
  need(dout, op, "dout", int64_t{N} * OC);
  need(inp, op, "inp", int64_t{N} * IC);
  need(w, op, "weight", int64_t{OC} * IC);
  if (dinp.defined()) need(dinp, op, "dinp", int64_t{N} * IC);
  if (dw.defined()) need(dw, op, "dweight", int64_t{OC} * IC);
  if (db.defined()) need(db, op, "dbias", OC);
  use_device();
  by_act(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::linear_backward(ptr<R>(dinp, op, "dinp"), grad_ptr(dw, op, "dweight"), grad_ptr(db, op, "dbias"),
                          static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                          static_cast<const R*>(ptr<R>(w, op, "weight")), N, IC, OC, mode, *gemm_, stream_);
  });
}

void CudaBackend::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd, const Tensor& inp,
                                    const Tensor& w, const Tensor& b, int N, int C) {
  const char* op = "layernorm_forward";
  need(out, op, "out", int64_t{N} * C);
  need(mean, op, "mean", N);
  need(rstd, op, "rstd", N);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  need(b, op, "bias", C);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::layernorm_forward(ptr<R>(out, op, "out"), stat_ptr(mean, op, "mean"), stat_ptr(rstd, op, "rstd"),
                            static_cast<const R*>(ptr<R>(inp, op, "inp")), static_cast<const R*>(ptr<R>(w, op, "weight")),
                            static_cast<const R*>(ptr<R>(b, op, "bias")), N, C,
                            static_cast<float>(ops::kLayerNormEps), stream_);
  });
}

void CudaBackend::layernorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db, const Tensor& dout,
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
  use_device();
  by_act(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::layernorm_backward(ptr<R>(dinp, op, "dinp"), grad_ptr(dw, op, "dweight"), grad_ptr(db, op, "dbias"),
                             static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                             static_cast<const R*>(ptr<R>(w, op, "weight")), stat_ptr(mean, op, "mean"),
                             stat_ptr(rstd, op, "rstd"), N, C, mode, stream_);
  });
}

void CudaBackend::gelu_forward(const Tensor& out, const Tensor& inp) {
  need(out, "gelu_forward", "out", -1);
  need(inp, "gelu_forward", "inp", out.numel());
  use_device();
  by_act(out.dtype(), "gelu_forward", [&](auto r) {
    using R = decltype(r);
    cuda::gelu_forward(ptr<R>(out, "gelu_forward", "out"), static_cast<const R*>(ptr<R>(inp, "gelu_forward", "inp")),
                       out.numel(), stream_);
  });
}

void CudaBackend::gelu_backward(const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
  const char* op = "gelu_backward";
  need(dinp, op, "dinp", -1);
  need(inp, op, "inp", dinp.numel());
  need(dout, op, "dout", dinp.numel());
  use_device();
  by_act(dinp.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::gelu_backward(ptr<R>(dinp, op, "dinp"), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                        static_cast<const R*>(ptr<R>(dout, op, "dout")), dinp.numel(), stream_);
  });
}

void CudaBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C,
                                    int NH, int NKV) {
  const char* op = "attention_forward";
  const int64_t W = qkv_width(op, C, NH, NKV);
  need(out, op, "out", int64_t{B} * T * C);
  need(lse, op, "lse", int64_t{B} * NH * T);
  need(qkv, op, "qkv", int64_t{B} * T * W);
  use_device();
  // bf16/fp16: cuDNN's fused attention where the build has it and cuDNN takes the shape
  // (TRIAX_ATTENTION, docs/CUDA.md); the kernels of cuda/attention.h otherwise and for fp32.
  if (out.dtype() != DType::f32 && cuda::use_cudnn_attention(out.dtype(), B, T, C, NH, NKV)) {
    if (qkv.dtype() != out.dtype()) TRIAX_THROW(ConfigError, "backend {}: qkv is {}, out is {}", op, dtype_name(qkv.dtype()), dtype_name(out.dtype()));
    cuda::cudnn_attention_forward(out.dtype(), out.raw_data(), stat_ptr(lse, op, "lse"), qkv.raw_data(), B, T, C, NH,
                                  NKV, stream_);
    return;
  }
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::attention_forward(ptr<R>(out, op, "out"), stat_ptr(lse, op, "lse"),
                            static_cast<const R*>(ptr<R>(qkv, op, "qkv")), B, T, C, NH, NKV, stream_);
  });
}

// Context-parallel (ring) attention blocks: kernels/attention_block.cu (lse always f32), sizes as
// the CPU backend checks them.
void CudaBackend::attention_block_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& kv,
                                          const ops::AttentionBlock& blk) {
  const char* op = "attention_block_forward";
  const ops::AttentionBlockSizes n = ops::attention_block_sizes(op, blk);
  need(out, op, "out", n.out);
  need(lse, op, "lse", n.lse);
  need(q, op, "q", n.q);
  need(kv, op, "kv", n.kv);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::attention_block_forward(ptr<R>(out, op, "out"), stat_ptr(lse, op, "lse"),
                                  static_cast<const R*>(ptr<R>(q, op, "q")), static_cast<const R*>(ptr<R>(kv, op, "kv")),
                                  blk, stream_);
  });
}

void CudaBackend::attention_block_backward(const Tensor& dq, const Tensor& dkv, const Tensor& dout, const Tensor& q,
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
  use_device();
  by_act(dq.dtype(), op, [&](auto r) {
    using R = decltype(r);
    const auto in = [&](const Tensor& t, const char* what) { return static_cast<const R*>(ptr<R>(t, op, what)); };
    cuda::attention_block_backward(ptr<R>(dq, op, "dq"), ptr<R>(dkv, op, "dkv"), in(dout, "dout"), in(q, "q"),
                                   in(kv, "kv"), in(out, "out"), stat_ptr(lse, op, "lse"), blk, stream_);
  });
}

void CudaBackend::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, int B, int T, int C, int NH, int NKV) {
  const char* op = "attention_backward";
  const int64_t W = qkv_width(op, C, NH, NKV);
  need(dqkv, op, "dqkv", int64_t{B} * T * W);
  need(dout, op, "dout", int64_t{B} * T * C);
  need(out, op, "out", int64_t{B} * T * C);
  need(qkv, op, "qkv", int64_t{B} * T * W);
  need(lse, op, "lse", int64_t{B} * NH * T);
  use_device();
  if (dqkv.dtype() != DType::f32 && cuda::use_cudnn_attention(dqkv.dtype(), B, T, C, NH, NKV)) {
    for (const Tensor* t : {&dout, &qkv, &out})
      if (t->dtype() != dqkv.dtype())
        TRIAX_THROW(ConfigError, "backend {}: {} and dqkv differ in type", op, t->str());
    cuda::cudnn_attention_backward(dqkv.dtype(), dqkv.raw_data(), dout.raw_data(), qkv.raw_data(), out.raw_data(),
                                   stat_ptr(lse, op, "lse"), B, T, C, NH, NKV, stream_);
    return;
  }
  by_act(dqkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::attention_backward(ptr<R>(dqkv, op, "dqkv"), static_cast<const R*>(ptr<R>(dout, op, "dout")),
                             static_cast<const R*>(ptr<R>(qkv, op, "qkv")), static_cast<const R*>(ptr<R>(out, op, "out")),
                             stat_ptr(lse, op, "lse"), B, T, C, NH, NKV, stream_);
  });
}

void CudaBackend::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, int N, int C, int v0,
                                    int v1) {
  const char* op = "embedding_forward";
  need(out, op, "out", int64_t{N} * C);
  need(tokens, op, "tokens", N);
  need(wte, op, "wte", int64_t{v1 - v0} * C);
  const int32_t* tok = index_ptr(tokens, op, "tokens");
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::embedding_forward(ptr<R>(out, op, "out"), tok, static_cast<const R*>(ptr<R>(wte, op, "wte")),
                            static_cast<const R*>(nullptr), 1, N, C, kAnyVocab, v0, v1, stream_);
  });
}

void CudaBackend::embedding_backward(const Tensor& dwte, const Tensor& dout, const Tensor& tokens, int N, int C,
                                     int v0, int v1) {
  const char* op = "embedding_backward";
  need(dwte, op, "dwte", int64_t{v1 - v0} * C);
  need(dout, op, "dout", int64_t{N} * C);
  need(tokens, op, "tokens", N);
  const int32_t* tok = index_ptr(tokens, op, "tokens");
  use_device();
  by_act(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::embedding_backward(grad_ptr(dwte, op, "dwte"), static_cast<float*>(nullptr),
                             static_cast<const R*>(ptr<R>(dout, op, "dout")), tok, 1, N, C, kAnyVocab, v0, v1, stream_);
  });
}

// ---- vocab-parallel cross-entropy

void CudaBackend::xent_shard_max(const Tensor& row_max, const Tensor& logits, int N, int Vs, int v0, int valid) {
  const char* op = "xent_shard_max";
  need(row_max, op, "row_max", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  use_device();
  by_act(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::xent_shard_max(stat_ptr(row_max, op, "row_max"), static_cast<const R*>(ptr<R>(logits, op, "logits")), N, Vs,
                         v0, valid, stream_);
  });
}

void CudaBackend::xent_shard_sumexp(const Tensor& sumexp, const Tensor& logits, const Tensor& row_max, int N, int Vs,
                                    int v0, int valid) {
  const char* op = "xent_shard_sumexp";
  need(sumexp, op, "sumexp", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(row_max, op, "row_max", N);
  use_device();
  by_act(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::xent_shard_sumexp(stat_ptr(sumexp, op, "sumexp"), static_cast<const R*>(ptr<R>(logits, op, "logits")),
                            stat_ptr(row_max, op, "row_max"), N, Vs, v0, valid, stream_);
  });
}

void CudaBackend::xent_shard_target_logit(const Tensor& target_logit, const Tensor& logits, const Tensor& targets,
                                          int N, int Vs, int v0, int valid) {
  const char* op = "xent_shard_target_logit";
  need(target_logit, op, "target_logit", N);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(targets, op, "targets", N);
  const int32_t* tg = index_ptr(targets, op, "targets");
  use_device();
  by_act(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::xent_shard_target_logit(stat_ptr(target_logit, op, "target_logit"),
                                  static_cast<const R*>(ptr<R>(logits, op, "logits")), tg, N, Vs, v0, valid, stream_);
  });
}

void CudaBackend::xent_loss_from_stats(const Tensor& losses, const Tensor& lse, const Tensor& row_max,
                                       const Tensor& sumexp, const Tensor& target_logit, int N) {
  const char* op = "xent_loss_from_stats";
  need(losses, op, "losses", N);
  need(lse, op, "lse", N);
  need(row_max, op, "row_max", N);
  need(sumexp, op, "sumexp", N);
  need(target_logit, op, "target_logit", N);
  use_device();
  cuda::xent_loss_from_stats(stat_ptr(losses, op, "losses"), stat_ptr(lse, op, "lse"), stat_ptr(row_max, op, "row_max"),
                             stat_ptr(sumexp, op, "sumexp"), stat_ptr(target_logit, op, "target_logit"), N, stream_);
}

void CudaBackend::xent_shard_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& lse,
                                      const Tensor& targets, double dloss, int N, int Vs, int v0, int valid) {
  const char* op = "xent_shard_backward";
  need(dlogits, op, "dlogits", int64_t{N} * Vs);
  need(logits, op, "logits", int64_t{N} * Vs);
  need(lse, op, "lse", N);
  need(targets, op, "targets", N);
  const int32_t* tg = index_ptr(targets, op, "targets");
  use_device();
  by_act(logits.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::xent_shard_backward(ptr<R>(dlogits, op, "dlogits"), static_cast<const R*>(ptr<R>(logits, op, "logits")),
                              stat_ptr(lse, op, "lse"), tg, static_cast<float>(dloss), N, Vs, v0, valid, stream_);
  });
}

// ---- optimizer

void CudaBackend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                        const AdamWConfig& cfg, float weight_decay, const AdamWStep& step, const Tensor& compute_copy) {
  const char* op = "adamw";
  need(param, op, "param", -1);
  need(grad, op, "grad", param.numel());
  need(m, op, "m", param.numel());
  need(v, op, "v", param.numel());
  if (compute_copy.defined()) need(compute_copy, op, "compute_copy", param.numel());
  float* p = f32_ptr(param, op, "param", "master weights");
  float* pm = f32_ptr(m, op, "m", "Adam moments");
  float* pv = f32_ptr(v, op, "v", "Adam moments");
  const int64_t n = param.numel();
  use_device();
  // The launcher's Copy is bf16 or f16 (written in the same pass); a float32 copy is a plain copy.
  auto run = [&](auto g) {
    using G = decltype(g);
    const G* pg = ptr<G>(grad, op, "grad");
    switch (compute_copy.defined() ? compute_copy.dtype() : DType::f32) {
      case DType::bf16: adamw_update<G, bf16>(p, compute_copy.data<bf16>(), pg, pm, pv, n, cfg, weight_decay, step, stream_); break;
      case DType::f16: adamw_update<G, f16>(p, compute_copy.data<f16>(), pg, pm, pv, n, cfg, weight_decay, step, stream_); break;
      case DType::f32:
        adamw_update<G, bf16>(p, nullptr, pg, pm, pv, n, cfg, weight_decay, step, stream_);
        if (compute_copy.defined() && compute_copy.raw_data() != param.raw_data() && n)
          TRIAX_CHECK_CUDA(cudaMemcpyAsync(compute_copy.raw_data(), p, sizeof(float) * n, cudaMemcpyDeviceToDevice,
                                           stream_));
        break;
      default:
        TRIAX_THROW(ConfigError, "backend {}: compute_copy is {}; float32, bfloat16 or float16 expected", op,
                    dtype_name(compute_copy.dtype()));
    }
  };
  switch (grad.dtype()) {
    case DType::f32: run(float{}); return;
    case DType::bf16: run(bf16{}); return;
    case DType::f16: run(f16{}); return;
    default:
      TRIAX_THROW(ConfigError, "backend {}: grad is {}; float32, bfloat16 or float16 expected", op,
                  dtype_name(grad.dtype()));
  }
}

// ---- MoE row moves

void CudaBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& index, int rows, int C) {
  const char* op = "gather_rows";
  need(out, op, "out", int64_t{rows} * C);
  need(in, op, "in", -1);
  need(index, op, "index", rows);
  if (in.dtype() != out.dtype())
    TRIAX_THROW(ConfigError, "backend {}: in is {}, out is {}", op, dtype_name(in.dtype()), dtype_name(out.dtype()));
  by_float(out.dtype(), op, [](auto) {});
  const int32_t* ix = index_ptr(index, op, "index");
  const int64_t in_rows = in.numel() / std::max(C, 1);
  use_device();
  cuda::gather_rows(out.raw_data(), in.raw_data(), ix, rows, C, in_rows, static_cast<int>(out.element_size()),
                    static_cast<int64_t*>(dev_words_), stream_);
}

void CudaBackend::scatter_add_rows(const Tensor& out, const Tensor& in, const Tensor& index, const Tensor& scale,
                                   int rows, int C) {
  const char* op = "scatter_add_rows";
  need(out, op, "out", -1);
  need(in, op, "in", int64_t{rows} * C);
  need(index, op, "index", rows);
  if (scale.defined()) need(scale, op, "scale", rows);
  const int32_t* ix = index_ptr(index, op, "index");
  const int64_t out_rows = out.numel() / std::max(C, 1);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::scatter_add_rows(ptr<R>(out, op, "out"), static_cast<const R*>(ptr<R>(in, op, "in")), ix,
                           static_cast<const R*>(ptr<R>(scale, op, "scale")), rows, C, out_rows,
                           static_cast<int64_t*>(dev_words_), stream_);
  });
}

void CudaBackend::row_dots(const Tensor& dots, const Tensor& a, const Tensor& b, int rows, int C) {
  const char* op = "row_dots";
  need(dots, op, "dots", rows);
  need(a, op, "a", int64_t{rows} * C);
  need(b, op, "b", int64_t{rows} * C);
  double* pd = ptr<double>(dots, op, "dots");
  use_device();
  by_act(a.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::row_dots(pd, static_cast<const R*>(ptr<R>(a, op, "a")), static_cast<const R*>(ptr<R>(b, op, "b")), rows, C,
                   stream_);
  });
}

void CudaBackend::scale_rows(const Tensor& out, const Tensor& in, const Tensor& scale, int rows, int C) {
  const char* op = "scale_rows";
  need(out, op, "out", int64_t{rows} * C);
  need(in, op, "in", int64_t{rows} * C);
  need(scale, op, "scale", rows);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::scale_rows(ptr<R>(out, op, "out"), static_cast<const R*>(ptr<R>(in, op, "in")),
                     static_cast<const R*>(ptr<R>(scale, op, "scale")), rows, C, stream_);
  });
}

// ---- the Llama block: RMSNorm, SwiGLU, rotary positions

void CudaBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp, const Tensor& w, int N,
                                  int C, double eps) {
  const char* op = "rmsnorm_forward";
  need(out, op, "out", int64_t{N} * C);
  need(rstd, op, "rstd", N);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::rmsnorm_forward(ptr<R>(out, op, "out"), stat_ptr(rstd, op, "rstd"),
                          static_cast<const R*>(ptr<R>(inp, op, "inp")), static_cast<const R*>(ptr<R>(w, op, "weight")),
                          N, C, static_cast<float>(eps), stream_);
  });
}

void CudaBackend::rmsnorm_backward(const Tensor& dinp, const Tensor& dw, const Tensor& dout, const Tensor& inp,
                                   const Tensor& w, const Tensor& rstd, int N, int C, ops::GradMode mode) {
  const char* op = "rmsnorm_backward";
  need(dinp, op, "dinp", int64_t{N} * C);
  need(dout, op, "dout", int64_t{N} * C);
  need(inp, op, "inp", int64_t{N} * C);
  need(w, op, "weight", C);
  need(rstd, op, "rstd", N);
  if (dw.defined()) need(dw, op, "dweight", C);
  use_device();
  by_act(dout.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::rmsnorm_backward(ptr<R>(dinp, op, "dinp"), grad_ptr(dw, op, "dweight"),
                           static_cast<const R*>(ptr<R>(dout, op, "dout")), static_cast<const R*>(ptr<R>(inp, op, "inp")),
                           static_cast<const R*>(ptr<R>(w, op, "weight")), stat_ptr(rstd, op, "rstd"), N, C, mode,
                           stream_);
  });
}

void CudaBackend::swiglu_forward(const Tensor& out, const Tensor& h, int N, int F) {
  const char* op = "swiglu_forward";
  need(out, op, "out", int64_t{N} * F);
  need(h, op, "h", int64_t{N} * 2 * F);
  use_device();
  by_act(out.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::swiglu_forward(ptr<R>(out, op, "out"), static_cast<const R*>(ptr<R>(h, op, "h")), N, F, stream_);
  });
}

void CudaBackend::swiglu_backward(const Tensor& dh, const Tensor& dout, const Tensor& h, int N, int F) {
  const char* op = "swiglu_backward";
  need(dh, op, "dh", int64_t{N} * 2 * F);
  need(dout, op, "dout", int64_t{N} * F);
  need(h, op, "h", int64_t{N} * 2 * F);
  if (dh.raw_data() == h.raw_data()) TRIAX_THROW(ConfigError, "backend {}: dh may not alias h", op);
  use_device();
  by_act(dh.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::swiglu_backward(ptr<R>(dh, op, "dh"), static_cast<const R*>(ptr<R>(dout, op, "dout")),
                          static_cast<const R*>(ptr<R>(h, op, "h")), N, F, stream_);
  });
}

void CudaBackend::lstm_cell_forward(const Tensor& h, const Tensor& c, const Tensor& gates, const Tensor& c_prev,
                                    int B, int H) {
  const char* op = "lstm_cell_forward";
  if (B <= 0 || H <= 0) TRIAX_THROW(ConfigError, "backend {}: B={} and H={} must be positive", op, B, H);
  need(h, op, "h", int64_t{B} * H);
  need(c, op, "c", int64_t{B} * H);
  need(gates, op, "gates", int64_t{B} * 4 * H);
  need(c_prev, op, "c_prev", int64_t{B} * H);
  use_device();
  by_act(gates.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::lstm_cell_forward(ptr<R>(h, op, "h"), ptr<R>(c, op, "c"), ptr<R>(gates, op, "gates"),
                            static_cast<const R*>(ptr<R>(c_prev, op, "c_prev")), B, H, stream_);
  });
}

void CudaBackend::lstm_cell_backward(const Tensor& dgates, const Tensor& dc, const Tensor& dh, const Tensor& gates,
                                     const Tensor& c, const Tensor& c_prev, int B, int H) {
  const char* op = "lstm_cell_backward";
  if (B <= 0 || H <= 0) TRIAX_THROW(ConfigError, "backend {}: B={} and H={} must be positive", op, B, H);
  need(dgates, op, "dgates", int64_t{B} * 4 * H);
  need(dc, op, "dc", int64_t{B} * H);
  need(dh, op, "dh", int64_t{B} * H);
  need(gates, op, "gates", int64_t{B} * 4 * H);
  need(c, op, "c", int64_t{B} * H);
  need(c_prev, op, "c_prev", int64_t{B} * H);
  use_device();
  by_act(gates.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::lstm_cell_backward(ptr<R>(dgates, op, "dgates"), ptr<R>(dc, op, "dc"),
                             static_cast<const R*>(ptr<R>(dh, op, "dh")),
                             static_cast<const R*>(ptr<R>(gates, op, "gates")),
                             static_cast<const R*>(ptr<R>(c, op, "c")),
                             static_cast<const R*>(ptr<R>(c_prev, op, "c_prev")), B, H, stream_);
  });
}

namespace {
// The checks of rope_forward/backward's sizes before any size is computed from them.
void rope_sizes(const char* op, int B, int T, int NH, int NKV, int HD) {
  if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || HD <= 0 || HD % 2 != 0)
    TRIAX_THROW(ConfigError, "backend {}: B={} T={} NH={} NKV={} must be positive and HD={} positive and even", op, B,
                T, NH, NKV, HD);
}
}  // namespace

void CudaBackend::rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                               int HD) {
  const char* op = "rope_forward";
  rope_sizes(op, B, T, NH, NKV, HD);
  need(qkv, op, "qkv", int64_t{B} * T * (NH + int64_t{2} * NKV) * HD);
  need(cos, op, "cos", int64_t{T} * (HD / 2));
  need(sin, op, "sin", int64_t{T} * (HD / 2));
  use_device();
  by_act(qkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::rope_forward(ptr<R>(qkv, op, "qkv"), stat_ptr(cos, op, "cos"), stat_ptr(sin, op, "sin"), B, T, NH, NKV, HD,
                       stream_);
  });
}

void CudaBackend::rope_backward(const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int B, int T, int NH, int NKV,
                                int HD) {
  const char* op = "rope_backward";
  rope_sizes(op, B, T, NH, NKV, HD);
  need(dqkv, op, "dqkv", int64_t{B} * T * (NH + int64_t{2} * NKV) * HD);
  need(cos, op, "cos", int64_t{T} * (HD / 2));
  need(sin, op, "sin", int64_t{T} * (HD / 2));
  use_device();
  by_act(dqkv.dtype(), op, [&](auto r) {
    using R = decltype(r);
    cuda::rope_backward(ptr<R>(dqkv, op, "dqkv"), stat_ptr(cos, op, "cos"), stat_ptr(sin, op, "sin"), B, T, NH, NKV,
                        HD, stream_);
  });
}

}  // namespace triax::cuda
