// The CUDA backend's own kernels (kernels/backend_ops.cu): the Backend ops that have no layer
// kernel of their own - fills, scaling, axpy, bias rows, periodic rows, deterministic reductions
// in double, non-finite counts, the MoE row moves. Host launchers; the stream comes last. The
// index arithmetic the kernels share with their host emulation (tests/unit/cuda) lives here as
// __host__ __device__ functions in namespace rowmap, so odd sizes and tails are tested on the CPU.
// This header includes no CUDA header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "triax/core/dtype.h"
#include "triax/cuda/stream.h"

#if defined(__CUDACC__)
#define TRIAX_ROWMAP_HD __host__ __device__
#else
#define TRIAX_ROWMAP_HD
#endif

namespace triax::cuda {

// ---- index arithmetic shared by the kernels and their CPU emulation.
namespace rowmap {

// add_rows_periodic: row i of x receives row (row0 + i) % period of src (row0 >= 0, period > 0).
TRIAX_ROWMAP_HD inline int periodic_src_row(int i, int row0, int period) {
  return static_cast<int>((int64_t{row0} + i) % period);
}

// sum_rows_periodic: the smallest i >= 0 with periodic_src_row(i, row0, period) == p. The thread
// that owns row p of dsrc walks i = first, first + period, ... < rows: the CPU op's row order.
TRIAX_ROWMAP_HD inline int periodic_first_row(int p, int row0, int period) {
  const int r = row0 % period;
  return (p - r + period) % period;
}

// Fixed-order reductions: n elements are cut into reduce_blocks(n) contiguous block ranges (the
// cut depends only on n); thread t of a block adds elements begin + t, begin + t + threads, ...;
// then a fixed tree per block, then one block adds the block partials in index order.
inline constexpr int kReduceThreads = 256;
inline constexpr int kReduceMaxBlocks = 1024;
TRIAX_ROWMAP_HD inline int reduce_blocks(int64_t n) {
  const int64_t b = (n + kReduceThreads - 1) / kReduceThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kReduceMaxBlocks ? kReduceMaxBlocks : b));
}
struct Range {
  int64_t begin, end;
};
TRIAX_ROWMAP_HD inline Range block_range(int64_t n, int nblocks, int b) {
  const int64_t chunk = (n + nblocks - 1) / nblocks;
  int64_t begin = chunk * b, end = begin + chunk;
  if (begin > n) begin = n;
  if (end > n) end = n;
  return {begin, end};
}

// Grid-stride element loops: how many elements thread `tid` of `stride` threads visits in [0, n).
TRIAX_ROWMAP_HD inline int64_t grid_stride_count(int64_t n, int64_t tid, int64_t stride) {
  return tid >= n ? 0 : (n - tid + stride - 1) / stride;
}

// Vectorised element-wise kernels (scale, axpy): when every pointer is 16-byte aligned, the first
// vec_tail_begin(n, W) elements go as vec_count(n, W) packs of W = 16 / sizeof(element), one pack
// per grid-stride step, and the tail [vec_tail_begin, n) element by element.
TRIAX_ROWMAP_HD inline int64_t vec_count(int64_t n, int W) { return n / W; }
TRIAX_ROWMAP_HD inline int64_t vec_tail_begin(int64_t n, int W) { return n / W * W; }

// scatter_add_rows after a stable sort of the destination rows: position i of the sorted order
// starts a run (and does the run's work) when its key differs from the one before it.
TRIAX_ROWMAP_HD inline bool run_head(const int32_t* sorted_keys, int i) { return i == 0 || sorted_keys[i - 1] != sorted_keys[i]; }

}  // namespace rowmap

// ---- fill: the bit pattern of `value` in dtype dt (element size dtype_size(dt)), computed on the
// host: floats round to nearest even (bf16/f16 as triax::bf16(float)/f16(float)), integers
// truncate toward zero like static_cast. Any value is allowed (NaN, inf, negative).
inline uint64_t fill_bits(DType dt, double value) {
  uint64_t bits = 0;
  auto put = [&](const auto& v) { std::memcpy(&bits, &v, sizeof v); };
  switch (dt) {
    case DType::f32: put(static_cast<float>(value)); break;
    case DType::f64: put(value); break;
    case DType::bf16: put(bf16(static_cast<float>(value))); break;
    case DType::f16: put(f16(static_cast<float>(value))); break;
    case DType::i32: put(static_cast<int32_t>(value)); break;
    case DType::i64: put(static_cast<int64_t>(value)); break;
    case DType::u8: put(static_cast<uint8_t>(value)); break;
  }
  return bits;
}

// x[i] = bits (elem_bytes of them: 1, 2, 4 or 8) for i < n.
void fill_pattern(void* x, int64_t n, int elem_bytes, uint64_t bits, cudaStream_t stream);

// Element-wise on Real in {float, double, bf16, f16} (fp32 arithmetic for the 16-bit types,
// double for double, one rounding per stored element).
template <class Real>
void scale(Real* x, int64_t n, double a, cudaStream_t stream);  // x *= a
template <class Real>
void axpy(Real* y, double a, const Real* x, int64_t n, cudaStream_t stream);  // y += a x

// x (rows, C) += src[periodic_src_row(i)] (period, C). Real in {float, bf16, f16}; src of type Src = Real.
template <class Real>
void add_rows_periodic(Real* x, const Real* src, int rows, int C, int row0, int period, cudaStream_t stream);
// dsrc (period, C) += dx rows, one thread per dsrc element walking its rows in order (no atomics,
// the CPU op's order). Grad is float (parameter gradient) or Real.
template <class Grad, class Real>
void sum_rows_periodic(Grad* dsrc, const Real* dx, int rows, int C, int row0, int period, cudaStream_t stream);
// y (N, C) += b (C) on every row.
template <class Real>
void add_bias(Real* y, const Real* b, int N, int C, cudaStream_t stream);

// Reductions in double with the fixed order of rowmap (bits depend only on n).
enum class ReduceKind : uint8_t { sum, sumsq, nonfinite };
// *acc += (sum: the sum of x; sumsq: of its squares; nonfinite: the number of NaN/inf elements). acc is a
// device double. Real in {float, double, bf16, f16}. Scratch (reduce_blocks(n) doubles) from the
// stream's arena (cuda/scratch.h).
template <class Real>
void reduce_into(double* acc, const Real* x, int64_t n, ReduceKind kind, cudaStream_t stream);

// Device-side argument errors (row indices live on the device, so a bad one is found there): the
// first bad index an op sees is recorded, and the backend reports it at its next host
// synchronisation. Layout of the device words: [code, position, value, bound].
enum class RowError : int64_t { none = 0, gather_rows = 1, scatter_add_rows = 2 };
inline constexpr int kRowErrorWords = 4;

// out row r = in row index[r] (r < rows), elem_bytes per element (2, 4 or 8); a bad index
// (outside [0, in_rows)) fills the row with all-ones bits (NaN for floats) and is recorded.
void gather_rows(void* out, const void* in, const int32_t* index, int rows, int C, int64_t in_rows, int elem_bytes,
                 int64_t* row_error, cudaStream_t stream);
// out row index[r] += scale[r] * in row r (scale may be nullptr: 1). Deterministic: the row
// numbers are stably radix-sorted by destination (CUB), and one block per distinct destination
// adds its rows in ascending r onto the old value, one thread per column (fp32 arithmetic for
// bf16/fp16, rounded once; fp32 without contraction for float, so the bits equal the CPU op's). No
// atomics: the same bits on every run, whatever the duplicates. Cost: a sort of `rows` keys and a
// destination that occurs k times is k sequential adds. Real in {float, bf16, f16}. Bad indices
// (outside [0, out_rows)) are skipped and recorded. Scratch from the stream's arena.
template <class Real>
void scatter_add_rows(Real* out, const Real* in, const int32_t* index, const Real* scale, int rows, int C,
                      int64_t out_rows, int64_t* row_error, cudaStream_t stream);
// dots[r] = sum over c of a[r, c] * b[r, c] in double (one warp per row, fixed order).
template <class Real>
void row_dots(double* dots, const Real* a, const Real* b, int rows, int C, cudaStream_t stream);
// out row r = scale[r] * in row r (out may alias in).
template <class Real>
void scale_rows(Real* out, const Real* in, const Real* scale, int rows, int C, cudaStream_t stream);

}  // namespace triax::cuda
