// Causal attention, flash-style on CUDA cores: one thread per query (forward, dQ) or per key
// (dK/dV), its vectors of length HS in registers, the other side streamed through shared memory
// in tiles of kTile rows, fp32 arithmetic. Forward: online softmax (running max m and sum l,
// rescaling the accumulator when the max grows), saving lse = m + log l. Backward recomputes
// P = exp(s - lse) and uses D = rowsum(dO * O): dS = P (dP - D), dQ = scale dS K, dK = scale dS^T Q,
// dV = P^T dO. Each output element is summed by one thread in a fixed order: deterministic.
// Grouped-query attention: a token's row of qkv is [NH query heads | NKV key heads | NKV value
// heads] (W = C + 2 NKV HS elements); query head h reads kv head h / (NH / NKV). The dK/dV kernel
// runs per kv head and adds the query heads of its group one after the other (fixed order).
// Correctness first: no tensor cores (docs/CUDA.md says what the fast path would be).
#include <cmath>

#include "common.cuh"
#include "triax/cuda/attention.h"

namespace triax::cuda {
namespace {
using namespace detail;

constexpr int kBlock = 64;  // threads per block: queries (forward, dQ) or keys (dK/dV)
constexpr int kTile = 32;   // rows per shared-memory tile: keys (forward, dQ) or queries (dK/dV)

// Where a head's vectors sit in a row of qkv (or dqkv): W elements per token, query head h at
// h * HS, key head g at C + g * HS, value head g at C + (NKV + g) * HS.
struct Heads {
  int C, NH, NKV;
  int64_t W;
  __device__ int64_t q(int h, int hs) const { return int64_t{h} * hs; }
  __device__ int64_t k(int g, int hs) const { return C + int64_t{g} * hs; }
  __device__ int64_t v(int g, int hs) const { return C + int64_t{NKV + g} * hs; }
  __device__ int kv_of(int h) const { return h / (NH / NKV); }
};

// What every kernel's thread block starts from: batch b and head (a query head for forward and
// dQ, a kv head for dK/dV), the first row of its block row0 (queries or keys) and this thread's
// row (active when < T), and batch b's rows of qkv: token t at rows[t * W].
template <class D>
struct TileBlock {
  int b, head, row0, row;
  bool active;
  const D* rows;
};

template <class D>
__device__ TileBlock<D> tile_block(const D* qkv, int T, const Heads& hd) {
  const int b = blockIdx.z, head = blockIdx.y;
  const int row0 = blockIdx.x * kBlock;
  const int row = row0 + threadIdx.x;
  return {b, head, row0, row, row < T, qkv + int64_t{b} * T * hd.W};
}

// Keys and values k0 .. k0 + kTile - 1 of kv head g into shared tiles, zeros past T.
template <class D, int HS>
__device__ void load_kv_tile(float (&ks)[kTile][HS], float (&vs)[kTile][HS], const D* rows, const Heads& hd, int g,
                             int k0, int T) {
  const D* kb = rows + hd.k(g, HS);
  const D* vb = rows + hd.v(g, HS);
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, j = k0 + r;
    ks[r][d] = j < T ? to_f32(kb[j * hd.W + d]) : 0.0f;
    vs[r][d] = j < T ? to_f32(vb[j * hd.W + d]) : 0.0f;
  }
}

template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    attention_forward_kernel(D* __restrict__ out, float* __restrict__ lse, const D* __restrict__ qkv, int T,
                             Heads hd, float scale) {
  __shared__ float ks[kTile][HS];
  __shared__ float vs[kTile][HS];
  const auto [b, h, q0, i, active, rows] = tile_block<D>(qkv, T, hd);
  const int g = hd.kv_of(h);
  const D* qb = rows + hd.q(h, HS);
  float q[HS], acc[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    q[d] = active ? to_f32(qb[i * hd.W + d]) * scale : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int kend = min(T, q0 + kBlock);  // the keys any query of this block may see
  for (int k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    load_kv_tile<D, HS>(ks, vs, rows, hd, g, k0, T);
    __syncthreads();
    if (active && k0 <= i) {
      const int nk = min(kTile, i - k0 + 1);  // keys k0 .. k0 + nk - 1 are <= i
      for (int r = 0; r < nk; ++r) {
        float s = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; ++d) s += q[d] * ks[r][d];
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
  }
  if (active) {
    const float inv = 1.0f / l;
    D* o = out + (int64_t{b} * T + i) * hd.C + int64_t{h} * HS;
#pragma unroll
    for (int d = 0; d < HS; ++d) o[d] = from_f32<D>(acc[d] * inv);
    lse[(int64_t{b} * hd.NH + h) * T + i] = m + logf(l);
  }
}

// delta[b, h, i] = sum_d dout[b, i, h, d] * out[b, i, h, d]
template <class D>
__global__ void __launch_bounds__(kThreads)
    attention_delta_kernel(float* __restrict__ delta, const D* __restrict__ dout, const D* __restrict__ out, int B,
                           int T, int C, int NH, int hs) {
  const int64_t n = int64_t{B} * NH * T;
  for (int64_t idx = global_index(); idx < n; idx += global_stride()) {
    const int64_t i = idx % T;
    const int64_t h = (idx / T) % NH;
    const int64_t b = idx / (int64_t{T} * NH);
    const int64_t off = (b * T + i) * C + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += to_f32(dout[off + d]) * to_f32(out[off + d]);
    delta[idx] = s;
  }
}

template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    attention_dq_kernel(D* __restrict__ dqkv, const D* __restrict__ dout, const D* __restrict__ qkv,
                        const float* __restrict__ lse, const float* __restrict__ delta, int T, Heads hd,
                        float scale) {
  __shared__ float ks[kTile][HS];
  __shared__ float vs[kTile][HS];
  const auto [b, h, q0, i, active, rows] = tile_block<D>(qkv, T, hd);
  const int g = hd.kv_of(h);
  const D* qb = rows + hd.q(h, HS);
  const D* dO_row = dout + (int64_t{b} * T + (active ? i : 0)) * hd.C + int64_t{h} * HS;
  float q[HS], dO[HS], dq[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    q[d] = active ? to_f32(qb[i * hd.W + d]) : 0.0f;
    dO[d] = active ? to_f32(dO_row[d]) : 0.0f;
    dq[d] = 0.0f;
  }
  const int64_t stat = (int64_t{b} * hd.NH + h) * T + i;
  const float li = active ? lse[stat] : 0.0f;
  const float di = active ? delta[stat] : 0.0f;
  const int kend = min(T, q0 + kBlock);
  for (int k0 = 0; k0 < kend; k0 += kTile) {
    __syncthreads();
    load_kv_tile<D, HS>(ks, vs, rows, hd, g, k0, T);
    __syncthreads();
    if (active && k0 <= i) {
      const int nk = min(kTile, i - k0 + 1);
      for (int r = 0; r < nk; ++r) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int d = 0; d < HS; ++d) {
          s += q[d] * ks[r][d];
          dp += dO[d] * vs[r][d];
        }
        const float p = expf(s * scale - li);
        const float ds = p * (dp - di);
#pragma unroll
        for (int d = 0; d < HS; ++d) dq[d] += ds * ks[r][d];
      }
    }
  }
  if (active) {
    D* o = dqkv + (int64_t{b} * T + i) * hd.W + hd.q(h, HS);
#pragma unroll
    for (int d = 0; d < HS; ++d) o[d] = from_f32<D>(dq[d] * scale);
  }
}

// Queries i0 .. i0 + kTile - 1 of query head h (q, dO, lse, D) into shared tiles, zeros past T.
template <class D, int HS>
__device__ void load_q_tile(float (&qs)[kTile][HS], float (&dos)[kTile][HS], float (&ls)[kTile], float (&dl)[kTile],
                            const D* rows, const D* dbase, const float* lse_bh, const float* delta_bh,
                            const Heads& hd, int h, int i0, int T) {
  const D* qb = rows + hd.q(h, HS);
  for (int e = threadIdx.x; e < kTile * HS; e += blockDim.x) {
    const int r = e / HS, d = e % HS, i = i0 + r;
    qs[r][d] = i < T ? to_f32(qb[i * hd.W + d]) : 0.0f;
    dos[r][d] = i < T ? to_f32(dbase[int64_t{i} * hd.C + d]) : 0.0f;
  }
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    ls[r] = i0 + r < T ? lse_bh[i0 + r] : 0.0f;
    dl[r] = i0 + r < T ? delta_bh[i0 + r] : 0.0f;
  }
}

// One block per (key block, kv head g, batch b); each thread owns key j and sums over the query
// heads of g's group in order, each over its queries i >= j in order.
template <class D, int HS>
__global__ void __launch_bounds__(kBlock)
    attention_dkv_kernel(D* __restrict__ dqkv, const D* __restrict__ dout, const D* __restrict__ qkv,
                         const float* __restrict__ lse, const float* __restrict__ delta, int T, Heads hd,
                         float scale) {
  __shared__ float qs[kTile][HS];
  __shared__ float dos[kTile][HS];
  __shared__ float ls[kTile];
  __shared__ float dl[kTile];
  const auto [b, g, j0, j, active, rows] = tile_block<D>(qkv, T, hd);
  float k[HS], v[HS], dk[HS], dv[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) {
    k[d] = active ? to_f32(rows[j * hd.W + hd.k(g, HS) + d]) : 0.0f;
    v[d] = active ? to_f32(rows[j * hd.W + hd.v(g, HS) + d]) : 0.0f;
    dk[d] = 0.0f;
    dv[d] = 0.0f;
  }
  const int group = hd.NH / hd.NKV;
  for (int h = g * group; h < (g + 1) * group; ++h) {
    const D* dbase = dout + int64_t{b} * T * hd.C + int64_t{h} * HS;  // token t: dbase + t*C
    const float* lse_bh = lse + (int64_t{b} * hd.NH + h) * T;
    const float* delta_bh = delta + (int64_t{b} * hd.NH + h) * T;
    for (int i0 = j0; i0 < T; i0 += kTile) {  // only queries i >= j0 see keys of this block
      __syncthreads();
      load_q_tile<D, HS>(qs, dos, ls, dl, rows, dbase, lse_bh, delta_bh, hd, h, i0, T);
      __syncthreads();
      if (active) {
        const int r_begin = max(0, j - i0);     // queries i = i0 + r >= j
        const int r_end = min(kTile, T - i0);  // and i < T
        for (int r = r_begin; r < r_end; ++r) {
          float s = 0.0f, dp = 0.0f;
#pragma unroll
          for (int d = 0; d < HS; ++d) {
            s += qs[r][d] * k[d];
            dp += dos[r][d] * v[d];
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
  }
  if (active) {
    D* o = dqkv + (int64_t{b} * T + j) * hd.W;
#pragma unroll
    for (int d = 0; d < HS; ++d) {
      o[hd.k(g, HS) + d] = from_f32<D>(dk[d] * scale);
      o[hd.v(g, HS) + d] = from_f32<D>(dv[d]);
    }
  }
}

// The kv heads a call means (0: NH, multi-head), checked: positive and dividing NH.
int check_attention(const char* op, int B, int T, int C, int NH, int NKV) {
  require_positive(op, "B", B);
  require_positive(op, "T", T);
  require_positive(op, "C", C);
  require_positive(op, "NH", NH);
  require_nonnegative(op, "NKV", NKV);
  const int nkv = NKV == 0 ? NH : NKV;
  if (C % NH != 0) TRIAX_THROW(ConfigError, "{}: {} heads do not divide C={}", op, NH, C);
  if (NH % nkv != 0)
    TRIAX_THROW(ConfigError, "{}: NKV={} key/value heads do not divide NH={} query heads", op, nkv, NH);
  if (!attention_supports_head_size(C / NH))
    TRIAX_THROW(ConfigError, "{}: head size {} (C={} / NH={}) is not compiled; supported: 32, 64, 128", op, C / NH, C,
                NH);
  if (B > 65535 || NH > 65535) TRIAX_THROW(ConfigError, "{}: B={} or NH={} exceeds the grid limit 65535", op, B, NH);
  return nkv;
}

Heads heads_of(int C, int NH, int NKV) { return {C, NH, NKV, C + int64_t{2} * NKV * (C / NH)}; }

dim3 attention_grid(int B, int T, int heads) { return dim3((T + kBlock - 1) / kBlock, heads, B); }

template <class D, int HS>
void forward_hs(D* out, float* lse, const D* qkv, int B, int T, const Heads& hd, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  attention_forward_kernel<D, HS><<<attention_grid(B, T, hd.NH), kBlock, 0, stream>>>(out, lse, qkv, T, hd, scale);
  check_launch();
}

template <class D, int HS>
void backward_hs(D* dqkv, const D* dout, const D* qkv, const float* lse, const float* delta, int B, int T,
                 const Heads& hd, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  attention_dq_kernel<D, HS><<<attention_grid(B, T, hd.NH), kBlock, 0, stream>>>(dqkv, dout, qkv, lse, delta, T, hd,
                                                                                 scale);
  check_launch();
  attention_dkv_kernel<D, HS><<<attention_grid(B, T, hd.NKV), kBlock, 0, stream>>>(dqkv, dout, qkv, lse, delta, T,
                                                                                   hd, scale);
  check_launch();
}

}  // namespace

bool attention_supports_head_size(int hs) { return hs == 32 || hs == 64 || hs == 128; }

template <class Real>
void attention_forward(Real* out, float* lse, const Real* qkv, int B, int T, int C, int NH, int NKV,
                       cudaStream_t stream) {
  const char* op = "cuda::attention_forward";
  const NvtxRange range(op);
  const Heads hd = heads_of(C, NH, check_attention(op, B, T, C, NH, NKV));
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse);
  require_pointer(op, "qkv", qkv);
  switch (C / NH) {
    case 32: forward_hs<device_t<Real>, 32>(dptr(out), lse, dptr(qkv), B, T, hd, stream); break;
    case 64: forward_hs<device_t<Real>, 64>(dptr(out), lse, dptr(qkv), B, T, hd, stream); break;
    case 128: forward_hs<device_t<Real>, 128>(dptr(out), lse, dptr(qkv), B, T, hd, stream); break;
  }
}

template <class Real>
void attention_backward(Real* dqkv, const Real* dout, const Real* qkv, const Real* out, const float* lse, int B, int T,
                        int C, int NH, int NKV, cudaStream_t stream) {
  const char* op = "cuda::attention_backward";
  const NvtxRange range(op);
  const Heads hd = heads_of(C, NH, check_attention(op, B, T, C, NH, NKV));
  require_pointer(op, "dqkv", dqkv);
  require_pointer(op, "dout", dout);
  require_pointer(op, "qkv", qkv);
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse);
  const int64_t rows = int64_t{B} * NH * T;
  Scratch delta(sizeof(float) * static_cast<size_t>(rows), stream);
  attention_delta_kernel<<<grid_for(rows), kThreads, 0, stream>>>(delta.as<float>(), dptr(dout), dptr(out), B, T, C,
                                                                  NH, C / NH);
  check_launch();
  const float* dl = delta.as<float>();
  switch (C / NH) {
    case 32: backward_hs<device_t<Real>, 32>(dptr(dqkv), dptr(dout), dptr(qkv), lse, dl, B, T, hd, stream); break;
    case 64: backward_hs<device_t<Real>, 64>(dptr(dqkv), dptr(dout), dptr(qkv), lse, dl, B, T, hd, stream); break;
    case 128: backward_hs<device_t<Real>, 128>(dptr(dqkv), dptr(dout), dptr(qkv), lse, dl, B, T, hd, stream); break;
  }
}

#define TRIAX_ATTENTION_INSTANTIATE(R)                                                                             \
  template void attention_forward<R>(R*, float*, const R*, int, int, int, int, int, cudaStream_t);                \
  template void attention_backward<R>(R*, const R*, const R*, const R*, const float*, int, int, int, int, int,     \
                                      cudaStream_t);
TRIAX_ATTENTION_INSTANTIATE(float)
TRIAX_ATTENTION_INSTANTIATE(bf16)
TRIAX_ATTENTION_INSTANTIATE(f16)
#undef TRIAX_ATTENTION_INSTANTIATE

}  // namespace triax::cuda
