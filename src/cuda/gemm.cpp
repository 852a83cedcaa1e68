// cuBLASLt GEMM: row-major C = alpha op(A) op(B) + beta C is computed as the column-major
// C^T = alpha op(B)^T op(A)^T, i.e. cuBLAS's "A" is our B and its "B" is our A, with m = N, n = M.
// Each distinct problem (shape, transposes, types, epilogue, pointer alignments) gets a plan:
// descriptors plus the first algorithm cuBLASLt's heuristic proposes, kept for the object's life.
#include "triax/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <type_traits>

#include "triax/core/cuda_check.h"
#include "triax/core/error.h"
#include "triax/cuda/nvtx.h"

namespace triax::cuda {
namespace {

template <class T>
constexpr cudaDataType_t cuda_type() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, bf16> || std::is_same_v<T, f16>);
  if constexpr (std::is_same_v<T, float>) return CUDA_R_32F;
  else if constexpr (std::is_same_v<T, bf16>) return CUDA_R_16BF;
  else return CUDA_R_16F;
}

// The largest power of two (<= 256) dividing the address: what cuBLASLt may assume of it.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 1;
  while (al < 256 && a % (2 * al) == 0) al *= 2;
  return al;
}

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu: return CUBLASLT_EPILOGUE_GELU;
    case Epilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::gelu_aux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
  }
  TRIAX_THROW(ConfigError, "cuda::CublasLtGemm: unknown epilogue {}", static_cast<int>(e));
}

bool uses_bias(Epilogue e) { return e == Epilogue::bias || e == Epilogue::gelu_bias || e == Epilogue::gelu_aux_bias; }
bool uses_aux(Epilogue e) { return e == Epilogue::gelu_aux || e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu; }

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const T& v) {
  TRIAX_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof(v)));
}
template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a, const T& v) {
  TRIAX_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(p, a, &v, sizeof(v)));
}

// ta, tb, M, N, K, lda, ldb, ldc, in type, out type, epilogue, ld_aux, alignments of A, B, C, bias, aux
using PlanKey = std::array<int64_t, 17>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // cuBLAS's A: our B
  cublasLtMatrixLayout_t b = nullptr;  // cuBLAS's B: our A
  cublasLtMatrixLayout_t c = nullptr;  // C and D
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (c) (void)cublasLtMatrixLayoutDestroy(c);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { TRIAX_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { (void)cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

}  // namespace

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none: return "none";
    case Epilogue::bias: return "bias";
    case Epilogue::gelu: return "gelu";
    case Epilogue::gelu_bias: return "gelu_bias";
    case Epilogue::gelu_aux: return "gelu_aux";
    case Epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case Epilogue::dgelu: return "dgelu";
  }
  return "?";
}

struct CublasLtGemm::Impl {
  size_t ws_bytes;
  int device = -1;
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<PlanKey, Plan> plans;

  explicit Impl(size_t ws) : ws_bytes(ws) {}
  ~Impl() {
    plans.clear();
    if (workspace) (void)cudaFree(workspace);
    if (handle) (void)cublasLtDestroy(handle);
  }

  // First use: bind to the current device, create the handle and the workspace.
  void ready() {
    int dev = -1;
    TRIAX_CHECK_CUDA(cudaGetDevice(&dev));
    if (device < 0) {
      TRIAX_CHECK_CUBLAS(cublasLtCreate(&handle));
      if (ws_bytes) TRIAX_CHECK_CUDA(cudaMalloc(&workspace, ws_bytes));
      device = dev;
    } else if (dev != device) {
      TRIAX_THROW(ConfigError, "cuda::CublasLtGemm: made for device {} but called with device {} current", device, dev);
    }
  }
};

CublasLtGemm::CublasLtGemm(size_t workspace_bytes) : impl_(std::make_unique<Impl>(workspace_bytes)) {}
CublasLtGemm::~CublasLtGemm() = default;
size_t CublasLtGemm::plan_count() const { return impl_->plans.size(); }
size_t CublasLtGemm::workspace_bytes() const { return impl_->ws_bytes; }

template <class In, class Out>
void CublasLtGemm::matmul(Trans ta, Trans tb, int M, int N, int K, float alpha, const In* A, int lda, const In* B,
                          int ldb, float beta, Out* C, int ldc, const EpilogueArgs<Out>& epi, cudaStream_t stream) {
  constexpr bool half_in = std::is_same_v<In, bf16> || std::is_same_v<In, f16>;
  static_assert((std::is_same_v<In, float> && std::is_same_v<Out, float>) ||
                    (half_in && (std::is_same_v<Out, float> || std::is_same_v<Out, In>)),
                "CublasLtGemm::matmul: (In, Out) must be (float, float), (bf16, float), (bf16, bf16), (f16, float) "
                "or (f16, f16)");
  const char* op = "cuda::CublasLtGemm::matmul";
  const NvtxRange range(op);
  if (M <= 0 || N <= 0 || K <= 0) TRIAX_THROW(ConfigError, "{}: sizes M={} N={} K={} must be positive", op, M, N, K);
  const bool a_t = ta == Trans::yes, b_t = tb == Trans::yes;
  if (lda < (a_t ? M : K))
    TRIAX_THROW(ConfigError, "{}: lda={} is less than {} (A is {}x{}, row-major)", op, lda, a_t ? M : K, a_t ? K : M,
                a_t ? M : K);
  if (ldb < (b_t ? K : N))
    TRIAX_THROW(ConfigError, "{}: ldb={} is less than {} (B is {}x{}, row-major)", op, ldb, b_t ? K : N, b_t ? N : K,
                b_t ? K : N);
  if (ldc < N) TRIAX_THROW(ConfigError, "{}: ldc={} is less than N={}", op, ldc, N);
  if (!A || !B || !C) TRIAX_THROW(ConfigError, "{}: {} is null", op, !A ? "A" : (!B ? "B" : "C"));
  const Epilogue e = epi.kind;
  lt_epilogue(e);  // rejects values outside the enum
  if (e != Epilogue::none && beta != 0.0f)
    TRIAX_THROW(ConfigError, "{}: epilogue {} needs beta == 0, got beta = {}", op, epilogue_name(e), beta);
  if (uses_bias(e) != (epi.bias != nullptr))
    TRIAX_THROW(ConfigError, "{}: epilogue {} {} a bias, but bias is {}", op, epilogue_name(e),
                uses_bias(e) ? "needs" : "takes no", epi.bias ? "given" : "null");
  if (uses_aux(e) != (epi.aux != nullptr))
    TRIAX_THROW(ConfigError, "{}: epilogue {} {} an aux matrix, but aux is {}", op, epilogue_name(e),
                uses_aux(e) ? "needs" : "takes no", epi.aux ? "given" : "null");
  if (uses_aux(e) && (epi.ld_aux < N || epi.ld_aux % 8 != 0))
    TRIAX_THROW(ConfigError, "{}: ld_aux={} must be >= N={} and a multiple of 8 (cuBLASLt)", op, epi.ld_aux, N);

  Impl& im = *impl_;
  im.ready();
  const PlanKey key{static_cast<int64_t>(ta), static_cast<int64_t>(tb), M, N, K, lda, ldb, ldc,
                    static_cast<int64_t>(cuda_type<In>()), static_cast<int64_t>(cuda_type<Out>()),
                    static_cast<int64_t>(e), uses_aux(e) ? epi.ld_aux : 0, alignment_of(A), alignment_of(B),
                    alignment_of(C), alignment_of(epi.bias), alignment_of(epi.aux)};
  auto [it, fresh] = im.plans.try_emplace(key);
  Plan& p = it->second;
  try {
    if (fresh) {
      TRIAX_CHECK_CUBLAS(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSA, b_t ? CUBLAS_OP_T : CUBLAS_OP_N);
      set_attr(p.op, CUBLASLT_MATMUL_DESC_TRANSB, a_t ? CUBLAS_OP_T : CUBLAS_OP_N);
      set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(e));
      if (uses_bias(e)) {
        set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type<Out>()));
        set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(epi.bias));
      }
      if (uses_aux(e)) {
        set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, static_cast<int32_t>(cuda_type<Out>()));
        set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(epi.ld_aux));
        set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(epi.aux));
      }
      // Column-major views: our row-major X (r, c) with row stride ld is X^T (c rows, r cols), ld.
      TRIAX_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, cuda_type<In>(), b_t ? K : N, b_t ? N : K, ldb));
      TRIAX_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, cuda_type<In>(), a_t ? M : K, a_t ? K : M, lda));
      TRIAX_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, cuda_type<Out>(), N, M, ldc));
      Preference pref;
      set_pref(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(im.ws_bytes));
      set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(B));
      set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(A));
      set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(C));
      set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(C));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st =
          cublasLtMatmulAlgoGetHeuristic(im.handle, p.op, p.a, p.b, p.c, p.c, pref.p, 1, &result, &found);
      if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))
        TRIAX_THROW(DeviceError,
                    "{}: cuBLASLt has no algorithm for M={} N={} K={} ta={} tb={} lda={} ldb={} ldc={} in={} out={} "
                    "epilogue={} (alignments A={} B={} C={})",
                    op, M, N, K, a_t, b_t, lda, ldb, ldc, dtype_name(dtype_of<In>()), dtype_name(dtype_of<Out>()),
                    epilogue_name(e), alignment_of(A), alignment_of(B), alignment_of(C));
      TRIAX_CHECK_CUBLAS(st);
      p.algo = result.algo;
    } else {
      if (uses_bias(e)) set_attr(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(epi.bias));
      if (uses_aux(e)) set_attr(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(epi.aux));
    }
  } catch (...) {
    im.plans.erase(it);
    throw;
  }
  TRIAX_CHECK_CUBLAS(cublasLtMatmul(im.handle, p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo,
                                    im.workspace, im.ws_bytes, stream));
}

template void CublasLtGemm::matmul<float, float>(Trans, Trans, int, int, int, float, const float*, int, const float*,
                                                 int, float, float*, int, const EpilogueArgs<float>&, cudaStream_t);
template void CublasLtGemm::matmul<bf16, float>(Trans, Trans, int, int, int, float, const bf16*, int, const bf16*, int,
                                                float, float*, int, const EpilogueArgs<float>&, cudaStream_t);
template void CublasLtGemm::matmul<bf16, bf16>(Trans, Trans, int, int, int, float, const bf16*, int, const bf16*, int,
                                               float, bf16*, int, const EpilogueArgs<bf16>&, cudaStream_t);
template void CublasLtGemm::matmul<f16, float>(Trans, Trans, int, int, int, float, const f16*, int, const f16*, int,
                                               float, float*, int, const EpilogueArgs<float>&, cudaStream_t);
template void CublasLtGemm::matmul<f16, f16>(Trans, Trans, int, int, int, float, const f16*, int, const f16*, int,
                                             float, f16*, int, const EpilogueArgs<f16>&, cudaStream_t);

}  // namespace triax::cuda
