// Private helpers shared by the CPU ops: argument checks, the deterministic column-block
// reductions and the input-gradient row write (assign or accumulate).
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

// Runs fn(c0, w) on the columns [0, cols) in blocks of kColumnBlock (columns c0 .. c0 + w, the
// last block shorter), the blocks in parallel when parallel and there are several. For the
// per-column reductions: a column stays with one thread, which adds its rows in order, so the bits
// do not depend on the thread count. fn must not throw (it runs inside an OpenMP region).
template <class Fn>
void for_each_column_block(int64_t cols, bool parallel, const Fn& fn) {
  const int64_t nblocks = (cols + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static) if (parallel && nblocks > 1)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kColumnBlock;
    fn(c0, std::min(kColumnBlock, cols - c0));
  }
}

// acc[c] += sum over r of x[r * ld + c], for c < cols. Partitioned by column blocks, rows summed
// in order: the same bits for any thread count.
template <class Real>
void add_column_sums(Real* acc, const Real* x, int64_t rows, int64_t cols, int64_t ld) {
  for_each_column_block(cols, rows * cols >= kParallelMinWork, [&](int64_t c0, int64_t w) {
    Real sum[kColumnBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const Real* xr = x + r * ld + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) sum[c] += xr[c];
    }
    for (int64_t c = 0; c < w; ++c) acc[c0 + c] += sum[c];
  });
}

// One row of an input gradient: dx[c] = g(c) for c < C, or dx[c] += g(c) when accumulating.
template <class Real, class G>
void write_grad_row(Real* dx, int C, bool accumulate, const G& g) {
  if (accumulate) {
#pragma omp simd
    for (int c = 0; c < C; ++c) dx[c] += g(c);
  } else {
#pragma omp simd
    for (int c = 0; c < C; ++c) dx[c] = g(c);
  }
}

}  // namespace triax::ops::detail
