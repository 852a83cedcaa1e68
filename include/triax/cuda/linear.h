// The fully connected layer on the GPU, the contract of ops/linear.h (out = inp @ W^T + b, W stored
// (out_features, in_features)): cuBLASLt GEMMs (src/cuda/linear.cpp) plus a deterministic
// column sum for the bias gradient (kernels/linear_bias.cu). Parameter gradients are fp32.
#pragma once
#include "triax/core/dtype.h"
#include "triax/cuda/gemm.h"
#include "triax/cuda/stream.h"
#include "triax/ops/grad_mode.h"

namespace triax::cuda {

// out = inp @ weight^T + bias (bias may be nullptr): one GEMM, the bias added by cuBLASLt's bias
// epilogue. Real is float, bf16 or f16 (fp32 accumulation, one rounding to Real). ConfigError for a
// non-positive size or a null out/inp/weight; DeviceError as CublasLtGemm::matmul.
template <class Real>
void linear_forward(Real* out,           // (N, OC)
                    const Real* inp,     // (N, IC)
                    const Real* weight,  // (OC, IC)
                    const Real* bias,    // (OC) or nullptr
                    int N, int IC, int OC, CublasLtGemm& gemm, cudaStream_t stream);

// dinp (=, or += with GradMode::accumulate) = dout @ weight, in Real; dweight += dout^T @ inp and
// dbias += column sums of dout are parameter gradients: fp32 whatever Real is (docs/CUDA.md,
// "Gradient types"). The weight gradient is one GEMM with (In, Out) = (Real, float) and beta = 1:
// cuBLASLt reads and writes the fp32 accumulator, computing in fp32. Any of dinp, dweight, dbias
// may be nullptr to skip it; inp is needed only for dweight, weight only for dinp.
template <class Real>
void linear_backward(Real* dinp,          // (N, IC) or nullptr
                     float* dweight,      // (OC, IC) fp32, += ; or nullptr
                     float* dbias,        // (OC) fp32, += ; or nullptr
                     const Real* dout,    // (N, OC)
                     const Real* inp,     // (N, IC)
                     const Real* weight,  // (OC, IC)
                     int N, int IC, int OC, ops::GradMode dinp_mode, CublasLtGemm& gemm, cudaStream_t stream);

// dbias[c] += sum over rows n of dout[n, c], in fp32, deterministic without atomics (fixed chunks
// of rows give per-column partials, rows in order; one thread per column adds the chunks in order
// onto the old value). Scratch for the partials from cudaMallocAsync on the stream. Real is float,
// bf16 or f16. ConfigError for a non-positive size or a null pointer.
template <class Real>
void linear_bias_backward(float* dbias,       // (OC) fp32, +=
                          const Real* dout,   // (N, OC)
                          int N, int OC, cudaStream_t stream);

}  // namespace triax::cuda
