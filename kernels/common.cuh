// Private helpers of kernels/*.cu: device element types for triax's 16-bit storage types, fp32
// load/store conversions, deterministic warp/block reductions, grid sizing and the host-side
// argument checks every launcher makes before touching the device.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "triax/core/cuda_check.h"
#include "triax/core/dtype.h"
#include "triax/core/error.h"
#include "triax/cuda/scratch.h"

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

inline constexpr int kThreads = 256;
// Element-wise kernels: enough blocks to fill an H200 many times over, then grid-stride.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t{132} * 32));
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
