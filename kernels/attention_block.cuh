// The kernels of kernels/attention_block.cu (context-parallel attention blocks), in a header of
// their own so that tests/unit/cuda/test_attention_block_host.cpp can run them on the host (one
// std::thread per CUDA thread, a barrier for __syncthreads) against the CPU ops, in every build
// and without a GPU. It needs from its includer: the CUDA keywords and built-ins, and
// detail::to_f32 / from_f32 / kThreads / global_index / global_stride (common.cuh on the device).
// The scheme and the determinism argument: kernels/attention_block.cu.
#pragma once
#include <cmath>
#include <cstdint>

namespace triax::cuda {
namespace {
using namespace detail;

constexpr int kBlock = 64;  // threads per block: queries (forward, dQ) or keys (dK/dV)
constexpr int kTile = 32;   // rows per shared-memory tile: keys (forward, dQ) or queries (dK/dV)

// The block's geometry with the derived widths. Row t of a sequence b of q starts at
// q_row(b, t) * qw; of kv at kv_row(b, t) * kv_width + kv_col0 (K heads, then V heads).
struct Geo {
  int C, NH, NKV, group, qw;
  int q_T, q_row0, nq;
  int kv_T, kv_row0, nk, kv_width, kv_col0;
  long long q_pos0, k_pos0;
  __device__ int64_t q_row(int b, int i) const { return int64_t{b} * q_T + q_row0 + i; }
  __device__ int64_t kv_row(int b, int j) const { return int64_t{b} * kv_T + kv_row0 + j; }
  __device__ int64_t stat(int b, int h, int i) const { return (int64_t{b} * NH + h) * q_T + q_row0 + i; }
  __device__ int64_t delta(int b, int h, int i) const { return (int64_t{b} * NH + h) * nq + i; }
  // Keys of the block that query i sees (a prefix), and the first query that sees key j.
  __device__ int visible(int i) const {
    const long long v = q_pos0 + i - k_pos0 + 1;
    return static_cast<int>(v < 0 ? 0 : (v > nk ? nk : v));
  }
  __device__ int first_query(int j) const {
    const long long f = k_pos0 + j - q_pos0;
    return static_cast<int>(f < 0 ? 0 : (f > nq ? nq : f));
  }
};

// Keys and values k0 .. k0 + kTile - 1 of kv head g (batch b) into shared tiles, zeros past end.
template <class D, int HS>
__device__ void load_block_kv(float (&ks)[kTile][HS], float (&vs)[kTile][HS], const D* kv, const Geo& g, int b, int kh,
                              int k0, int end) {
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, j = k0 + r;
    const D* row = kv + (j < end ? g.kv_row(b, j) * g.kv_width + g.kv_col0 : 0);
    ks[r][d] = j < end ? to_f32(row[int64_t{kh} * HS + d]) : 0.0f;
    vs[r][d] = j < end ? to_f32(row[int64_t{g.NKV + kh} * HS + d]) : 0.0f;
  }
}

// Merges one row's block result (acc unnormalised with row sum l, lse_b = m + log l) into the
// running (o, lse) as the CPU op does: lse' = hi + log1p(exp(lo - hi)).
template <class D, int HS>
__device__ void merge_block_row(D* o, float* lse, const float (&acc)[HS], float l, float lse_b) {
  const float old = *lse;
  if (old == -INFINITY) {
    const float inv = 1.0f / l;
#pragma unroll
    for (int d = 0; d < HS; ++d) o[d] = from_f32<D>(acc[d] * inv);
    *lse = lse_b;
    return;
  }
  const float hi = fmaxf(old, lse_b), lo = fminf(old, lse_b);
  const float merged = hi + log1pf(expf(lo - hi));
  const float keep = expf(old - merged), add = expf(lse_b - merged) / l;
#pragma unroll
  for (int d = 0; d < HS; ++d) o[d] = from_f32<D>(to_f32(o[d]) * keep + acc[d] * add);
  *lse = merged;
}

// One block per (query tile, head h, batch b); thread = query i of the tile.
template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    block_forward_kernel(D* __restrict__ out, float* __restrict__ lse, const D* __restrict__ q,
                         const D* __restrict__ kv, Geo g, float scale) {
  __shared__ float ks[kTile][HS];
  __shared__ float vs[kTile][HS];
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlock, i = i0 + threadIdx.x;
  const bool active = i < g.nq;
  const int vis = active ? g.visible(i) : 0;
  const int kend = g.visible(min(g.nq, i0 + kBlock) - 1);  // the keys any query of the tile sees
  const D* qr = q + (active ? g.q_row(b, i) * g.qw : 0) + int64_t{h} * HS;
  float qv[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    qv[d] = active ? to_f32(qr[d]) * scale : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_block_kv<D, HS>(ks, vs, kv, g, b, h / g.group, k0, kend);
    __syncthreads();
    const int n = min(kTile, vis - k0);
    for (int r = 0; r < n; ++r) {
      float s = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) s += qv[d] * ks[r][d];
      if (s > m) {  // first key: m = -inf, corr = 0 and acc, l are still 0
        const float corr = expf(m - s);
        l *= corr;
#pragma unroll
        for (int d = 0; d < HS; ++d) acc[d] *= corr;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
#pragma unroll
      for (int d = 0; d < HS; ++d) acc[d] += p * vs[r][d];
    }
  }
  if (vis > 0)
    merge_block_row<D, HS>(out + g.q_row(b, i) * g.C + int64_t{h} * HS, lse + g.stat(b, h, i), acc, l, m + logf(l));
}

// delta[b, h, i] = sum_d dout * out over head h of query row i of the block (i < nq).
template <class D>
__global__ void __launch_bounds__(kThreads)
    block_delta_kernel(float* __restrict__ delta, const D* __restrict__ dout, const D* __restrict__ out, int B, Geo g,
                       int hs) {
  const int64_t n = int64_t{B} * g.NH * g.nq;
  for (int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const int i = static_cast<int>(idx % g.nq);
    const int h = static_cast<int>((idx / g.nq) % g.NH);
    const int b = static_cast<int>(idx / (int64_t{g.nq} * g.NH));
    const int64_t off = g.q_row(b, i) * g.C + int64_t{h} * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += to_f32(dout[off + d]) * to_f32(out[off + d]);
    delta[idx] = s;
  }
}

// One block per (query tile, head h, batch b); thread = query i: dq row += scale sum_j dS_ij k_j.
template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    block_dq_kernel(D* __restrict__ dq, const D* __restrict__ dout, const D* __restrict__ q, const D* __restrict__ kv,
                    const float* __restrict__ lse, const float* __restrict__ delta, Geo g, float scale) {
  __shared__ float ks[kTile][HS];
  __shared__ float vs[kTile][HS];
  const int b = blockIdx.z, h = blockIdx.y, i0 = blockIdx.x * kBlock, i = i0 + threadIdx.x;
  const bool active = i < g.nq;
  const int vis = active ? g.visible(i) : 0;
  const int kend = g.visible(min(g.nq, i0 + kBlock) - 1);
  const int64_t row = active ? g.q_row(b, i) : 0;
  float qv[HS], dO[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    qv[d] = active ? to_f32(q[row * g.qw + int64_t{h} * HS + d]) : 0.0f;
    dO[d] = active ? to_f32(dout[row * g.C + int64_t{h} * HS + d]) : 0.0f;
    acc[d] = 0.0f;
  }
  const float li = active ? lse[g.stat(b, h, i)] : 0.0f;
  const float di = active ? delta[g.delta(b, h, i)] : 0.0f;
  for (int k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_block_kv<D, HS>(ks, vs, kv, g, b, h / g.group, k0, kend);
    __syncthreads();
    const int n = min(kTile, vis - k0);
    for (int r = 0; r < n; ++r) {
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int d = 0; d < HS; ++d) {
        s += qv[d] * ks[r][d];
        dp += dO[d] * vs[r][d];
      }
      const float ds = expf(s * scale - li) * (dp - di);
#pragma unroll
      for (int d = 0; d < HS; ++d) acc[d] += ds * ks[r][d];
    }
  }
  if (vis > 0) {
    D* o = dq + row * g.qw + int64_t{h} * HS;
#pragma unroll
    for (int d = 0; d < HS; ++d) o[d] = from_f32<D>(to_f32(o[d]) + acc[d] * scale);
  }
}

// Queries i0 .. i0 + kTile - 1 of query head h (q, dO, lse, D) into shared tiles, zeros past nq.
template <class D, int HS>
__device__ void load_block_q(float (&qs)[kTile][HS], float (&dos)[kTile][HS], float (&ls)[kTile], float (&dl)[kTile],
                             const D* q, const D* dout, const float* lse, const float* delta, const Geo& g, int b,
                             int h, int i0) {
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, i = i0 + r;
    const int64_t row = i < g.nq ? g.q_row(b, i) : 0;
    qs[r][d] = i < g.nq ? to_f32(q[row * g.qw + int64_t{h} * HS + d]) : 0.0f;
    dos[r][d] = i < g.nq ? to_f32(dout[row * g.C + int64_t{h} * HS + d]) : 0.0f;
  }
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    ls[r] = i0 + r < g.nq ? lse[g.stat(b, h, i0 + r)] : 0.0f;
    dl[r] = i0 + r < g.nq ? delta[g.delta(b, h, i0 + r)] : 0.0f;
  }
}

// One block per (key tile, kv head kh, batch b); thread = key j, summing over the query heads of
// kh's group in order, each over the queries that see j in order; then dk, dv rows +=.
template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    block_dkv_kernel(D* __restrict__ dkv, const D* __restrict__ dout, const D* __restrict__ q,
                     const D* __restrict__ kv, const float* __restrict__ lse, const float* __restrict__ delta, Geo g,
                     float scale) {
  __shared__ float qs[kTile][HS];
  __shared__ float dos[kTile][HS];
  __shared__ float ls[kTile];
  __shared__ float dl[kTile];
  const int b = blockIdx.z, kh = blockIdx.y, j0 = blockIdx.x * kBlock, j = j0 + threadIdx.x;
  const bool active = j < g.nk;
  const int64_t kvo = (active ? g.kv_row(b, j) * g.kv_width : 0) + g.kv_col0;
  float kr[HS], vr[HS], dk[HS], dv[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    kr[d] = active ? to_f32(kv[kvo + int64_t{kh} * HS + d]) : 0.0f;
    vr[d] = active ? to_f32(kv[kvo + int64_t{g.NKV + kh} * HS + d]) : 0.0f;
    dk[d] = 0.0f;
    dv[d] = 0.0f;
  }
  const int first = active ? g.first_query(j) : g.nq;  // queries first .. nq - 1 see key j
  const int istart = g.first_query(j0);                // the tile's first key: block-uniform
  for (int h = kh * g.group; h < (kh + 1) * g.group; ++h) {
    for (int i0 = istart; i0 < g.nq; i0 += kTile) {
      __syncthreads();
      load_block_q<D, HS>(qs, dos, ls, dl, q, dout, lse, delta, g, b, h, i0);
      __syncthreads();
      const int r_end = min(kTile, g.nq - i0);
      for (int r = max(0, first - i0); r < r_end; ++r) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; ++d) {
          s += qs[r][d] * kr[d];
          dp += dos[r][d] * vr[d];
        }
        const float p = expf(s * scale - ls[r]);
        const float ds = p * (dp - dl[r]);
#pragma unroll
        for (int d = 0; d < HS; ++d) {
          dv[d] += p * dos[r][d];
          dk[d] += ds * qs[r][d];
        }
      }
    }
  }
  if (active && first < g.nq) {
    D* o = dkv + kvo;
#pragma unroll
    for (int d = 0; d < HS; ++d) {
      D& k = o[int64_t{kh} * HS + d];
      D& v = o[int64_t{g.NKV + kh} * HS + d];
      k = from_f32<D>(to_f32(k) + dk[d] * scale);
      v = from_f32<D>(to_f32(v) + dv[d]);
    }
  }
}

}  // namespace
}  // namespace triax::cuda
