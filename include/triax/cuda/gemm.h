// GEMMs on the GPU through cuBLASLt (src/cuda/gemm.cpp), with the row-major contract of
// ops::gemm: C = alpha op(A) op(B) + beta C. fp32, bf16 or fp16 inputs, fp32 accumulation, fp32
// output or the input's 16-bit type, optional fused epilogue (bias, GELU, GELU saving its input
// for backward, GELU backward). A plan (descriptors + the heuristic's algorithm) is made once per
// distinct problem and cached.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"
#include "triax/ops/transpose.h"

namespace triax::cuda {

using ops::Trans;

// What happens to pre = alpha op(A) op(B) (+ bias) before it is stored in C. Every epilogue but
// `none` requires beta == 0. GELU is GPT-2's tanh form (cuBLASLt's GELU epilogue).
enum class Epilogue : uint8_t {
  none,           // C = alpha op(A) op(B) + beta C
  bias,           // C = pre, bias added
  gelu,           // C = gelu(pre)
  gelu_bias,      // C = gelu(pre), bias added first
  gelu_aux,       // C = gelu(pre), aux = pre (for dgelu)
  gelu_aux_bias,  // C = gelu(pre), aux = pre, bias added first
  dgelu,          // C = pre * gelu'(aux): backward through a gelu_aux GEMM (aux is read)
};

const char* epilogue_name(Epilogue e);

// Epilogue operands. bias: (N), one value per output column (the linear layer's bias), in the
// output type. aux: (M, N) row-major with row stride ld_aux (>= N, a multiple of 8), output type.
template <class Out>
struct EpilogueArgs {
  Epilogue kind = Epilogue::none;
  const Out* bias = nullptr;
  Out* aux = nullptr;  // written by gelu_aux*, read by dgelu
  int ld_aux = 0;
};

// One cuBLASLt handle, one workspace and the plan cache, for one device (the current device at
// the first matmul; later calls on another device are a ConfigError). Not thread-safe: one per
// thread or stream family. Nothing touches CUDA until the first matmul, so argument errors are
// reported (ConfigError) even on machines without a GPU.
class CublasLtGemm {
 public:
  static constexpr size_t kDefaultWorkspace = size_t{32} << 20;  // what Hopper kernels may use

  explicit CublasLtGemm(size_t workspace_bytes = kDefaultWorkspace);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Row-major, as ops::gemm: C is (M, N) with row stride ldc >= N; op(A) is (M, K): A is (M, K)
  // with lda >= K when ta == no, (K, M) with lda >= M when yes; op(B) is (K, N) likewise.
  // (In, Out) in {(float, float), (bf16, float), (bf16, bf16), (f16, float), (f16, f16)} (bf16 is
  // CUDA_R_16BF, f16 CUDA_R_16F); compute is fp32 for every pair (CUBLAS_COMPUTE_32F: no TF32,
  // never fp16 accumulation), alpha and beta fp32; bias and aux are in Out and the epilogue rules
  // are the same for every pair. A weight gradient is a parameter gradient, so fp32 whatever the
  // activation type: it is matmul<Real, float> with beta = 1 into the fp32 accumulator (the linear
  // layer's backward in linear.h does exactly that). ConfigError for bad sizes, leading
  // dimensions, null pointers, a bad epilogue combination; DeviceError when cuBLASLt has no
  // algorithm for the problem (naming it) or a call fails.
  template <class In, class Out>
  void matmul(Trans ta, Trans tb, int M, int N, int K, float alpha, const In* A, int lda, const In* B, int ldb,
              float beta, Out* C, int ldc, const EpilogueArgs<Out>& epilogue, cudaStream_t stream);

  template <class In, class Out>
  void matmul(Trans ta, Trans tb, int M, int N, int K, float alpha, const In* A, int lda, const In* B, int ldb,
              float beta, Out* C, int ldc, cudaStream_t stream) {
    matmul<In, Out>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, EpilogueArgs<Out>{}, stream);
  }

  // Distinct problems planned so far (each ran the heuristic once).
  size_t plan_count() const;
  size_t workspace_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace triax::cuda
