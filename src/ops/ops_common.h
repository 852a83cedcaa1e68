// Private helpers shared by the CPU ops: argument checks and the deterministic column sum.
// Determinism rule of every CPU op: a value is reduced by one thread in a fixed order, and which
// thread does it never changes the order, so the bits do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>

#include <omp.h>

#include "triax/core/error.h"

namespace triax::ops::detail {

// Below this many elements of work a loop runs on the calling thread: forking costs more.
inline constexpr int64_t kParallelMinWork = int64_t{1} << 15;
// Columns per task in column-partitioned reductions (a multiple of every SIMD width).
inline constexpr int64_t kColumnBlock = 64;

inline void require_positive(const char* op, const char* what, int64_t v) {
  if (v <= 0) TRIAX_THROW(ConfigError, "{}: {} must be positive, got {}", op, what, v);
}
inline void require_pointer(const char* op, const char* what, const void* p) {
  if (!p) TRIAX_THROW(ConfigError, "{}: {} is null", op, what);
}

// Runs fn(i0, i1) on [0, n) split into one contiguous range per thread (multiples of 64
// elements), or on the calling thread alone unless parallel. For element-wise loops, whose bits
// cannot depend on the split; fn must not throw (it runs inside an OpenMP region).
template <class Fn>
void parallel_ranges(int64_t n, bool parallel, const Fn& fn) {
  if (!parallel) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = ((n + nt - 1) / nt + 63) / 64 * 64;
    const int64_t i0 = std::min(n, t * chunk), i1 = std::min(n, i0 + chunk);
    if (i0 < i1) fn(i0, i1);
  }
}

// acc[c] += sum over r of x[r * ld + c], for c < cols. Partitioned by column blocks, rows summed
// in order: the same bits for any thread count.
template <class Real>
void add_column_sums(Real* acc, const Real* x, int64_t rows, int64_t cols, int64_t ld) {
  const int64_t nblocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMinWork && nblocks > 1)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    const int64_t w = std::min(kColumnBlock, cols - c0);
    Real sum[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const Real* xr = x + r * ld + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) sum[c] += xr[c];
    }
    for (int64_t c = 0; c < w; ++c) acc[c0 + c] += sum[c];
  }
}

}  // namespace triax::ops::detail
