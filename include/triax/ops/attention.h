// Causal multi-head self-attention on the CPU, flash-style: the (T, T) score matrix is never kept.
// Forward saves one log-sum-exp per query row; backward recomputes the probabilities from it.
// Query blocks of kAttentionBlock rows run as GEMMs (gemm.h) against the keys they may see.
#pragma once
#include <cstdint>

namespace triax::ops {

inline constexpr int kAttentionBlock = 64;  // query rows per block

// qkv holds, per token, [q | k | v]: q is C = NH * hs wide with head h in channels [h*hs, (h+1)*hs),
// k and v NKV * hs each (grouped-query attention: query head h reads key/value head h / (NH/NKV));
// NKV = 0 means NH, the multi-head [q | k | v] of 3C. A TP shard passes its local C = C_full/tp,
// NH = NH_full/tp and NKV = NKV_full/tp with its heads' columns of the QKV projection. Scores are
// q.k / sqrt(hs), causal (key <= query). ConfigError unless NH divides C and NKV divides NH.
template <class Real>
void attention_forward(Real* out,        // (B, T, C) head h in channels [h*hs, (h+1)*hs)
                       Real* lse,        // (B, NH, T) log-sum-exp of each scaled score row (saved)
                       const Real* qkv,  // (B, T, C + 2 NKV hs)
                       int B, int T, int C, int NH, int NKV = 0);

// dqkv written in full (q, k and v parts); a key/value head's gradient sums over the query heads of
// its group in head order (deterministic).
template <class Real>
void attention_backward(Real* dqkv,        // (B, T, C + 2 NKV hs)
                        const Real* dout,  // (B, T, C)
                        const Real* qkv,   // (B, T, C + 2 NKV hs) the forward input
                        const Real* lse,   // (B, NH, T) from attention_forward
                        int B, int T, int C, int NH, int NKV = 0);

// ---- context-parallel (ring) attention: one block of queries against one block of keys.
// The queries are rows [q_row0, q_row0 + nq) of every sequence of q (B, q_T, C + 2 NKV hs), in the
// qkv layout above (queries in columns [0, C)). The keys and values are rows [kv_row0, kv_row0 + nk)
// of every sequence of kv (B, kv_T, kv_width): K heads in columns [kv_col0, kv_col0 + NKV hs), V
// heads right after (kv_col0 = C for a qkv tensor, 0 for a packed [K | V] buffer). Query i sits at
// global position q_pos0 + i, key j at k_pos0 + j, and query i sees key j iff k_pos0 + j <= q_pos0 + i
// (causal by true positions, so any pair of sequence chunks can be combined).
struct AttentionBlock {
  int B = 0, C = 0, NH = 0, NKV = 0;  // NKV = 0: NH
  int q_T = 0, q_row0 = 0, nq = 0;
  int kv_T = 0, kv_row0 = 0, nk = 0, kv_width = 0, kv_col0 = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
};

// Merges the block into the running result of rows [q_row0, q_row0 + nq): out (B, q_T, C) and lse
// (B, NH, q_T), where lse = -inf marks a row no block has reached yet (its out is then ignored and
// overwritten). Online softmax: lse' = log(exp(lse) + exp(lse_b)), out' = out exp(lse - lse') +
// out_b exp(lse_b - lse'). A row that sees no key of this block is left as it is.
template <class Real>
void attention_block_forward(Real* out, Real* lse, const Real* q, const Real* kv, const AttentionBlock& a);

// The block's share of the gradients, given the final out and lse of the rows (after every block):
// dq (like q: query columns of the rows) += and dkv (like kv: K and V columns of the key rows) +=.
// P = exp(s - lse), D = rowsum(dout * out) per head, dS = P (dout V^T - D).
template <class Real>
void attention_block_backward(Real* dq, Real* dkv, const Real* dout, const Real* q, const Real* kv, const Real* out,
                              const Real* lse, const AttentionBlock& a);

// Checks an AttentionBlock (ConfigError naming the field) and returns its key/value head count.
int check_attention_block(const char* op, const AttentionBlock& a);

// The elements each tensor of a block op must hold (after check_attention_block): q and dq
// (B, q_T, C + 2 NKV hs), kv and dkv (B, kv_T, kv_width), out and dout (B, q_T, C), lse (B, NH, q_T).
struct AttentionBlockSizes {
  int64_t q, kv, out, lse;
};
AttentionBlockSizes attention_block_sizes(const char* op, const AttentionBlock& a);

// dst rows r (width dst_width) columns [dst_col0, dst_col0 + ncols) = src row r columns
// [src_col0, ...), for r < rows: packs the K/V columns of qkv into a send buffer and back.
// Widths and columns count elements of elem_bytes bytes (any element type).
void copy_columns(void* dst, const void* src, int elem_bytes, int64_t rows, int dst_width, int dst_col0, int src_width,
                  int src_col0, int ncols);

}  // namespace triax::ops
