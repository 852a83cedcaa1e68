// GEMM on the CPU: a thin, checked wrapper over OpenBLAS cblas_{s,d}gemm (row-major), and the one
// place that knows how BLAS threads meet triax's OpenMP loops.
#pragma once
#include <cstdint>

#include "triax/ops/transpose.h"

namespace triax::ops {

// C = alpha * op(A) * op(B) + beta * C, all row-major. C is (M, N) with row stride ldc >= N;
// op(A) is (M, K): A is (M, K) with lda >= K when ta == no, (K, M) with lda >= M when yes; op(B) is
// (K, N) likewise. beta == 0 ignores what C held (NaN included). ConfigError for a negative size,
// a too-small leading dimension or a null pointer where elements are read or written.
// Instantiated for float and double.
template <class Real>
void gemm(Trans ta, Trans tb, int M, int N, int K, Real alpha, const Real* A, int lda, const Real* B, int ldb, Real beta,
          Real* C, int ldc);

// True when calling gemm from inside an OpenMP parallel region is the efficient choice: BLAS is
// sequential, OpenMP-built (it runs single-threaded inside a parallel region), or limited to one
// thread. False for a multi-threaded pthreads OpenBLAS, whose own pool would fight OpenMP's; ops
// with many small GEMMs (attention) then run their loop serially and let BLAS use the threads.
bool gemm_nests_in_openmp();

// ---- An off-by-default view of every GEMM call, for benchmarks (benchmarks/step_bench.cpp) ----
// With no observer installed (the default) gemm pays one relaxed atomic load per call. With one,
// each call is timed around the BLAS call and reported, from whichever thread made it.

struct GemmCall {
  Trans ta, tb;
  int M, N, K, lda, ldb, ldc;
  bool accumulate;     // beta != 0: C was read
  bool is_double;
  int team_size;       // threads of the enclosing OpenMP parallel region (1 outside one)
  double seconds;      // wall time of the BLAS call on the calling thread
};

class GemmObserver {
 public:
  virtual ~GemmObserver() = default;
  // Called after every gemm while installed, possibly from several threads at once; must be
  // thread-safe and must not throw (it may run inside an OpenMP parallel region).
  virtual void on_gemm(const GemmCall& call) noexcept = 0;
};

// Installs obs (nullptr: none). Not synchronised with gemm calls in flight: install and remove
// between steps, and keep obs alive until it is removed.
void set_gemm_observer(GemmObserver* obs);

}  // namespace triax::ops
