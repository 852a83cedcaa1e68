// cblas_{s,d}gemm behind a checked, row-major interface.
#include "triax/ops/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#include "triax/core/clock.h"
#include "triax/core/error.h"

namespace triax::ops {
namespace {

void check_gemm(Trans ta, Trans tb, int M, int N, int K, const void* A, int lda, const void* B, int ldb, const void* C,
                int ldc) {
  if (M < 0 || N < 0 || K < 0) TRIAX_THROW(ConfigError, "gemm: negative size M={} N={} K={}", M, N, K);
  const int a_cols = ta == Trans::no ? K : M;
  const int b_cols = tb == Trans::no ? N : K;
  if (lda < std::max(1, a_cols))
    TRIAX_THROW(ConfigError, "gemm: lda={} is smaller than the {} columns of A (M={} N={} K={}, A {})", lda, a_cols, M, N,
                K, ta == Trans::no ? "not transposed" : "transposed");
  if (ldb < std::max(1, b_cols))
    TRIAX_THROW(ConfigError, "gemm: ldb={} is smaller than the {} columns of B (M={} N={} K={}, B {})", ldb, b_cols, M, N,
                K, tb == Trans::no ? "not transposed" : "transposed");
  if (ldc < std::max(1, N)) TRIAX_THROW(ConfigError, "gemm: ldc={} is smaller than N={}", ldc, N);
  if (M > 0 && N > 0 && !C) TRIAX_THROW(ConfigError, "gemm: C is null for M={} N={}", M, N);
  if (M > 0 && N > 0 && K > 0 && (!A || !B))
    TRIAX_THROW(ConfigError, "gemm: {} is null for M={} N={} K={}", !A ? "A" : "B", M, N, K);
}

CBLAS_TRANSPOSE cblas_trans(Trans t) { return t == Trans::no ? CblasNoTrans : CblasTrans; }

std::atomic<GemmObserver*> g_observer{nullptr};

// Runs blas() and, when an observer is installed, times it and reports the call.
template <class F>
void observed(F&& blas, Trans ta, Trans tb, int M, int N, int K, int lda, int ldb, int ldc, bool accumulate,
              bool is_double) {
  GemmObserver* obs = g_observer.load(std::memory_order_relaxed);
  if (!obs) {
    blas();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  blas();
  const double s = since(t0);
  obs->on_gemm(GemmCall{ta, tb, M, N, K, lda, ldb, ldc, accumulate, is_double, omp_get_num_threads(), s});
}

}  // namespace

void set_gemm_observer(GemmObserver* obs) { g_observer.store(obs, std::memory_order_relaxed); }

template <>
void gemm<float>(Trans ta, Trans tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc) {
  check_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  observed([&] { cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); },
           ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0f, false);
}

template <>
void gemm<double>(Trans ta, Trans tb, int M, int N, int K, double alpha, const double* A, int lda, const double* B,
                  int ldb, double beta, double* C, int ldc) {
  check_gemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  if (M == 0 || N == 0) return;
  observed([&] { cblas_dgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), M, N, K, alpha, A, lda, B, ldb, beta, C, ldc); },
           ta, tb, M, N, K, lda, ldb, ldc, beta != 0.0, true);
}

bool gemm_nests_in_openmp() {
  // openblas_get_parallel: 0 sequential, 1 pthreads, 2 OpenMP.
  return openblas_get_parallel() != 1 || openblas_get_num_threads() <= 1;
}

}  // namespace triax::ops
