// The cost model: roofline kernel times per layer, exposed collectives, pipeline schedule timing,
// DP reduction with overlap, optimizer streaming, and per-stage memory. docs/PLANNER.md writes
// every equation out with its source.
#include "triax/plan/cost_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "triax/core/error.h"
#include "triax/plan/gemm_model.h"

namespace triax::plan {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Roofline of one device: a kernel takes the longer of its FLOPs at the rate its shape reaches
// (gemm_model.h: waves, tiles, K overhead) and its bytes at the achieved memory bandwidth, plus the
// launch gap.
struct Device {
  GemmModel gemm_model;
  double byte_rate;       // bytes/s
  double overhead_s;      // per kernel
  double attention_rate;  // FLOP/s of the fused attention kernel; 0: the GEMM model on its tiles
  double copy_rate;       // bytes/s of plain copies, bias fills and column sums
  // A kernel whose FLOPs run as GEMMs of shape `g` (fused attention: QK^T-sized tiles).
  double kernel(double flops, double bytes, const GemmShape& g) const {
    return std::max(flops / (gemm_model.rate() * gemm_model.efficiency(g)), bytes / byte_rate) + overhead_s;
  }
  double stream(double bytes) const { return bytes / byte_rate + overhead_s; }
  double copy(double bytes) const { return bytes / copy_rate + overhead_s; }
  double attention(double flops, double bytes, const GemmShape& g) const {
    if (attention_rate > 0) return std::max(flops / attention_rate, bytes / byte_rate) + overhead_s;
    return kernel(flops, bytes, g);
  }
  // C(m x n) = A(m x k) B(k x n), `batch` times, elements of e bytes.
  double gemm(double m, double n, double k, double batch, double e) const {
    return std::max(gemm_model.seconds({m, n, k, batch}), e * batch * (m * k + k * n + m * n) / byte_rate) +
           overhead_s;
  }
};

// Times of one layer for one micro-batch on one tensor-parallel rank.
struct LayerTimes {
  double fwd = 0;        // forward kernels
  double bwd_input = 0;  // backward kernels producing input gradients (incl. elementwise)
  double bwd_weight = 0; // weight-gradient GEMMs (ZB-H1 defers these)
  double recompute = 0;  // forward work redone in backward
  double tp_fwd = 0, tp_bwd = 0, tp_recompute = 0;
  double cp_fwd = 0, cp_bwd = 0, cp_recompute = 0;  // exposed K/V exchange (context parallel)
  CpExchange cp;
};

// The attention core of one layer for one micro-batch on one tensor-parallel rank: {forward,
// backward} seconds of the unfused matmuls and softmax, or of the fused kernel. A context-parallel
// rank holds the queries of seq / cp tokens against keys of the whole sequence: with the zigzag
// chunks every rank does 1 / cp of the causal work.
std::pair<double, double> attention_core_times(const ModelShape& m, const Layout& l, const Device& dev) {
  const double b = l.micro_batch, s = m.seq, h = m.hidden, a = m.heads;
  const double t = l.tp, e = activation_bytes(l), sl = s / l.cp;
  const double M = b * sl;                               // tokens of the micro-batch on this rank
  const double dh = h / a, at = a / t;                   // head dim, heads per rank
  const double q = m.qkv_width();                        // 3h, or less with grouped-query attention
  double attn_fwd = 0, attn_bwd = 0;
  if (l.attention == AttentionKernel::unfused) {
    const double scores = b * at * sl * s;  // elements of the (s / cp) x s score matrices on this rank
    const double qk = dev.gemm(sl, s, dh, b * at, e), av = dev.gemm(sl, dh, s, b * at, e);
    attn_fwd = qk + av + dev.stream(2 * e * scores);                 // scale+mask+softmax fused
    attn_bwd = 2 * qk + 2 * av + dev.stream(3 * e * scores);         // softmax backward
    if (l.dropout) {
      attn_fwd += dev.stream((2 * e + 1) * scores);
      attn_bwd += dev.stream((2 * e + 1) * scores);
    }
  } else {
    // One fused kernel: 4 b s^2 h / t FLOPs forward; backward recomputes the scores and runs four
    // more matmuls (2.5x the forward FLOPs). Bytes: Q, K, V, O (and their gradients); K and V are
    // kv_heads / heads of Q's size with grouped-query attention.
    // With causal_skip the kernel visits only the score tiles on or below the diagonal: (n + 1) / (2n)
    // of them for n = s / 128 query (and key) blocks (FlashAttention-2's causal path); the FLOPs
    // counted for MFU stay the full square.
    const double n_blocks = std::max(1.0, std::ceil(s / 128));
    const double visited = l.causal_skip ? (n_blocks + 1) / (2 * n_blocks) : 1;
    const double flops = 4 * b * s * s * h / t * visited / l.cp;
    const GemmShape tile{sl, s, dh, b * at};  // the score tiles, K = head dim
    attn_fwd = dev.attention(flops, e * M * (q + h) / t, tile);
    attn_bwd = dev.attention(2.5 * flops, 2 * e * M * (q + h) / t, tile);
  }
  return {attn_fwd, attn_bwd};
}

// The context-parallel K/V exchange of the layer (cp_exchange) and its exposed parts. Recomputing
// the attention (full, or selective's core attention) needs the other ranks' K/V again: the
// forward's exchange once more.
void add_cp_exchange(const ModelShape& m, const Layout& l, const CollectiveModel& net, double attn_fwd,
                     double attn_bwd, LayerTimes& r) {
  r.cp = cp_exchange(m, l, net, attn_fwd, attn_bwd);
  r.cp_fwd = r.cp.fwd_exposed;
  r.cp_bwd = r.cp.bwd_exposed;
  if (l.recompute != Recompute::none) r.cp_recompute = r.cp.fwd_exposed;
}

LayerTimes layer_times(const ModelShape& m, const Layout& l, const Device& dev, const CollectiveModel& net) {
  const double b = l.micro_batch, s = m.seq, h = m.hidden, f = m.ffn_hidden();
  const double t = l.tp, e = activation_bytes(l);
  const double M = b * s / l.cp;                         // tokens of the micro-batch on this rank
  const double rows = l.sequence_parallel ? M / t : M;   // tokens of LayerNorm / dropout / residual ops
  const double q = m.qkv_width();                        // 3h, or less with grouped-query attention
  const double f1 = m.fc1_width();                       // f, or 2f: SwiGLU's gate and up in one GEMM
  const double mask = l.dropout ? 1 : 0;
  LayerTimes r;

  // Linear layers (column-parallel QKV and fc1 (SwiGLU: gate and up), row-parallel projection and
  // fc2 (down)).
  const double qkv = dev.gemm(M, q / t, h, 1, e), fc1 = dev.gemm(M, f1 / t, h, 1, e);
  const double proj = dev.gemm(M, h, h / t, 1, e), fc2 = dev.gemm(M, h, f / t, 1, e);
  const double lin = qkv + proj + fc1 + fc2;
  r.fwd += lin;
  // Backward, same FLOPs in other shapes: the input gradient dX (M x K) = dY (M x N) W (N x K) has
  // inner dimension N, the weight gradient dW (N x K) = dY^T (N x M) X (M x K) inner dimension M (the
  // tokens), so their tiles, waves and K overhead differ from the forward's.
  r.bwd_input += dev.gemm(M, h, q / t, 1, e) + dev.gemm(M, h / t, h, 1, e) + dev.gemm(M, h, f1 / t, 1, e) +
                 dev.gemm(M, f / t, h, 1, e);
  const double qkv_wgrad = dev.gemm(q / t, h, M, 1, e), fc1_wgrad = dev.gemm(f1 / t, h, M, 1, e);
  r.bwd_weight += qkv_wgrad + dev.gemm(h, h / t, M, 1, e) + fc1_wgrad + dev.gemm(h, f / t, M, 1, e);

  // Attention core.
  const auto [attn_fwd, attn_bwd] = attention_core_times(m, l, dev);
  r.fwd += attn_fwd;
  r.bwd_input += attn_bwd;
  add_cp_exchange(m, l, net, attn_fwd, attn_bwd, r);

  // Memory-bound elementwise kernels: 2 norms (LayerNorm or RMSNorm: the same bytes), 2
  // (bias-)(dropout-)residual adds, bias+GeLU (reads f, writes f) or SwiGLU (reads gate and up,
  // writes f).
  const double act = m.swiglu ? 3 : 2;
  const double ew_fwd = dev.stream(2 * e * rows * h) * 2 + dev.stream((3 * e + mask) * rows * h) * 2 +
                        dev.stream(act * e * M * f / t);
  r.fwd += ew_fwd;
  r.bwd_input += 2 * ew_fwd;  // backward reads saved input and output gradient, writes input gradient
  if (m.rope) {
    // RoPE rotates this rank's q and k heads in place (read and write h + kv dh columns); its
    // backward rotates their gradients back, the same bytes.
    const double rope = dev.stream(2 * e * M * (q - m.kv_head_count() * m.head_dim()) / t);
    r.fwd += rope;
    r.bwd_input += rope;
  }

  if (l.runtime_copies) {
    // The triax runtime: the layer's input copied into its slot, the QKV and fc1 outputs pre-filled
    // with their biases (the GEMM adds onto them), the projection and fc2 biases added apart from
    // the residual; backward, the QKV and fc1 bias-gradient column sums and the zeroed dK, dV.
    // Without biases only the input copy and the zeroed dK, dV remain.
    const double col = e * M * (q + f1) / t;
    r.fwd += dev.copy(2 * e * rows * h);
    if (m.bias) r.fwd += dev.copy(col) + 2 * dev.copy(2 * e * rows * h);
    if (m.bias) r.bwd_input += dev.copy(col);
    r.bwd_input += dev.copy(e * M * (q - h) / t);
  }

  if (l.recompute == Recompute::full) r.recompute = r.fwd;
  // Selective: the attention core's forward again (Korthikanti et al. 2022 §5). Megatron-Core's
  // selective granularity checkpoints the core-attention module whatever its kernel, so a fused
  // kernel's forward is redone too (it saves no memory there: the fused kernel stores no scores).
  if (l.recompute == Recompute::selective) r.recompute = attn_fwd;

  // Tensor-parallel collectives of the layer, on the critical path (not overlapped).
  if (l.tp > 1) {
    const GroupPlacement g = place_group(net.cluster(), l.tp, 1);
    const double bytes = e * M * h;
    double per_pass;  // the collectives of one pass over the layer (forward or backward)
    if (l.sequence_parallel) {
      per_pass = 2 * (net.seconds(CollectiveOp::all_gather, g, bytes) +
                      net.seconds(CollectiveOp::reduce_scatter, g, bytes));
    } else {
      per_pass = 2 * net.seconds(CollectiveOp::all_reduce, g, bytes);
    }
    r.tp_fwd = per_pass;
    r.tp_bwd = per_pass;
    if (l.tp_comm_overlap) {
      // Each collective pipelined with its GEMM: the all-gathers (or all-reduce halves) with QKV and
      // fc1, the reduce-scatters with the projection and fc2; backward the mirror images.
      const double in_coll = l.sequence_parallel ? net.seconds(CollectiveOp::all_gather, g, bytes)
                                                 : net.seconds(CollectiveOp::all_reduce, g, bytes) / 2;
      const double out_coll = l.sequence_parallel ? net.seconds(CollectiveOp::reduce_scatter, g, bytes)
                                                  : net.seconds(CollectiveOp::all_reduce, g, bytes) / 2;
      per_pass = std::max(0.0, in_coll - qkv) + std::max(0.0, out_coll - proj) + std::max(0.0, in_coll - fc1) +
                 std::max(0.0, out_coll - fc2);
      r.tp_fwd = r.tp_bwd = per_pass;
    } else if (l.tp_overlap_backward) {
      // The input-gradient collectives of QKV and fc1 hide behind their weight-gradient GEMMs.
      const double hidden_part = l.sequence_parallel ? 2 * net.seconds(CollectiveOp::reduce_scatter, g, bytes)
                                                     : 2 * net.seconds(CollectiveOp::all_reduce, g, bytes);
      r.tp_bwd = per_pass - hidden_part + std::max(0.0, hidden_part - (qkv_wgrad + fc1_wgrad));
    }
    if (l.recompute == Recompute::full) r.tp_recompute = per_pass;
  }
  return r;
}

// Per micro-batch work on a pipeline rank, split the way the schedules need it.
struct StageTimes {
  double compute = 0;  // all kernels
  double tp = 0;       // tensor-parallel collectives
  double cp = 0;       // exposed context-parallel K/V exchange
  double pp = 0;       // p2p sends and receives on the critical path
  double fwd = 0;      // forward share of compute + tp + pp (ZB-H1 bubble)
  double bwd_input = 0;
  double bwd_weight = 0;
  double backward_tail = 0;  // backward of one micro-batch: the window DP reduction can hide in
  double total() const { return compute + tp + cp + pp; }
};

}  // namespace

CpExchange cp_exchange(const ModelShape& m, const Layout& l, const CollectiveModel& net, double attn_fwd,
                       double attn_bwd) {
  CpExchange x;
  if (l.cp <= 1) return x;
  const Cluster& c = net.cluster();
  const double n = l.cp;
  // Only the key/value heads travel (grouped-query attention): 2 kv/t dh per token of the block.
  x.block_bytes = 2.0 * m.kv_head_count() / l.tp * m.head_dim() * (double(m.seq) / l.cp) * l.micro_batch *
                  activation_bytes(l);
  // The CP ranks sit next to the tp ranks: one node while tp x cp fits in it, else the ring's
  // neighbours (and its wrap-around) cross the inter-node network.
  x.ring = place_group(c, l.cp, l.tp);
  if (l.cp_comm == CpComm::allgather) {
    // The whole K/V (cp blocks) gathered, dK/dV reduce-scattered back; each rank sends cp - 1 blocks
    // of each.
    x.fwd_bytes = x.bwd_bytes = (n - 1) * x.block_bytes;
    x.fwd_seconds = x.fwd_exposed = net.seconds(CollectiveOp::all_gather, x.ring, n * x.block_bytes);
    x.bwd_seconds = x.bwd_exposed = net.seconds(CollectiveOp::reduce_scatter, x.ring, n * x.block_bytes);
    return x;
  }
  GroupPlacement pair = place_group(c, 2, l.tp);
  if (x.ring.nodes > 1) {
    pair.nodes = 2;
    pair.per_node = 1;
    pair.level = x.ring.level;
  }
  const double step_fwd = net.seconds(CollectiveOp::p2p, pair, x.block_bytes);
  const double step_bwd = net.seconds(CollectiveOp::p2p, pair, 2 * x.block_bytes);
  x.fwd_bytes = (n - 1) * x.block_bytes;
  x.bwd_bytes = (n - 1) * 2 * x.block_bytes;
  x.fwd_seconds = (n - 1) * step_fwd;
  x.bwd_seconds = (n - 1) * step_bwd;
  // Each step overlapped with the attention of one block: 1 / cp of the rank's attention time.
  x.fwd_exposed = (n - 1) * std::max(0.0, step_fwd - attn_fwd / n);
  x.bwd_exposed = (n - 1) * std::max(0.0, step_bwd - attn_bwd / n);
  return x;
}

IterationFlops iteration_flops(const ModelShape& m, const Layout& l) {
  const double B = m.global_batch;
  const double layer = layer_forward_flops_per_sequence(m), head = head_forward_flops_per_sequence(m);
  IterationFlops f;
  f.model = 3 * B * (m.layers * layer + head);
  double extra = 0;
  if (l.recompute == Recompute::full) extra = layer;
  if (l.recompute == Recompute::selective) extra = attention_core_flops_per_sequence(m);
  f.executed = f.model + B * m.layers * extra;
  return f;
}

double layer_activation_bytes(const ModelShape& m, const Layout& l) {
  const double b = l.micro_batch, s = m.seq, h = m.hidden, f = m.ffn_hidden(), a = m.heads;
  const double t = l.tp, e = activation_bytes(l), mask = l.dropout ? 1 : 0;
  const double M = b * s / l.cp;  // the tokens of a context-parallel rank
  const double rep = l.sequence_parallel ? 1 / t : 1;  // token-replicated tensors shrink with SP
  if (l.recompute == Recompute::full) return e * M * h * rep;  // the layer's input only
  // Korthikanti et al. 2022 §4: LayerNorm inputs (2), QKV and fc1 inputs (2), two dropout masks are
  // replicated across tp ranks without SP: (4e + 2*mask) s b h.
  double bytes = (4 * e + 2 * mask) * M * h * rep;
  // Sharded by tp: Q, K, V and the projection input (4e s b h; e s b (q + h) with grouped-query
  // attention), the GeLU input and fc2 input (2e s b f); SwiGLU keeps its input, gate and up (2f),
  // and its output, the down projection's input (f): 3e s b f. RoPE stores nothing more (Q and K
  // are kept rotated, the backward rotates the gradients with the same tables); RMSNorm keeps its
  // input, counted above, and one fp32 rstd per token, which like LayerNorm's mean and rstd is left
  // out (4 / (e h) of the input: under 0.1% at h >= 2048).
  const double act = m.swiglu ? 3 : 2;
  bytes += (e * M * (m.qkv_width() + h) + act * e * M * f) / t;
  // Attention scores: softmax output, dropout mask and dropout output, (2e + 1) a s^2 b / t.
  const bool store_scores = l.attention == AttentionKernel::unfused && l.recompute == Recompute::none;
  if (store_scores) bytes += (l.dropout ? 2 * e + 1 : e) * b * a * s * s / t / l.cp;
  if (l.attention == AttentionKernel::fused) bytes += 4 * M * a / t;  // fp32 log-sum-exp rows
  return bytes;
}

namespace {

// What every part of the estimate reads: the model, the layout on its cluster, the device's
// roofline, and the sizes the equations use (PLANNER.md's symbols).
struct Setting {
  const ModelShape& m;
  const Layout& l;
  const Cluster& c;
  const CollectiveModel& net;
  const Device& dev;
  int p, v, t, d;           // pipeline ranks, chunks per rank, tensor size, gradient ranks (dp x cp)
  long mb;                  // micro-batches per iteration
  double e, M, h, V;        // activation bytes, tokens per micro-batch and rank, hidden size, vocabulary
  double chunk_layers;      // layers per model chunk
  GroupPlacement tp_group;  // the tensor-parallel ranks
  std::vector<int> stage_layers;  // uneven layers per pipeline rank (vpp 1); empty: chunk_layers x v each
};

// Layers held by pipeline rank i.
double rank_layers(const Setting& x, int i) {
  return x.stage_layers.empty() ? x.chunk_layers * x.v : double(x.stage_layers[size_t(i)]);
}

// Work outside the layers, per micro-batch: the embedding (first rank), the LM head and
// cross-entropy (last rank), and the triax runtime's copies at stage boundaries.
struct EdgeTimes {
  double emb_fwd = 0, emb_bwd = 0, emb_tp = 0;
  double head_fwd = 0, head_bwd_input = 0, head_bwd_weight = 0, head_tp = 0;
  double stage_in = 0, stage_out = 0, head_copy = 0;
};

EdgeTimes edge_times(const Setting& x) {
  const Layout& l = x.l;
  const Device& dev = x.dev;
  const CollectiveModel& net = x.net;
  const double e = x.e, M = x.M, h = x.h, V = x.V;
  const int t = x.t;
  EdgeTimes r;
  // Embedding (first rank) and LM head + cross-entropy (last rank), per micro-batch.
  const double rows = l.sequence_parallel ? M / t : M;
  // Forward: token rows (and position rows) read, the sum written; without a position table
  // (RoPE) only the rows.
  const bool pos = x.m.learned_positions;
  r.emb_fwd = dev.stream((pos ? 3 : 2) * e * M * h);
  r.emb_bwd = dev.stream(3 * e * M * h);
  const double head_gemm = dev.gemm(M, V / t, h, 1, e);
  const double ce_fwd = l.fused_cross_entropy ? e + 16 : e + 36, ce_bwd = l.fused_cross_entropy ? e + 8 : e + 12;
  r.head_fwd = dev.stream(2 * e * rows * h) + head_gemm + dev.stream(ce_fwd * M * V / t);
  // Head backward: the logit gradient times the table (inner V / t), and the table's gradient
  // (V / t x h, inner M).
  r.head_bwd_input = dev.stream(4 * e * rows * h) + dev.gemm(M, h, V / t, 1, e) + dev.stream(ce_bwd * M * V / t);
  r.head_bwd_weight = dev.gemm(V / t, h, M, 1, e);
  // The triax runtime's copies outside the layers: the embedding writes the looked-up rows and adds
  // the positions in a second pass (5 e M h, against the 3 e M h above), its backward scatter-adds
  // and sums the position rows (6 e M h); a stage boundary copies its activation into (out of) the
  // stage's working buffer and the gradient back (2 e rows h each way per pass); the head hands its
  // input gradient to the backward through one more copy.
  if (l.runtime_copies) {
    if (pos) r.emb_fwd += dev.copy(2 * e * M * h);  // the position pass (none without the table)
    if (pos) r.emb_bwd += dev.copy(3 * e * M * h);
    r.stage_in = r.stage_out = 2 * dev.copy(2 * e * rows * h);
    r.head_copy = dev.copy(2 * e * rows * h);
  }
  if (t > 1) {
    const double bytes = e * M * h;
    if (l.sequence_parallel) {
      r.emb_tp = net.seconds(CollectiveOp::reduce_scatter, x.tp_group, bytes);
      r.head_tp = net.seconds(CollectiveOp::all_gather, x.tp_group, bytes) +
                  net.seconds(CollectiveOp::reduce_scatter, x.tp_group, bytes);
    } else {
      r.emb_tp = net.seconds(CollectiveOp::all_reduce, x.tp_group, bytes);
      r.head_tp = net.seconds(CollectiveOp::all_reduce, x.tp_group, bytes);
    }
    // Vocab-parallel cross-entropy: max, sum-exp and target-logit all-reduces of M fp32 values.
    r.head_tp += 3 * net.seconds(CollectiveOp::all_reduce, x.tp_group, 4 * M);
  }
  return r;
}

// Pipeline point-to-point: one activation forward and one gradient backward per chunk boundary.
struct PipelineP2p {
  double seconds = 0;   // one message across the worst boundary
  GroupPlacement pair;  // two neighbouring pipeline ranks (the worst boundary)
};

PipelineP2p pipeline_p2p(const Setting& x) {
  const Layout& l = x.l;
  const int p = x.p, t = x.t;
  PipelineP2p r;
  if (p > 1) {
    const int stride = t * x.d;
    r.pair = place_group(x.c, 2, stride);
    if (long(p) * stride > x.c.gpus_per_node && r.pair.nodes == 1) {
      r.pair.nodes = 2;
      r.pair.per_node = 1;
    }
    if (r.pair.nodes > 1) r.pair.level = std::max(r.pair.level, place_group(x.c, p, stride).level);
    const double msg = x.e * x.M * x.h / (l.sequence_parallel ? t : 1);
    if (l.pp_scatter_gather && !l.sequence_parallel && t > 1 && r.pair.nodes > 1) {
      // Each tp rank sends 1/t of the (replicated) activation over its own NIC; the receivers
      // all-gather it over NVLink (Narayanan et al. 2021 §4.1 scatter/gather).
      r.seconds = x.net.seconds(CollectiveOp::p2p, r.pair, msg / t) +
                  x.net.seconds(CollectiveOp::all_gather, x.tp_group, msg);
    } else {
      r.seconds = x.net.seconds(CollectiveOp::p2p, r.pair, msg);
    }
  }
  return r;
}

// Per micro-batch work of each pipeline rank: its layers, the edges it holds, its boundaries.
std::vector<StageTimes> stage_times(const Setting& x, const LayerTimes& lt, const EdgeTimes& et, double p2p) {
  const Layout& l = x.l;
  const int p = x.p, v = x.v;
  std::vector<StageTimes> st(p);
  for (int i = 0; i < p; ++i) {
    StageTimes& s = st[i];
    const double L = rank_layers(x, i);  // layers on this rank
    s.fwd = L * (lt.fwd + lt.tp_fwd + lt.cp_fwd);
    s.bwd_input = L * (lt.bwd_input + lt.recompute + lt.tp_bwd + lt.tp_recompute + lt.cp_bwd + lt.cp_recompute);
    s.bwd_weight = L * lt.bwd_weight;
    s.compute = L * (lt.fwd + lt.bwd_input + lt.bwd_weight + lt.recompute);
    s.tp = L * (lt.tp_fwd + lt.tp_bwd + lt.tp_recompute);
    s.cp = L * (lt.cp_fwd + lt.cp_bwd + lt.cp_recompute);
    if (l.runtime_copies) {
      // Every chunk boundary of this rank: one copy forward and one backward (half of each term).
      const double boundaries = (v - (i == 0 ? 1 : 0)) * et.stage_in + (v - (i == p - 1 ? 1 : 0)) * et.stage_out;
      const double head_part = i == p - 1 ? et.head_copy : 0;
      s.compute += boundaries + head_part;
      s.fwd += boundaries / 2;
      s.bwd_input += boundaries / 2 + head_part;
    }
    if (i == 0) {
      s.compute += et.emb_fwd + et.emb_bwd;
      s.tp += et.emb_tp;
      s.fwd += et.emb_fwd + et.emb_tp;
      s.bwd_input += et.emb_bwd;
    }
    if (i == p - 1) {
      s.compute += et.head_fwd + et.head_bwd_input + et.head_bwd_weight;
      s.tp += et.head_tp;
      s.fwd += et.head_fwd;
      s.bwd_input += et.head_bwd_input + et.head_tp;
      s.bwd_weight += et.head_bwd_weight;
    }
    const bool pp_hidden = l.pp_overlap && (!l.pp_overlap_interleaved_only || l.schedule == Schedule::interleaved);
    if (p > 1 && !pp_hidden) {
      s.pp = 2 * v * p2p;
      s.fwd += v * p2p;
      s.bwd_input += v * p2p;
    }
    s.backward_tail = s.bwd_input + s.bwd_weight;
  }
  return st;
}

// The pipeline's time for all micro-batches under the layout's schedule, given the slowest rank
// `crit` (its per micro-batch time tmax) and the sum over ranks.
double pipeline_seconds(const Setting& x, const std::vector<StageTimes>& st, int crit, double sum) {
  const int p = x.p, v = x.v;
  const long mb = x.mb;
  const double tmax = st[crit].total();
  double pipe = 0;
  switch (x.l.schedule) {
    case Schedule::gpipe:
    case Schedule::one_f_one_b:
      // Fill and drain: (m - 1) steps of the slowest rank plus one pass through every rank;
      // (m + p - 1) t for equal stages (Huang et al. 2019; Narayanan et al. 2021 §2.2).
      pipe = (mb - 1) * tmax + sum;
      break;
    case Schedule::interleaved:
      // v chunks per rank shrink the fill and drain v-fold: (m + (p - 1)/v) t for equal stages
      // (Narayanan et al. 2021 §2.2.2).
      pipe = (mb - 1.0 / v) * tmax + sum / v;
      break;
    case Schedule::zb_h1: {
      // Weight gradients fill the drain: bubble (p - 1)(T_F + T_B - T_W) (Qi et al. 2023, ZB-H1).
      double f = 0, bi = 0, w = 0;
      for (const auto& s : st) {
        f += s.fwd / p;
        bi += s.bwd_input / p;
        w += s.bwd_weight / p;
      }
      pipe = mb * tmax + (p - 1) * std::max(0.0, f + bi - w);
      break;
    }
  }
  return pipe;
}

// Parameters of one layer on one tensor-parallel rank.
double layer_params(const Setting& x) {
  const ModelShape& m = x.m;
  const double h = x.h, hf = m.ffn_hidden(), qw = m.qkv_width();
  // Sharded by tp: the matrices (SwiGLU: three MLP matrices) and the column-parallel biases (QKV,
  // fc1 or gate and up). Replicated: the two norms and the row-parallel biases (projection, fc2).
  double sharded = h * qw + h * h + (m.swiglu ? 3 : 2) * h * hf;
  if (m.bias) sharded = sharded + qw + m.fc1_width();
  const double replicated = 2 * m.norm_parameters() + (m.bias ? 2 * h : 0);
  return sharded / x.t + replicated;
}

// The embedding's parameters (table, position table) and the head's (its own matrix when untied,
// or the tied copy on the last rank when p > 1, and the final norm), per tensor-parallel rank.
double embedding_params(const Setting& x) { return x.V * x.h / x.t + (x.m.learned_positions ? x.m.seq * x.h : 0); }
double head_params(const Setting& x) {
  return (x.p > 1 || !x.m.tied_embeddings ? x.V * x.h / x.t : 0) + x.m.norm_parameters();
}

// Parameters held by each pipeline rank.
std::vector<double> stage_params(const Setting& x) {
  const int p = x.p;
  std::vector<double> params(p);
  for (int i = 0; i < p; ++i) params[i] = rank_layers(x, i) * layer_params(x);
  params[0] += embedding_params(x);
  params[p - 1] += head_params(x);
  return params;
}

// One unit of ZeRO-3's gathers: a layer, the embedding or the head, with its compute per
// micro-batch (kernels and TP collectives) in forward, recomputation and backward.
struct Unit {
  double params = 0;
  double fwd = 0, recompute = 0, bwd = 0;
};

// The units of pipeline rank i in forward order.
std::vector<Unit> stage_units(const Setting& x, const LayerTimes& lt, const EdgeTimes& et, int i) {
  std::vector<Unit> units;
  if (i == 0) units.push_back({embedding_params(x), et.emb_fwd + et.emb_tp, 0, et.emb_bwd});
  const Unit layer{layer_params(x), lt.fwd + lt.tp_fwd + lt.cp_fwd, lt.recompute + lt.tp_recompute + lt.cp_recompute,
                   lt.bwd_input + lt.bwd_weight + lt.tp_bwd + lt.cp_bwd};
  units.insert(units.end(), size_t(rank_layers(x, i)), layer);
  if (i == x.p - 1)
    units.push_back({head_params(x), et.head_fwd, 0, et.head_bwd_input + et.head_bwd_weight + et.head_tp});
  return units;
}

// ZeRO-3's exposed gathers of one pass over the units (in the pass's order): the first unit's
// gather, then each next unit's gather, prefetched while the current one computes, past that compute.
template <class Gather, class Compute>
double gather_pass(const std::vector<Unit>& units, bool backward, Gather gather, Compute compute) {
  const size_t n = units.size();
  auto at = [&](size_t k) -> const Unit& { return units[backward ? n - 1 - k : k]; };
  double exposed = gather(at(0));
  for (size_t k = 0; k + 1 < n; ++k) exposed += std::max(0.0, gather(at(k + 1)) - compute(at(k)));
  return exposed;
}

// The data-parallel sync of one pipeline rank under ZeRO-2/3, per step: exposed seconds, the
// exposed post-step gather (ZeRO-2), the hidden seconds that share SMs, and its bytes.
struct StageSync {
  double exposed = 0, gather = 0, hidden = 0;
  DpTraffic traffic;
};

StageSync sharded_sync(const Setting& x, const StageTimes& st, const std::vector<Unit>& units, double params,
                       double slack) {
  const Layout& l = x.l;
  const CollectiveModel& net = x.net;
  const int s = l.shard_size(), r = x.d / s;
  const double gbytes = gradient_bytes(l), wbytes = parameter_bytes(l), mb = double(x.mb);
  StageSync z;
  DpTraffic& tr = z.traffic;
  tr.shard_group = place_group(x.c, s, x.t);
  tr.replica_group = place_group(x.c, r, x.t * s);
  // Every micro-batch: the gradients reduce-scattered inside the shard group (per unit, as its
  // backward completes), then each 1/s shard all-reduced across the r groups (HSDP).
  const double rs = net.seconds(CollectiveOp::reduce_scatter, tr.shard_group, params * gbytes) +
                    net.seconds(CollectiveOp::all_reduce, tr.replica_group, params * gbytes / s);
  const double window = l.dp_overlap ? st.backward_tail : 0;
  z.exposed = (mb - 1) * std::max(0.0, rs - window) + std::max(0.0, rs - window - slack);
  tr.reduce_scatter = mb * params * gbytes;
  tr.all_reduce = r > 1 ? mb * params * gbytes / s : 0;
  tr.calls = int(mb) * (r > 1 ? 2 : 1) * int(units.size());
  double busy = mb * rs;
  if (l.zero == 2) {
    // The updated shards all-gathered once after the step (as ZeRO-1).
    const double g = net.seconds(CollectiveOp::all_gather, tr.shard_group, params * wbytes);
    z.gather = l.dp_param_gather_overlap ? std::max(0.0, g - st.fwd) : g;
    tr.all_gather = params * wbytes;
    tr.calls += 1;
    busy += g;
  } else {
    // Each unit gathered before its forward, its recomputation (full) and its backward.
    auto gather = [&](const Unit& u) { return net.seconds(CollectiveOp::all_gather, tr.shard_group, u.params * wbytes); };
    const bool again = l.recompute == Recompute::full;
    const double passes = 2 + again;
    double exposed = gather_pass(units, false, gather, [](const Unit& u) { return u.fwd; }) +
                     gather_pass(units, true, gather, [](const Unit& u) { return u.bwd; });
    if (again) exposed += gather_pass(units, true, gather, [](const Unit& u) { return u.recompute; });
    double all = 0;
    for (const Unit& u : units) all += gather(u);
    z.exposed += mb * exposed;
    tr.all_gather = mb * passes * params * wbytes;
    tr.calls += int(mb * passes) * int(units.size());
    busy += mb * passes * all;
  }
  z.hidden = std::max(0.0, busy - z.exposed - z.gather);
  return z;
}

// Data-parallel gradient reduction, exposed part. Reduction of rank i may hide behind its last
// backward (with overlap) and behind the drain of the ranks before it, which finish later. Sets
// est.dp_algorithm when there is a reduction, and est.dp_traffic for the rank with most parameters.
double dp_reduction_seconds(const Setting& x, const std::vector<StageTimes>& st, const std::vector<double>& params,
                            const std::vector<std::vector<Unit>>& units, Estimate& est) {
  const Layout& l = x.l;
  const Cluster& c = x.c;
  const CollectiveModel& net = x.net;
  const int p = x.p, v = x.v, t = x.t, d = x.d;
  const double gbytes = gradient_bytes(l), wbytes = parameter_bytes(l);
  const GroupPlacement dg = place_group(c, d, t);
  double worst = 0, gather = 0, slack = 0, fill = 0, contention = 0, most = -1;
  // Megatron-Core buckets: the word embedding (and position table) closes rank 0's last bucket.
  const double emb_params = embedding_params(x);
  for (int i = 0; i < p; ++i) {
    const bool buckets = !l.dp_mcore_buckets || i == 0;  // later ranks: one bucket
    const bool most_params = params[i] > most;
    most = std::max(most, params[i]);
    if (l.zero >= 2) {
      const StageSync z = sharded_sync(x, st[i], units[i], params[i], slack);
      worst = std::max(worst, z.exposed);
      gather = std::max(gather, z.gather);
      contention = std::max(contention, c.comm_sm_fraction * z.hidden);
      if (most_params) est.dp_traffic = z.traffic;
      slack += st[i].backward_tail;
      continue;
    }
    if (most_params) {
      est.dp_traffic = DpTraffic{};
      est.dp_traffic.shard_group = dg;
      est.dp_traffic.calls = l.zero == 1 ? 2 : 1;
      (l.zero == 1 ? est.dp_traffic.reduce_scatter : est.dp_traffic.all_reduce) = params[i] * gbytes;
      if (l.zero == 1) est.dp_traffic.all_gather = params[i] * wbytes;
    }
    double reduce, g = 0, tail = 0;  // g: ZeRO-1's parameter all-gather
    if (l.zero == 1) {
      reduce = net.seconds(CollectiveOp::reduce_scatter, dg, params[i] * gbytes);
      g = net.seconds(CollectiveOp::all_gather, dg, params[i] * wbytes);
      double exposed = g;
      if (l.dp_param_gather_overlap) {
        if (!l.dp_mcore_buckets) {
          exposed = std::max(0.0, g - st[i].fwd);
        } else if (i == 0) {
          // The embedding's bucket is gathered before the first kernel; the rest behind the forward.
          exposed = std::max(net.seconds(CollectiveOp::all_gather, dg, emb_params * wbytes), g - st[i].fwd);
        } else {
          exposed = std::max(0.0, g - fill);  // the first forward here waits for the ranks before
        }
      }
      gather = std::max(gather, exposed);
      if (l.dp_mcore_buckets && i == 0) tail = net.seconds(CollectiveOp::reduce_scatter, dg, emb_params * gbytes);
    } else {
      const CollectiveCost cc = net.cost(CollectiveOp::all_reduce, dg, params[i] * gbytes);
      reduce = cc.seconds;
      if (i == 0) est.dp_algorithm = std::string(to_string(cc.algorithm));
      if (l.dp_mcore_buckets && i == 0) tail = net.seconds(CollectiveOp::all_reduce, dg, emb_params * gbytes);
    }
    const double window = (l.dp_overlap && buckets ? st[i].backward_tail : 0) + slack;
    // The hidden part of this rank's reduction that runs beside its own last backward, and of its
    // gather beside its first forward, holds SMs those kernels would use (Cluster::comm_sm_fraction).
    double beside = 0;
    if (l.dp_overlap && buckets) beside += std::min(std::max(0.0, reduce - tail), st[i].backward_tail);
    if (l.zero == 1 && l.dp_param_gather_overlap && (!l.dp_mcore_buckets || i == 0))
      beside += std::min(g, st[i].fwd);
    contention = std::max(contention, c.comm_sm_fraction * beside);
    worst = std::max(worst, std::max(tail, reduce - window));
    slack += st[i].backward_tail;
    fill += st[i].fwd / v;
  }
  if (l.zero >= 1) est.dp_algorithm = "ring";
  return worst + gather + contention;
}

// The optimizer step of the rank with most parameters.
double optimizer_seconds(const Setting& x, const std::vector<double>& params) {
  const Layout& l = x.l;
  const bool fp32 = l.precision == Precision::fp32;
  const double gbytes = gradient_bytes(l), wbytes = parameter_bytes(l);
  // AdamW streams per parameter: gradient read twice (norm, update) and zeroed, master/param, m, v
  // read and written (24 bytes), the low-precision copy written. Half-precision gradients go through
  // Megatron-LM's mixed-precision optimizer: the model gradient is read and zeroed (2 x 2), copied to
  // an fp32 main gradient (4), unscaled in place with the inf check (8), read for the norm (4), then
  // Adam (28) and the main parameters copied back to the model (4 + 2): 54 bytes at fp16.
  double opt_bytes = fp32 ? 3 * 4 + 24 : 3 * gbytes + 24 + wbytes;
  if (!fp32 && !l.grad_reduce_fp32) opt_bytes = 2 * gbytes + 4 + 8 + 4 + 28 + 4 + wbytes;
  double opt = 0;
  for (int i = 0; i < x.p; ++i) {
    const double owned = l.zero >= 1 ? params[i] / l.shard_size() : params[i];
    opt = std::max(opt, x.dev.stream(owned * opt_bytes) + 4 * x.dev.overhead_s);
  }
  return opt;
}

// Parameters of the two units in flight under ZeRO-2/3 (the one computing and the one prefetched or
// reducing): the largest sum of two neighbouring units of the stage.
double in_flight_units(const std::vector<Unit>& units) {
  double most = units.empty() ? 0 : units[0].params;
  for (size_t k = 0; k + 1 < units.size(); ++k) most = std::max(most, units[k].params + units[k + 1].params);
  return most;
}

// Weights, gradients and optimizer state of a rank holding `params` under the layout's ZeRO level,
// sharded over d = the shard group (all of dp without HSDP). ZeRO-1: the optimizer state / d;
// ZeRO-2: + gradients / d and two units' gradient buffers; ZeRO-3: + weights / d and two gathered units.
void sharded_state(const Layout& l, double params, double unit_pair, MemoryBreakdown& mem) {
  const double gbytes = gradient_bytes(l), wbytes = parameter_bytes(l);
  const double opt_state = l.precision == Precision::fp32 ? 8 : 12;  // Adam m, v (+ fp32 master)
  const double d = l.zero >= 1 ? l.shard_size() : 1;
  mem.weights = l.zero >= 3 ? params * wbytes / d + unit_pair * wbytes : params * wbytes;
  mem.gradients = l.zero >= 2 ? params * gbytes / d + unit_pair * gbytes : params * gbytes;
  mem.optimizer = params * opt_state / d;
}

// Memory of every pipeline rank.
std::vector<MemoryBreakdown> stage_memory(const Setting& x, const std::vector<double>& params,
                                          const std::vector<std::vector<Unit>>& units) {
  const ModelShape& m = x.m;
  const Layout& l = x.l;
  const Cluster& c = x.c;
  const int p = x.p, v = x.v, t = x.t, d = x.d;
  const long mb = x.mb;
  const double e = x.e, M = x.M, h = x.h, V = x.V;
  const double stored = layer_activation_bytes(m, l);
  Layout no_rc = l;
  no_rc.recompute = Recompute::none;
  const double working = l.recompute == Recompute::none ? 0 : layer_activation_bytes(m, no_rc) - stored;
  int groups = (t > 1) + (d > 1) + (p > 1) + (p > 1 && m.tied_embeddings) + (l.cp > 1);
  // Context parallel: the K/V blocks in flight (p2p: the one being computed on and the one
  // arriving), or the whole gathered K/V (allgather).
  const CpExchange cpx = cp_exchange(m, l, x.net, 0, 0);
  const double cp_buffers = (l.cp_comm == CpComm::allgather ? l.cp : 2) * cpx.block_bytes;
  std::vector<MemoryBreakdown> all(p);
  for (int i = 0; i < p; ++i) {
    MemoryBreakdown& mem = all[i];
    mem.stage = i;
    mem.capacity = c.memory_gib * kGiB;
    mem.reserved = c.reserved_gib * kGiB;
    sharded_state(l, params[i], in_flight_units(units[i]), mem);
    const double chunk_layers = rank_layers(x, i) / v;
    double in_flight;  // layer x micro-batch activation sets held at once
    switch (l.schedule) {
      case Schedule::gpipe: in_flight = double(mb) * chunk_layers; break;
      case Schedule::interleaved:
        in_flight = std::min<double>(double(mb) * v, (p - i - 1) * 2.0 + (v - 1.0) * p + 1) * chunk_layers;
        break;
      default: in_flight = std::min<double>(mb, p - i) * chunk_layers; break;
    }
    mem.activations = in_flight * stored + working;
    if (i == p - 1) mem.activations += (e + 4) * M * V / t;  // logits + fp32 softmax for the loss
    if (p > 1) mem.comm_buffers += 2 * e * M * h / (l.sequence_parallel ? t : 1);
    mem.comm_buffers += groups * c.collective_buffer_mib * 1024 * 1024 + cp_buffers;
  }
  return all;
}

// The pipeline rank that needs most.
MemoryBreakdown peak_memory(const Setting& x, const std::vector<double>& params,
                            const std::vector<std::vector<Unit>>& units) {
  const std::vector<MemoryBreakdown> all = stage_memory(x, params, units);
  return *std::max_element(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.total() < b.total(); });
}

double peak_rate(const Cluster& c, const Layout& l) {
  return (l.precision == Precision::fp32 ? c.peak_tflops_fp32 : c.peak_tflops_bf16) * 1e12;
}

Device make_device(const Cluster& c, const Layout& l) {
  const double peak = peak_rate(c, l);
  const double byte_rate = c.memory_gbps * 1e9 * c.memory_efficiency;
  return Device{GemmModel::for_cluster(c, peak), byte_rate, c.kernel_overhead_us * 1e-6, peak * c.attention_efficiency,
                c.copy_gbps > 0 ? c.copy_gbps * 1e9 : byte_rate};
}

Setting make_setting(const ModelShape& m, const CollectiveModel& net, const Layout& l, const Device& dev, long mb,
                     std::vector<int> stage_layers) {
  const Cluster& c = net.cluster();
  return Setting{m, l, c, net, dev, l.pp, l.vpp, l.tp, l.grad_ranks(), mb,
                 double(activation_bytes(l)), double(l.micro_batch) * m.seq / l.cp, double(m.hidden), double(m.vocab),
                 double(m.layers) / (l.pp * l.vpp), place_group(c, l.tp, 1), std::move(stage_layers)};
}

// What the ranks synchronise after the pipelines drain, exposed: the DP reduction, the tied
// embedding's all-reduce between the first and last rank, the global gradient norm.
double sync_exposed(const Setting& x, const std::vector<StageTimes>& st, const std::vector<double>& params,
                    const std::vector<std::vector<Unit>>& units, const PipelineP2p& p2p, Estimate& est) {
  const Layout& l = x.l;
  double dp_exposed = 0;
  if (x.d > 1) dp_exposed = dp_reduction_seconds(x, st, params, units, est);
  // Tied embedding: the first and last pipeline ranks sum their copies' gradients.
  if (x.p > 1 && x.m.tied_embeddings)
    dp_exposed += x.net.seconds(CollectiveOp::all_reduce, p2p.pair, x.V * x.h / x.t * gradient_bytes(l));
  // Global gradient norm (and the loss-scale overflow check): one tiny all-reduce over the world.
  if (l.gpus() > 1) dp_exposed += 2 * x.net.seconds(CollectiveOp::all_reduce, place_group(x.c, l.gpus(), 1), 4);
  return dp_exposed;
}

// A layout of uneven stages: vpp 1, one layer count >= 1 per pipeline rank; the rest as
// layout_problem judges it on a model of one layer per stage (the cluster's node count stretched:
// the ranks may be one class's share of a larger job).
void check_uneven(const ModelShape& m, const Cluster& c, const Layout& l, const std::vector<int>& layers) {
  if (l.vpp != 1 || layers.size() != size_t(l.pp))
    TRIAX_THROW(ConfigError, "uneven stages need vpp 1 and {} layer counts, got vpp {} and {}", l.pp, l.vpp,
                layers.size());
  for (int n : layers)
    if (n < 1) TRIAX_THROW(ConfigError, "every pipeline stage needs >= 1 layer, got {}", n);
  ModelShape probe = m;
  probe.layers = l.pp;
  probe.global_batch = long(l.dp) * l.micro_batch;
  Cluster big = c;
  big.nodes = std::max(c.nodes, (l.gpus() + c.gpus_per_node - 1) / c.gpus_per_node);
  if (auto why = layout_problem(probe, big, l))
    TRIAX_THROW(ConfigError, "layout {} cannot run model '{}' on '{}': {}", describe(l), m.name, c.name, *why);
}

// Prices the pipeline ranks of uneven stages and hands the pieces to `f`.
template <class F>
auto with_uneven_stages(const ModelShape& m, const CollectiveModel& net, const Layout& l, const std::vector<int>& layers,
                        long micro_batches, F f) {
  validate(m);
  check_uneven(m, net.cluster(), l, layers);
  const Device dev = make_device(net.cluster(), l);
  const Setting x = make_setting(m, net, l, dev, micro_batches, layers);
  const LayerTimes lt = layer_times(m, l, dev, net);
  const EdgeTimes et = edge_times(x);
  const PipelineP2p p2p = pipeline_p2p(x);
  const std::vector<StageTimes> st = stage_times(x, lt, et, p2p.seconds);
  std::vector<std::vector<Unit>> units;
  for (int i = 0; i < x.p; ++i) units.push_back(stage_units(x, lt, et, i));
  return f(x, st, stage_params(x), units, p2p);
}

}  // namespace

std::vector<StageCost> stage_costs(const ModelShape& m, const CollectiveModel& net, const Layout& l,
                                   const std::vector<int>& layers, long micro_batches) {
  return with_uneven_stages(m, net, l, layers, micro_batches,
                            [](const Setting& x, const std::vector<StageTimes>& st, const std::vector<double>& params,
                               const std::vector<std::vector<Unit>>& units, const PipelineP2p&) {
                              const std::vector<MemoryBreakdown> mem = stage_memory(x, params, units);
                              std::vector<StageCost> out(size_t(x.p));
                              for (int i = 0; i < x.p; ++i) {
                                out[i].seconds = st[i].total();
                                out[i].compute = st[i].compute;
                                out[i].optimizer = optimizer_seconds(x, std::vector<double>(size_t(x.p), params[i]));
                                out[i].params = params[i];
                                out[i].memory = mem[i];
                              }
                              return out;
                            });
}

double sync_seconds(const ModelShape& m, const CollectiveModel& net, const Layout& l, const std::vector<int>& layers,
                    long micro_batches) {
  return with_uneven_stages(m, net, l, layers, micro_batches,
                            [](const Setting& x, const std::vector<StageTimes>& st, const std::vector<double>& params,
                               const std::vector<std::vector<Unit>>& units, const PipelineP2p& p2p) {
                              Estimate unused;
                              return sync_exposed(x, st, params, units, p2p, unused);
                            });
}

Estimate estimate(const ModelShape& m, const CollectiveModel& net, const Layout& l, const LayoutRules& rules) {
  validate(m);
  const Cluster& c = net.cluster();
  if (auto why = layout_problem(m, c, l, rules))
    TRIAX_THROW(ConfigError, "layout {} cannot run model '{}' on '{}': {}", describe(l), m.name, c.name, *why);

  const double peak = peak_rate(c, l);
  const Device dev = make_device(c, l);
  const Setting x = make_setting(m, net, l, dev, micro_batches(m, l), {});
  const int p = x.p, t = x.t;
  const long mb = x.mb;

  const LayerTimes lt = layer_times(m, l, dev, net);
  const EdgeTimes et = edge_times(x);
  const PipelineP2p p2p = pipeline_p2p(x);
  const std::vector<StageTimes> st = stage_times(x, lt, et, p2p.seconds);

  int crit = 0;
  double sum = 0;
  for (int i = 0; i < p; ++i) {
    sum += st[i].total();
    if (st[i].total() > st[crit].total()) crit = i;
  }
  const double tmax = st[crit].total();
  const double pipe = pipeline_seconds(x, st, crit, sum);

  Estimate est;
  est.model = m;
  est.layout = l;
  est.cluster = c.name;
  est.micro_batches = mb;
  est.time.compute = mb * st[crit].compute;
  est.time.tp_comm = mb * st[crit].tp;
  est.time.cp_comm = mb * st[crit].cp;
  if (l.cp > 1) {
    const double layers = x.chunk_layers * x.v;
    const double passes = l.recompute != Recompute::none ? 2 : 1;  // the forward's exchange again
    est.cp_traffic.per_layer = lt.cp;
    est.cp_traffic.seconds = mb * layers * (passes * lt.cp.fwd_seconds + lt.cp.bwd_seconds);
    est.cp_traffic.exposed = est.time.cp_comm;
    est.cp_traffic.bytes = mb * layers * (passes * lt.cp.fwd_bytes + lt.cp.bwd_bytes);
  }
  est.time.pp_comm = mb * st[crit].pp;
  est.time.bubble = std::max(0.0, pipe - mb * tmax);

  const std::vector<double> params = stage_params(x);
  std::vector<std::vector<Unit>> units;
  for (int i = 0; i < p; ++i) units.push_back(stage_units(x, lt, et, i));
  est.time.dp_comm = sync_exposed(x, st, params, units, p2p, est);
  const double opt = optimizer_seconds(x, params);
  est.time.optimizer = opt;

  // More ranks than cores on a node: the ranks time-slice. A rank that waits (bubble, a slower
  // peer) yields its core to the others, so the iteration takes the longer of the dependency-bound
  // time above (each rank at a full core) and the node's busy time (every rank's kernels, TP and
  // PP time and optimizer step) spread over its cores.
  const int on_node = std::min(l.gpus(), c.gpus_per_node);
  if (c.cores_per_node > 0 && on_node > c.cores_per_node) {
    double busy = 0;  // one pipeline's ranks, one (tp, dp) copy each
    for (int i = 0; i < p; ++i) busy += mb * st[i].total() + opt;
    const double node_busy = busy * double(t) * x.d * on_node / l.gpus();
    est.time.core_sharing = std::max(0.0, node_busy / c.cores_per_node - est.time.total());
  }

  est.memory = peak_memory(x, params, units);
  est.seconds_per_iteration = est.time.total();
  est.flops = iteration_flops(m, l);
  const double gpus = l.gpus();
  est.tflops_per_gpu = est.flops.executed / (est.seconds_per_iteration * gpus) / 1e12;
  est.mfu = est.flops.model / (est.seconds_per_iteration * gpus * peak);
  est.tokens_per_second = double(m.global_batch) * m.seq / est.seconds_per_iteration;
  if (est.dp_algorithm.empty()) est.dp_algorithm = "none";
  return est;
}

}  // namespace triax::plan
