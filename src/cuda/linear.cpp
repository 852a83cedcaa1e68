// The linear layer on the GPU as cuBLASLt GEMMs (row-major, as ops::linear): forward with the
// bias epilogue, backward dinp in the activation type and dweight into the fp32 gradient
// (In = Real, Out = float, beta = 1); the bias gradient is the column-sum kernel.
#include "triax/cuda/linear.h"

#include "triax/core/error.h"
#include "triax/cuda/nvtx.h"

namespace triax::cuda {
namespace {

void check_sizes(const char* op, int N, int IC, int OC) {
  if (N <= 0 || IC <= 0 || OC <= 0)
    TRIAX_THROW(ConfigError, "{}: sizes N={} IC={} OC={} must be positive", op, N, IC, OC);
}
void require_pointer(const char* op, const char* what, const void* p, const char* why = "") {
  if (!p) TRIAX_THROW(ConfigError, "{}: {} is null{}", op, what, why);
}

}  // namespace

template <class Real>
void linear_forward(Real* out, const Real* inp, const Real* weight, const Real* bias, int N, int IC, int OC,
                    CublasLtGemm& gemm, cudaStream_t stream) {
  const char* op = "cuda::linear_forward";
  const NvtxRange range(op);
  check_sizes(op, N, IC, OC);
  require_pointer(op, "out", out);
  require_pointer(op, "inp", inp);
  require_pointer(op, "weight", weight);
  EpilogueArgs<Real> epi;
  if (bias) {
    epi.kind = Epilogue::bias;
    epi.bias = bias;
  }
  // out (N, OC) = inp (N, IC) @ weight^T, weight (OC, IC) row-major.
  gemm.matmul<Real, Real>(Trans::no, Trans::yes, N, OC, IC, 1.0f, inp, IC, weight, IC, 0.0f, out, OC, epi, stream);
}

template <class Real>
void linear_backward(Real* dinp, float* dweight, float* dbias, const Real* dout, const Real* inp, const Real* weight,
                     int N, int IC, int OC, ops::GradMode dinp_mode, CublasLtGemm& gemm, cudaStream_t stream) {
  const char* op = "cuda::linear_backward";
  const NvtxRange range(op);
  check_sizes(op, N, IC, OC);
  require_pointer(op, "dout", dout);
  if (dinp) require_pointer(op, "weight", weight, " (needed for dinp)");
  if (dweight) require_pointer(op, "inp", inp, " (needed for dweight)");
  if (dinp) {
    // dinp (N, IC) = dout (N, OC) @ weight (OC, IC).
    gemm.matmul<Real, Real>(Trans::no, Trans::no, N, IC, OC, 1.0f, dout, OC, weight, IC,
                            dinp_mode == ops::GradMode::accumulate ? 1.0f : 0.0f, dinp, IC, stream);
  }
  if (dweight) {
    // dweight (OC, IC) += dout^T (OC, N) @ inp (N, IC), accumulated in the fp32 gradient.
    gemm.matmul<Real, float>(Trans::yes, Trans::no, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dweight, IC, stream);
  }
  if (dbias) linear_bias_backward<Real>(dbias, dout, N, OC, stream);
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int, int, int, CublasLtGemm&,
                                    cudaStream_t);
template void linear_forward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int, int, int, CublasLtGemm&,
                                   cudaStream_t);
template void linear_forward<f16>(f16*, const f16*, const f16*, const f16*, int, int, int, CublasLtGemm&,
                                  cudaStream_t);
template void linear_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int,
                                     ops::GradMode, CublasLtGemm&, cudaStream_t);
template void linear_backward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int, int, int,
                                    ops::GradMode, CublasLtGemm&, cudaStream_t);
template void linear_backward<f16>(f16*, float*, float*, const f16*, const f16*, const f16*, int, int, int,
                                   ops::GradMode, CublasLtGemm&, cudaStream_t);

}  // namespace triax::cuda
