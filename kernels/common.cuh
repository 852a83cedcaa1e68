// Private helpers of kernels/*.cu: device element types for triax's 16-bit storage types, fp32
// load/store conversions, 16-byte vector loads, deterministic warp/block reductions, grid sizing
// from the device's SM count, and the host-side argument checks every launcher makes before
// touching the device. Every launcher opens an NvtxRange (triax/cuda/nvtx.h) named after its op.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "triax/core/cuda_check.h"
#include "triax/core/dtype.h"
#include "triax/core/error.h"
#include "triax/cuda/nvtx.h"
#include "triax/cuda/scratch.h"
#include "triax/ops/shared_math.h"

namespace triax::cuda::detail {

// triax::bf16 / f16 (host storage structs, 2 bytes) are the device's __nv_bfloat16 / __half.
template <class T>
struct DeviceType {
  using type = T;
};
template <>
struct DeviceType<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct DeviceType<f16> {
  using type = __half;
};
template <class T>
using device_t = typename DeviceType<T>::type;
static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && sizeof(f16) == sizeof(__half));

template <class T>
device_t<T>* dptr(T* p) {
  return reinterpret_cast<device_t<T>*>(p);
}
template <class T>
const device_t<T>* dptr(const T* p) {
  return reinterpret_cast<const device_t<T>*>(p);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class D>
__device__ __forceinline__ D from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// Butterfly reductions: every lane ends with the same value, combined in a fixed order.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum / max over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the
// result. Fixed tree for a fixed block size: deterministic. Every thread of the block must call.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call's readers are done with `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : T(0);
  return warp_sum(v);
}
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < nwarps ? partial[lane] : -INFINITY;
  return warp_max(v);
}

// Grid-stride loops: index and stride in 64 bits.
__device__ __forceinline__ int64_t global_index() { return int64_t{blockIdx.x} * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t global_stride() { return int64_t{gridDim.x} * blockDim.x; }

// ---- 16-byte vector access: 8 bf16/fp16 or 4 fp32 elements per load or store ----
template <class D>
inline constexpr int kVecWidth = 16 / static_cast<int>(sizeof(D));
// W elements of D in one access: 16 bytes by default (a narrower W for a kernel that mixes types,
// e.g. 4 fp32 = 16 bytes beside 4 bf16 = 8 bytes).
template <class D, int W = kVecWidth<D>>
struct alignas(sizeof(D) * W) Pack {
  D e[W];
};
// Vector v of p: elements [v * W, (v + 1) * W); p must be aligned to the pack's size.
template <int W, class D>
__device__ __forceinline__ Pack<D, W> load_pack(const D* p, int64_t v) {
  return reinterpret_cast<const Pack<D, W>*>(p)[v];
}
template <class D>
__device__ __forceinline__ Pack<D> load_pack(const D* p, int64_t v) {
  return load_pack<kVecWidth<D>>(p, v);
}
template <class D, int W>
__device__ __forceinline__ void store_pack(D* p, int64_t v, const Pack<D, W>& x) {
  reinterpret_cast<Pack<D, W>*>(p)[v] = x;
}
// Whether every pointer may be read as vectors (null pointers, absent optional arguments, may).
template <class... T>
inline bool aligned16(const T*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}
// The split of an element-wise kernel over n elements of D (ops/shared_math.h: vectors, then a
// scalar tail; everything scalar unless all pointers are aligned).
template <class D>
ops::math::VecSplit split_for(int64_t n, bool aligned) {
  return ops::math::vec_split(n, kVecWidth<D>, aligned);
}

inline constexpr int kThreads = 256;

// The current device's SM count, asked once per device and cached.
inline int sm_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0: not asked yet
  int dev = 0;
  TRIAX_CHECK_CUDA(cudaGetDevice(&dev));
  int n = dev >= 0 && dev < kMaxDevices ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (n > 0) return n;
  TRIAX_CHECK_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Grid-stride kernels: at most kBlocksPerSm blocks per SM (of 256 threads: 4 waves of a full
// SM), fewer when there is less work; each thread then strides over the rest.
inline constexpr int kBlocksPerSm = 32;
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{sm_count()} * kBlocksPerSm));
}
// For a split: enough threads for the longer of its two loops.
inline unsigned grid_for(const ops::math::VecSplit& s, int64_t n) {
  return grid_for(std::max(s.nvec, n - s.tail_begin));
}

// Deterministic sums over the rows of an (N, C) matrix, per column (parameter gradients: LayerNorm
// weight/bias, linear bias): the rows are cut into at most ~1024 chunks of at least 32 rows, so the
// fp32 partials (one per chunk and column, rows added in order) are bounded scratch and there are
// enough blocks to fill the GPU; one thread per column then adds the chunks in order. The cut
// depends only on N, so the bits do too.
struct RowChunks {
  int rows_per_chunk;
  int count;
  explicit RowChunks(int N)
      : rows_per_chunk(std::max(32, (N + 1023) / 1024)), count((N + rows_per_chunk - 1) / rows_per_chunk) {}
};
inline constexpr int kChunkColumns = 128;  // threads (columns) per block of a per-chunk partial kernel

// ---- host-side checks (before any CUDA call, so they work without a GPU) ----
inline void require_positive(const char* op, const char* what, int64_t v) {
  if (v <= 0) TRIAX_THROW(ConfigError, "{}: {} must be positive, got {}", op, what, v);
}
inline void require_nonnegative(const char* op, const char* what, int64_t v) {
  if (v < 0) TRIAX_THROW(ConfigError, "{}: {} must not be negative, got {}", op, what, v);
}
inline void require_pointer(const char* op, const char* what, const void* p) {
  if (!p) TRIAX_THROW(ConfigError, "{}: {} is null", op, what);
}
// After every launch: a bad configuration (too many threads, too much shared memory) shows here.
inline void check_launch() { TRIAX_CHECK_CUDA(cudaGetLastError()); }

// Stream-ordered scratch: given back on the stream when the object dies (after the kernels
// enqueued on it before that point). Host memory never waits. From the stream's ScratchArena when
// one is bound (the CUDA backend's compute stream: no allocation per call), else cudaMallocAsync
// (cuda/scratch.h).
class Scratch {
 public:
  Scratch(size_t nbytes, cudaStream_t stream) : stream_(stream) {
    if (nbytes) p_ = scratch_acquire(nbytes, stream);
  }
  ~Scratch() { scratch_release(p_, stream_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace triax::cuda::detail
