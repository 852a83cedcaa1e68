// The CUDA backend's own kernels (cuda/backend_ops.h): the Backend ops with no layer kernel.
// Element-wise kernels are grid-stride loops; float arithmetic is written with the _rn intrinsics
// where the CPU op rounds each step (no contraction into FMA), so fp32 results equal the CPU
// backend's bits. Reductions use the fixed order of rowmap (no atomics on floating values).
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "triax/cuda/backend_ops.h"

namespace triax::cuda {
namespace {
using namespace detail;

// Arithmetic type: fp32 for float and the 16-bit types, double for double.
template <class D>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class D>
using acc_t = typename AccOf<D>::type;

template <class D>
__device__ __forceinline__ acc_t<D> load(D x) {
  return to_f32(x);
}
__device__ __forceinline__ double load(double x) { return x; }
template <class D>
__device__ __forceinline__ D store(acc_t<D> x) {
  return from_f32<D>(x);
}
template <>
__device__ __forceinline__ double store<double>(double x) {
  return x;
}
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// ---- fill

template <class U>
__global__ void __launch_bounds__(kThreads) fill_kernel(U* x, int64_t n, U v) {
  for (int64_t i = global_index(); i < n; i += global_stride()) x[i] = v;
}

// ---- element-wise

// W elements in one 16-byte access.
template <class D>
struct alignas(16) Pack {
  static constexpr int W = 16 / sizeof(D);
  D v[W];
};

// The pack part (when vec) and the tail of an element-wise update f(i-th element) -> element.
template <class D, class F>
__device__ __forceinline__ void elementwise(D* x, int64_t n, bool vec, F f) {
  int64_t tail = 0;
  if (vec) {
    constexpr int W = Pack<D>::W;
    auto* xv = reinterpret_cast<Pack<D>*>(x);
    const int64_t nv = rowmap::vec_count(n, W);
    for (int64_t i = global_index(); i < nv; i += global_stride()) {
      Pack<D> p = xv[i];
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = f(p.v[k], i * W + k);
      xv[i] = p;
    }
    tail = rowmap::vec_tail_begin(n, W);
  }
  for (int64_t i = tail + global_index(); i < n; i += global_stride()) x[i] = f(x[i], i);
}

template <class D>
__global__ void __launch_bounds__(kThreads) scale_kernel(D* x, int64_t n, acc_t<D> a, bool vec) {
  elementwise(x, n, vec, [a](D e, int64_t) { return store<D>(mul_rn(load(e), a)); });
}

// The x elements of a pack are loaded as a pack too (x shares y's alignment when vec is set).
template <class D>
__global__ void __launch_bounds__(kThreads) axpy_kernel(D* y, acc_t<D> a, bool unit, const D* x, int64_t n, bool vec) {
  int64_t tail = 0;
  if (vec) {
    constexpr int W = Pack<D>::W;
    auto* yv = reinterpret_cast<Pack<D>*>(y);
    const auto* xv = reinterpret_cast<const Pack<D>*>(x);
    const int64_t nv = rowmap::vec_count(n, W);
    for (int64_t i = global_index(); i < nv; i += global_stride()) {
      Pack<D> p = yv[i];
      const Pack<D> q = xv[i];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const acc_t<D> xi = load(q.v[k]);
        p.v[k] = store<D>(add_rn(load(p.v[k]), unit ? xi : mul_rn(a, xi)));
      }
      yv[i] = p;
    }
    tail = rowmap::vec_tail_begin(n, W);
  }
  for (int64_t i = tail + global_index(); i < n; i += global_stride()) {
    const acc_t<D> xi = load(x[i]);
    y[i] = store<D>(add_rn(load(y[i]), unit ? xi : mul_rn(a, xi)));
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads) add_rows_periodic_kernel(D* x, const D* src, int rows, int C, int row0, int period) {
  const int64_t n = int64_t{rows} * C;
  for (int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const int i = static_cast<int>(idx / C), c = static_cast<int>(idx % C);
    const int s = rowmap::periodic_src_row(i, row0, period);
    x[idx] = store<D>(add_rn(load(x[idx]), load(src[int64_t{s} * C + c])));
  }
}

// One thread per dsrc element (p, c): its rows i = first, first + period, ... in order.
template <class G, class D>
__global__ void __launch_bounds__(kThreads) sum_rows_periodic_kernel(G* dsrc, const D* dx, int rows, int C, int row0, int period) {
  const int64_t n = int64_t{period} * C;
  for (int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const int p = static_cast<int>(idx / C), c = static_cast<int>(idx % C);
    acc_t<G> acc = load(dsrc[idx]);
    for (int i = rowmap::periodic_first_row(p, row0, period); i < rows; i += period)
      acc = add_rn(acc, static_cast<acc_t<G>>(load(dx[int64_t{i} * C + c])));
    dsrc[idx] = store<G>(acc);
  }
}

template <class D>
__global__ void __launch_bounds__(kThreads) add_bias_kernel(D* y, const D* b, int N, int C) {
  const int64_t n = int64_t{N} * C;
  for (int64_t idx = global_index(); idx < n; idx += global_stride())
    y[idx] = store<D>(add_rn(load(y[idx]), load(b[idx % C])));
}

// ---- reductions in double

template <class D>
__device__ __forceinline__ double reduce_term(D x, ReduceKind kind) {
  const auto v = load(x);
  if (kind == ReduceKind::sum) return static_cast<double>(v);
  if (kind == ReduceKind::sumsq) return static_cast<double>(v) * static_cast<double>(v);
  return isfinite(v) ? 0.0 : 1.0;
}

template <class D>
__global__ void __launch_bounds__(rowmap::kReduceThreads) reduce_partial_kernel(double* partial, const D* x, int64_t n, ReduceKind kind) {
  const rowmap::Range r = rowmap::block_range(n, gridDim.x, blockIdx.x);
  double s = 0.0;
  for (int64_t i = r.begin + threadIdx.x; i < r.end; i += blockDim.x) s += reduce_term(x[i], kind);
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(rowmap::kReduceThreads) reduce_finish_kernel(double* acc, const double* partial, int nblocks) {
  double s = 0.0;
  for (int i = threadIdx.x; i < nblocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) acc[0] += s;
}

// ---- row moves

__device__ void record_row_error(int64_t* err, RowError code, int64_t pos, int64_t value, int64_t bound) {
  if (!err) return;
  auto* word = reinterpret_cast<unsigned long long*>(err);
  if (atomicCAS(word, 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    err[1] = pos;
    err[2] = value;
    err[3] = bound;
  }
}

template <class U>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(U* out, const U* in, const int32_t* index, int rows, int C, int64_t in_rows,
                                   int64_t* err) {
  const int64_t n = int64_t{rows} * C;
  for (int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const int r = static_cast<int>(idx / C), c = static_cast<int>(idx % C);
    const int32_t j = index[r];
    if (j < 0 || j >= in_rows) {
      out[idx] = static_cast<U>(~U(0));
      if (c == 0) record_row_error(err, RowError::gather_rows, r, j, in_rows);
    } else {
      out[idx] = in[int64_t{j} * C + c];
    }
  }
}

__global__ void __launch_bounds__(kThreads) iota_rows_kernel(int32_t* p, int n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) p[i] = static_cast<int32_t>(i);
}

// Block i: sorted position i; only a run head works, adding its run's rows in ascending r.
template <class D>
__global__ void __launch_bounds__(kThreads) scatter_run_kernel(D* out, const D* in, const int32_t* sorted_dst, const int32_t* sorted_r,
                                   const D* scale, int rows, int C, int64_t out_rows, int64_t* err) {
  const int i = blockIdx.x;
  if (!rowmap::run_head(sorted_dst, i)) return;
  const int32_t dst = sorted_dst[i];
  if (dst < 0 || dst >= out_rows) {
    if (threadIdx.x == 0) record_row_error(err, RowError::scatter_add_rows, sorted_r[i], dst, out_rows);
    return;
  }
  int end = i + 1;
  while (end < rows && sorted_dst[end] == dst) ++end;
  D* o = out + int64_t{dst} * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = load(o[c]);
    for (int k = i; k < end; ++k) {
      const int r = sorted_r[k];
      const float x = load(in[int64_t{r} * C + c]);
      acc = add_rn(acc, scale ? mul_rn(load(scale[r]), x) : x);
    }
    o[c] = store<D>(acc);
  }
}

// One warp per row (8 rows per 256-thread block), double accumulation, fixed butterfly.
template <class D>
__global__ void __launch_bounds__(kThreads) row_dots_kernel(double* dots, const D* a, const D* b, int rows, int C) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t base = int64_t{row} * C;
  double s = 0.0;
  for (int c = lane; c < C; c += 32) s += static_cast<double>(load(a[base + c])) * static_cast<double>(load(b[base + c]));
  s = warp_sum(s);
  if (lane == 0) dots[row] = s;
}

template <class D>
__global__ void __launch_bounds__(kThreads) scale_rows_kernel(D* out, const D* in, const D* scale, int rows, int C) {
  const int64_t n = int64_t{rows} * C;
  for (int64_t idx = global_index(); idx < n; idx += global_stride())
    out[idx] = store<D>(mul_rn(load(scale[idx / C]), load(in[idx])));
}

void check_rows(const char* op, int rows, int C) {
  require_nonnegative(op, "rows", rows);
  require_nonnegative(op, "C", C);
}

}  // namespace

void fill_pattern(void* x, int64_t n, int elem_bytes, uint64_t bits, cudaStream_t stream) {
  const NvtxRange range("fill_pattern");
  const char* op = "cuda::fill_pattern";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "x", x);
  bool bytes_equal = true;
  for (int k = 1; k < elem_bytes; ++k) bytes_equal &= ((bits >> (8 * k)) & 0xff) == (bits & 0xff);
  if (bytes_equal) {
    TRIAX_CHECK_CUDA(cudaMemsetAsync(x, static_cast<int>(bits & 0xff), static_cast<size_t>(n) * elem_bytes, stream));
    return;
  }
  switch (elem_bytes) {
    case 2:
      fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(x), n, static_cast<uint16_t>(bits));
      break;
    case 4:
      fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint32_t*>(x), n, static_cast<uint32_t>(bits));
      break;
    case 8: fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint64_t*>(x), n, bits); break;
    default: TRIAX_THROW(ConfigError, "{}: element size {} is not 1, 2, 4 or 8", op, elem_bytes);
  }
  check_launch();
}

template <class Real>
void scale(Real* x, int64_t n, double a, cudaStream_t stream) {
  const NvtxRange range("scale");
  require_nonnegative("cuda::scale", "n", n);
  if (n == 0) return;
  require_pointer("cuda::scale", "x", x);
  scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(x), n, static_cast<acc_t<device_t<Real>>>(a), aligned16(x));
  check_launch();
}

template <class Real>
void axpy(Real* y, double a, const Real* x, int64_t n, cudaStream_t stream) {
  const NvtxRange range("axpy");
  require_nonnegative("cuda::axpy", "n", n);
  if (n == 0) return;
  require_pointer("cuda::axpy", "y", y);
  require_pointer("cuda::axpy", "x", x);
  axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(y), static_cast<acc_t<device_t<Real>>>(a), a == 1.0, dptr(x),
                                                    n, aligned16(y) && aligned16(x));
  check_launch();
}

template <class Real>
void add_rows_periodic(Real* x, const Real* src, int rows, int C, int row0, int period, cudaStream_t stream) {
  const NvtxRange range("add_rows_periodic");
  const char* op = "cuda::add_rows_periodic";
  check_rows(op, rows, C);
  require_positive(op, "period", period);
  require_nonnegative(op, "row0", row0);
  if (int64_t{rows} * C == 0) return;
  require_pointer(op, "x", x);
  require_pointer(op, "src", src);
  const int64_t n = int64_t{rows} * C;
  add_rows_periodic_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(x), dptr(src), rows, C, row0, period);
  check_launch();
}

template <class Grad, class Real>
void sum_rows_periodic(Grad* dsrc, const Real* dx, int rows, int C, int row0, int period, cudaStream_t stream) {
  const NvtxRange range("sum_rows_periodic");
  const char* op = "cuda::sum_rows_periodic";
  check_rows(op, rows, C);
  require_positive(op, "period", period);
  require_nonnegative(op, "row0", row0);
  if (int64_t{rows} * C == 0) return;
  require_pointer(op, "dsrc", dsrc);
  require_pointer(op, "dx", dx);
  const int64_t n = int64_t{period} * C;
  sum_rows_periodic_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(dsrc), dptr(dx), rows, C, row0, period);
  check_launch();
}

template <class Real>
void add_bias(Real* y, const Real* b, int N, int C, cudaStream_t stream) {
  const NvtxRange range("add_bias");
  const char* op = "cuda::add_bias";
  check_rows(op, N, C);
  if (int64_t{N} * C == 0) return;
  require_pointer(op, "y", y);
  require_pointer(op, "b", b);
  add_bias_kernel<<<grid_for(int64_t{N} * C), kThreads, 0, stream>>>(dptr(y), dptr(b), N, C);
  check_launch();
}

template <class Real>
void reduce_into(double* acc, const Real* x, int64_t n, ReduceKind kind, cudaStream_t stream) {
  const NvtxRange range("reduce_into");
  const char* op = "cuda::reduce_into";
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "acc", acc);
  require_pointer(op, "x", x);
  const int blocks = rowmap::reduce_blocks(n);
  Scratch partial(sizeof(double) * blocks, stream);
  reduce_partial_kernel<<<blocks, rowmap::kReduceThreads, 0, stream>>>(partial.as<double>(), dptr(x), n, kind);
  check_launch();
  reduce_finish_kernel<<<1, rowmap::kReduceThreads, 0, stream>>>(acc, partial.as<double>(), blocks);
  check_launch();
}

void gather_rows(void* out, const void* in, const int32_t* index, int rows, int C, int64_t in_rows, int elem_bytes,
                 int64_t* row_error, cudaStream_t stream) {
  const NvtxRange range("gather_rows");
  const char* op = "cuda::gather_rows";
  check_rows(op, rows, C);
  const int64_t n = int64_t{rows} * C;
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "in", in);
  require_pointer(op, "index", index);
  switch (elem_bytes) {
    case 2:
      gather_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(out),
                                                               static_cast<const uint16_t*>(in), index, rows, C,
                                                               in_rows, row_error);
      break;
    case 4:
      gather_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint32_t*>(out),
                                                               static_cast<const uint32_t*>(in), index, rows, C,
                                                               in_rows, row_error);
      break;
    case 8:
      gather_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(static_cast<uint64_t*>(out),
                                                               static_cast<const uint64_t*>(in), index, rows, C,
                                                               in_rows, row_error);
      break;
    default: TRIAX_THROW(ConfigError, "{}: element size {} is not 2, 4 or 8", op, elem_bytes);
  }
  check_launch();
}

template <class Real>
void scatter_add_rows(Real* out, const Real* in, const int32_t* index, const Real* scale, int rows, int C,
                      int64_t out_rows, int64_t* row_error, cudaStream_t stream) {
  const NvtxRange range("scatter_add_rows");
  const char* op = "cuda::scatter_add_rows";
  check_rows(op, rows, C);
  if (int64_t{rows} * C == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "in", in);
  require_pointer(op, "index", index);
  Scratch bufs(sizeof(int32_t) * 3 * static_cast<size_t>(rows), stream);
  int32_t* sorted_dst = bufs.as<int32_t>();
  int32_t* row_ids = sorted_dst + rows;
  int32_t* sorted_r = row_ids + rows;
  iota_rows_kernel<<<grid_for(rows), kThreads, 0, stream>>>(row_ids, rows);
  check_launch();
  size_t temp_bytes = 0;
  TRIAX_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, index, sorted_dst, row_ids, sorted_r, rows, 0,
                                                   32, stream));
  Scratch temp(temp_bytes, stream);
  TRIAX_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, index, sorted_dst, row_ids, sorted_r,
                                                   rows, 0, 32, stream));
  scatter_run_kernel<<<rows, kThreads, 0, stream>>>(dptr(out), dptr(in), sorted_dst, sorted_r, dptr(scale), rows, C,
                                                    out_rows, row_error);
  check_launch();
}

template <class Real>
void row_dots(double* dots, const Real* a, const Real* b, int rows, int C, cudaStream_t stream) {
  const NvtxRange range("row_dots");
  const char* op = "cuda::row_dots";
  check_rows(op, rows, C);
  if (rows == 0) return;
  require_pointer(op, "dots", dots);
  require_pointer(op, "a", a);
  require_pointer(op, "b", b);
  constexpr int kRowsPerBlock = kThreads / 32;
  row_dots_kernel<<<(rows + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(dots, dptr(a), dptr(b), rows, C);
  check_launch();
}

template <class Real>
void scale_rows(Real* out, const Real* in, const Real* scale, int rows, int C, cudaStream_t stream) {
  const NvtxRange range("scale_rows");
  const char* op = "cuda::scale_rows";
  check_rows(op, rows, C);
  const int64_t n = int64_t{rows} * C;
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "in", in);
  require_pointer(op, "scale", scale);
  scale_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(out), dptr(in), dptr(scale), rows, C);
  check_launch();
}

#define TRIAX_ELEMENTWISE(R)                                                                             \
  template void scale<R>(R*, int64_t, double, cudaStream_t);                                             \
  template void axpy<R>(R*, double, const R*, int64_t, cudaStream_t);                                    \
  template void reduce_into<R>(double*, const R*, int64_t, ReduceKind, cudaStream_t);
TRIAX_ELEMENTWISE(float)
TRIAX_ELEMENTWISE(double)
TRIAX_ELEMENTWISE(bf16)
TRIAX_ELEMENTWISE(f16)
#undef TRIAX_ELEMENTWISE

#define TRIAX_ROWS(R)                                                                                           \
  template void add_rows_periodic<R>(R*, const R*, int, int, int, int, cudaStream_t);                           \
  template void sum_rows_periodic<R, R>(R*, const R*, int, int, int, int, cudaStream_t);                        \
  template void add_bias<R>(R*, const R*, int, int, cudaStream_t);                                              \
  template void scatter_add_rows<R>(R*, const R*, const int32_t*, const R*, int, int, int64_t, int64_t*,        \
                                    cudaStream_t);                                                              \
  template void row_dots<R>(double*, const R*, const R*, int, int, cudaStream_t);                               \
  template void scale_rows<R>(R*, const R*, const R*, int, int, cudaStream_t);
TRIAX_ROWS(float)
TRIAX_ROWS(bf16)
TRIAX_ROWS(f16)
#undef TRIAX_ROWS
template void sum_rows_periodic<float, bf16>(float*, const bf16*, int, int, int, int, cudaStream_t);
template void sum_rows_periodic<float, f16>(float*, const f16*, int, int, int, int, cudaStream_t);

}  // namespace triax::cuda
