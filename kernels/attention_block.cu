// Context-parallel (ring) attention blocks on CUDA cores (ops/attention.h AttentionBlock): the query
// rows [q_row0, q_row0 + nq) of q against the key/value rows [kv_row0, kv_row0 + nk) of kv, causal
// by true positions (query i sees key j iff k_pos0 + j <= q_pos0 + i, so a query sees a prefix of
// the block). Same scheme as kernels/attention.cu: fp32 arithmetic, one thread per query (forward,
// dQ) or per key (dK/dV), the other side streamed through shared memory in tiles of kTile rows.
// Forward: online softmax over the block's keys, then the merge into the running (out, lse) of the
// row (lse = -inf: first block; a row that sees no key is left as it is). Backward, from the final
// out and lse: D = rowsum(dO * O) by a small kernel into scratch; dQ += scale dS K per (b, head,
// query tile); dK += scale dS^T Q, dV += P^T dO per (b, kv head, key tile), the group's query heads
// one after the other, each over its queries in order. Every output element is read, added to and
// written by one thread in a fixed order: deterministic, no atomics; O(T) memory.
#include <cmath>

#include "common.cuh"
#include "triax/cuda/attention.h"
// The kernels (after common.cuh: they use its helpers).
#include "attention_block.cuh"

namespace triax::cuda {
namespace {
using namespace detail;

// Checks the block as the CPU op does (ConfigError naming the field), then the CUDA limits.
Geo check_block(const char* op, const ops::AttentionBlock& a) {
  const int nkv = ops::check_attention_block(op, a);
  const int hs = a.C / a.NH;
  if (!attention_supports_head_size(hs))
    TRIAX_THROW(ConfigError, "{}: head size {} (C={} / NH={}) is not compiled; supported: 32, 64, 128", op, hs, a.C,
                a.NH);
  if (a.B > 65535 || a.NH > 65535)
    TRIAX_THROW(ConfigError, "{}: B={} or NH={} exceeds the grid limit 65535", op, a.B, a.NH);
  return {a.C,    a.NH,      a.NKV > 0 ? a.NKV : a.NH, a.NH / nkv, a.C + 2 * nkv * hs, a.q_T,    a.q_row0, a.nq,
          a.kv_T, a.kv_row0, a.nk,                     a.kv_width, a.kv_col0,          a.q_pos0, a.k_pos0};
}

// Nothing to do: no query, no key, or the last query sees no key of the block.
bool block_empty(const ops::AttentionBlock& a) {
  return a.nq == 0 || a.nk == 0 || a.q_pos0 + a.nq - 1 < a.k_pos0;
}

dim3 block_grid(int rows, int heads, int B) { return dim3((rows + kBlock - 1) / kBlock, heads, B); }

template <class D, int HS>
void block_forward_hs(D* out, float* lse, const D* q, const D* kv, int B, const Geo& g, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  block_forward_kernel<D, HS><<<block_grid(g.nq, g.NH, B), kBlock, 0, stream>>>(out, lse, q, kv, g, scale);
  check_launch();
}

template <class D, int HS>
void block_backward_hs(D* dq, D* dkv, const D* dout, const D* q, const D* kv, const float* lse, const float* delta,
                       int B, const Geo& g, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  block_dq_kernel<D, HS><<<block_grid(g.nq, g.NH, B), kBlock, 0, stream>>>(dq, dout, q, kv, lse, delta, g, scale);
  check_launch();
  block_dkv_kernel<D, HS><<<block_grid(g.nk, g.NKV, B), kBlock, 0, stream>>>(dkv, dout, q, kv, lse, delta, g, scale);
  check_launch();
}

}  // namespace

template <class Real>
void attention_block_forward(Real* out, float* lse, const Real* q, const Real* kv, const ops::AttentionBlock& a,
                             cudaStream_t stream) {
  const char* op = "cuda::attention_block_forward";
  const NvtxRange range(op);
  const Geo g = check_block(op, a);
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse);
  require_pointer(op, "q", q);
  require_pointer(op, "kv", kv);
  if (block_empty(a)) return;
  switch (a.C / a.NH) {
    case 32: block_forward_hs<device_t<Real>, 32>(dptr(out), lse, dptr(q), dptr(kv), a.B, g, stream); break;
    case 64: block_forward_hs<device_t<Real>, 64>(dptr(out), lse, dptr(q), dptr(kv), a.B, g, stream); break;
    case 128: block_forward_hs<device_t<Real>, 128>(dptr(out), lse, dptr(q), dptr(kv), a.B, g, stream); break;
  }
}

template <class Real>
void attention_block_backward(Real* dq, Real* dkv, const Real* dout, const Real* q, const Real* kv, const Real* out,
                              const float* lse, const ops::AttentionBlock& a, cudaStream_t stream) {
  const char* op = "cuda::attention_block_backward";
  const NvtxRange range(op);
  const Geo g = check_block(op, a);
  require_pointer(op, "dq", dq);
  require_pointer(op, "dkv", dkv);
  require_pointer(op, "dout", dout);
  require_pointer(op, "q", q);
  require_pointer(op, "kv", kv);
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse);
  if (block_empty(a)) return;
  const int64_t rows = int64_t{a.B} * a.NH * a.nq;
  Scratch delta(sizeof(float) * static_cast<size_t>(rows), stream);
  block_delta_kernel<<<grid_for(rows), kThreads, 0, stream>>>(delta.as<float>(), dptr(dout), dptr(out), a.B, g,
                                                              a.C / a.NH);
  check_launch();
  const float* dl = delta.as<float>();
  switch (a.C / a.NH) {
    case 32: block_backward_hs<device_t<Real>, 32>(dptr(dq), dptr(dkv), dptr(dout), dptr(q), dptr(kv), lse, dl, a.B, g, stream); break;
    case 64: block_backward_hs<device_t<Real>, 64>(dptr(dq), dptr(dkv), dptr(dout), dptr(q), dptr(kv), lse, dl, a.B, g, stream); break;
    case 128: block_backward_hs<device_t<Real>, 128>(dptr(dq), dptr(dkv), dptr(dout), dptr(q), dptr(kv), lse, dl, a.B, g, stream); break;
  }
}

#define TRIAX_ATTENTION_BLOCK_INSTANTIATE(R)                                                                      \
  template void attention_block_forward<R>(R*, float*, const R*, const R*, const ops::AttentionBlock&,           \
                                           cudaStream_t);                                                        \
  template void attention_block_backward<R>(R*, R*, const R*, const R*, const R*, const R*, const float*,        \
                                            const ops::AttentionBlock&, cudaStream_t);
TRIAX_ATTENTION_BLOCK_INSTANTIATE(float)
TRIAX_ATTENTION_BLOCK_INSTANTIATE(bf16)
TRIAX_ATTENTION_BLOCK_INSTANTIATE(f16)
#undef TRIAX_ATTENTION_BLOCK_INSTANTIATE

}  // namespace triax::cuda
