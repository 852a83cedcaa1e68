// Rotary position embedding, in place on the query and key heads of qkv: one thread per
// (token, rotated head, group of kPairs pairs), grid-stride, fp32 rotation rounded once. A group
// reads kPairs consecutive elements of each half of the head and kPairs entries of each table as
// single loads where aligned (else the scalar path, one pair per thread). Each element is read and
// written by the one thread that owns it: in place is safe.
#include "common.cuh"
#include "triax/cuda/llama_maps.h"
#include "triax/cuda/rope.h"

namespace triax::cuda {
namespace {
using namespace detail;
namespace math = ops::math;

constexpr int kPairs = 4;  // pairs per vector: 16 bytes of each table, 8 (half) or 16 (fp32) of x

namespace lm = llama_map;

// Pair p (of n = B*T*heads*half) as its element offset in qkv and its table entry
// (cuda/llama_maps.h).
struct PairIndex {
  lm::RopePairs r;
  int64_t half;
  __device__ void at(int64_t p, int64_t& x, int64_t& tab) const { lm::rope_pair(r, p, x, tab); }
};

template <class D>
struct Rotate {
  D* __restrict__ x;
  const float* __restrict__ c;
  const float* __restrict__ s;
  PairIndex idx;
  float sign;  // +1 forward, -1 backward (the inverse rotation)
  __device__ void rot(D& a, D& b, float cf, float sf) const {
    float af = to_f32(a), bf = to_f32(b);
    lm::rope_rotate(af, bf, cf, sign * sf);
    a = from_f32<D>(af);
    b = from_f32<D>(bf);
  }
  __device__ void vector(int64_t v) {
    int64_t xo, to;
    idx.at(v * kPairs, xo, to);
    Pack<D, kPairs> a = load_pack<kPairs>(x + xo, 0), b = load_pack<kPairs>(x + xo + idx.half, 0);
    const Pack<float, kPairs> pc = load_pack<kPairs>(c + to, 0), ps = load_pack<kPairs>(s + to, 0);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) rot(a.e[k], b.e[k], pc.e[k], ps.e[k]);
    store_pack(x + xo, 0, a);
    store_pack(x + xo + idx.half, 0, b);
  }
  __device__ void scalar(int64_t p) {
    int64_t xo, to;
    idx.at(p, xo, to);
    rot(x[xo], x[xo + idx.half], c[to], s[to]);
  }
};

template <class D>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(D* __restrict__ x, const float* __restrict__ c, const float* __restrict__ s, int64_t n, PairIndex idx,
                float sign, math::VecSplit split) {
  Rotate<D> body{x, c, s, idx, sign};
  math::for_each_split(split, n, global_index(), global_stride(), body);
}

template <class Real>
void rope_launch(const char* op, Real* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                 float sign, cudaStream_t stream) {
  const NvtxRange range(op);
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  require_positive(op, "NH", NH);
  require_positive(op, "NKV", NKV);
  require_positive(op, "HD", HD);
  if (HD % 2 != 0) TRIAX_THROW(ConfigError, "{}: head size HD={} must be even (pairs i, i + HD/2)", op, HD);
  require_pointer(op, "qkv", qkv);
  require_pointer(op, "cos", cos);
  require_pointer(op, "sin", sin);
  const int64_t half = HD / 2, heads = int64_t{NH} + NKV;
  const PairIndex idx{{half, heads, T, (int64_t{NH} + 2 * int64_t{NKV}) * HD}, half};
  const int64_t n = int64_t{B} * T * heads * half;
  // Every group starts at a multiple of kPairs elements from an aligned base when half is a
  // multiple of kPairs (the row length and head offsets are multiples of HD = 2 half).
  const bool aligned = half % kPairs == 0 && reinterpret_cast<uintptr_t>(qkv) % (kPairs * sizeof(Real)) == 0 &&
                       aligned16(cos, sin);
  const auto split = ops::math::vec_split(n, kPairs, aligned);
  rope_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(qkv), cos, sin, n, idx, sign, split);
  check_launch();
}

}  // namespace

template <class Real>
void rope_forward(Real* qkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                  cudaStream_t stream) {
  rope_launch("cuda::rope_forward", qkv, cos, sin, B, T, NH, NKV, HD, 1.0f, stream);
}

template <class Real>
void rope_backward(Real* dqkv, const float* cos, const float* sin, int B, int T, int NH, int NKV, int HD,
                   cudaStream_t stream) {
  rope_launch("cuda::rope_backward", dqkv, cos, sin, B, T, NH, NKV, HD, -1.0f, stream);
}

#define TRIAX_ROPE_INSTANTIATE(R)                                                                          \
  template void rope_forward<R>(R*, const float*, const float*, int, int, int, int, int, cudaStream_t);  \
  template void rope_backward<R>(R*, const float*, const float*, int, int, int, int, int, cudaStream_t);
TRIAX_ROPE_INSTANTIATE(float)
TRIAX_ROPE_INSTANTIATE(bf16)
TRIAX_ROPE_INSTANTIATE(f16)
#undef TRIAX_ROPE_INSTANTIATE

}  // namespace triax::cuda
