// A 3D-parallel layout and the software options that change its cost: tp x cp x pp x dp (cp:
// context parallel, the sequence split across ranks), virtual
// stages, micro-batch size, schedule, recomputation, sequence parallel, ZeRO level
// (0..3, with HSDP shard groups), precision.
// layout_problem() says why a layout cannot run a model on a cluster (the planner's "invalid").
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "triax/core/enum_names.h"
#include "triax/plan/cluster.h"
#include "triax/plan/model_shape.h"

namespace triax::plan {

// The runtime's schedules and recomputation modes, the same enums and names (core/enum_names.h).
using Schedule = ScheduleKind;
using triax::Recompute;
enum class Precision { bf16, fp16, fp32 };
// fused: one attention kernel that never writes the s x s scores (FlashAttention-style);
// unfused: QK^T, softmax and AV as separate kernels that store the scores (Megatron-LM 2021).
enum class AttentionKernel { fused, unfused };
// How the context-parallel ranks share keys and values: p2p, K/V blocks passed around the CP ring,
// each step overlapped with the attention of the block in hand (ring attention); allgather, all of
// K/V gathered once per layer before the attention (not overlapped), dK/dV reduce-scattered back.
enum class CpComm { p2p, allgather };

std::string_view to_string(Schedule s);
std::string_view to_string(Recompute r);
std::string_view to_string(Precision p);
std::string_view to_string(AttentionKernel a);
std::string_view to_string(CpComm c);
// Parsers accept exactly the names to_string prints (1f1b, zb-h1, ...); ConfigError otherwise.
Schedule parse_schedule(std::string_view s);
Recompute parse_recompute(std::string_view s);
Precision parse_precision(std::string_view s);
AttentionKernel parse_attention(std::string_view s);
CpComm parse_cp_comm(std::string_view s);

struct Layout {
  int tp = 1;
  // Context parallel: each sample's sequence cut into 2 cp chunks, rank r holding chunks r and
  // 2 cp - 1 - r (zigzag, balancing causal attention); CP ranks are data-parallel for the weights.
  int cp = 1;
  CpComm cp_comm = CpComm::p2p;
  int pp = 1;
  int dp = 1;
  int vpp = 1;          // model chunks per pipeline rank (interleaved schedule only)
  int micro_batch = 1;  // sequences per micro-batch
  Schedule schedule = Schedule::one_f_one_b;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  // ZeRO level over the data-parallel ranks: 0 none (gradients all-reduced), 1 optimizer state
  // sharded, 2 + gradients sharded (reduce-scattered every micro-batch), 3 + parameters sharded
  // (each unit all-gathered before its forward and its backward). docs/PLANNER.md "ZeRO levels".
  int zero = 0;
  // HSDP: shard inside groups of this many DP ranks and all-reduce the shards across the groups;
  // 0 = one group of all dp ranks. Must divide dp; > 1 (and < dp) only with zero >= 2.
  int zero_shard = 0;
  Precision precision = Precision::bf16;

  // Software behaviour of the runtime being modelled (triax defaults; Megatron-LM 2021 differs).
  bool dp_overlap = true;         // DP reduction in buckets, hidden behind the last backward
  bool grad_reduce_fp32 = true;   // gradients accumulated and reduced in fp32
  bool pp_scatter_gather = true;  // cross-node p2p split over the tp ranks, re-gathered on NVLink
  // Backward collective of each column-parallel layer's input gradient (all-reduce, or reduce-scatter
  // with SP) runs while the layer's weight-gradient GEMM computes (Megatron-LM
  // --async-tensor-model-parallel-allreduce, 2021-09 and later); exposed only past that GEMM.
  bool tp_overlap_backward = false;
  // Every TP collective pipelined with the GEMM it feeds or follows (all-gather
  // before QKV and fc1, reduce-scatter after the projection and fc2, and their backward mirrors;
  // Megatron-Core --tp-comm-overlap with Transformer Engine userbuffers): exposed only past the GEMM.
  bool tp_comm_overlap = false;
  // Pipeline sends and receives run beside the compute (Megatron-Core's overlapped p2p of the
  // interleaved schedule): off the critical path.
  bool pp_overlap = false;
  // Megatron-LM r0.8 overlaps the p2p only in the interleaved schedule (megatron/training/arguments.py:
  // overlap_p2p_comm is set False without --num-layers-per-virtual-pipeline-stage): 1F1B then waits
  // for its sends and receives.
  bool pp_overlap_interleaved_only = false;
  // ZeRO-1's parameter all-gather hidden behind the next iteration's first forward
  // (Megatron-Core --overlap-param-gather): exposed only past that forward.
  bool dp_param_gather_overlap = false;
  // Megatron-Core's DDP buckets (megatron/core/distributed, r0.8-r0.10): only pipeline rank 0 splits
  // its gradients into buckets, the last of which holds the word embedding and is reduced only after
  // the last backward, and whose all-gather (the first one the forward waits on) starts only with
  // the iteration; every later rank has one bucket, reduced after its own last backward (behind
  // the drain of the ranks before it) and gathered during the pipeline fill.
  bool dp_mcore_buckets = false;
  bool dropout = false;           // dropout masks stored and applied (hidden and attention)
  AttentionKernel attention = AttentionKernel::fused;
  // A fused causal kernel that skips the score tiles above the diagonal (FlashAttention-2, cuDNN /
  // Transformer Engine fused attention) does about half the counted work at long sequences.
  bool causal_skip = false;
  // The loss over the vocabulary-parallel logits in one fused kernel ((e + 16) bytes per logit
  // forward, (e + 8) backward), or as Megatron's vocab_parallel_cross_entropy runs it without
  // --cross-entropy-loss-fusion: the logits cast to fp32, max, subtract, exp, sum and divide passes
  // ((e + 36) forward) and the gradient scaled in place and cast back ((e + 12) backward).
  bool fused_cross_entropy = true;
  // The triax runtime's own data movement beyond the fused kernels above, priced from its bytes at
  // Cluster::copy_gbps: each layer's input copied into its micro-batch slot, bias fills of the
  // column-parallel GEMMs and bias adds apart from the residual, bias-gradient column sums, the
  // stage boundary's staging copies (activation and gradient, in and out), the embedding's
  // position add and scatter-add, the loss's passes over the logits (docs/PLANNER.md).
  bool runtime_copies = false;

  int gpus() const { return tp * cp * pp * dp; }
  // The ranks that hold the same weights and reduce their gradients together: dp x cp.
  int grad_ranks() const { return dp * cp; }
  // The ranks one shard group spans: zero_shard, or all of dp x cp.
  int shard_size() const { return zero_shard > 0 ? zero_shard : grad_ranks(); }
};

// Reads one ZeRO token of a layout's text ("zero1", "zero2", "zero3", "hsdp4") into `l`: true when
// the token was one, false when it is something else; ConfigError for "zero7" or "hsdp0".
bool parse_zero_token(std::string_view token, Layout& l);
// Reads a whole ZeRO spec: "0".."3", "zero1", "zero3 hsdp4" (space separated); ConfigError naming
// the bad token otherwise.
void parse_zero_spec(std::string_view spec, Layout& l);

// Bytes of one activation element, one parameter, one gradient element.
int activation_bytes(const Layout& l);
int parameter_bytes(const Layout& l);
int gradient_bytes(const Layout& l);
// Micro-batches per pipeline per iteration: global_batch / (dp * micro_batch).
long micro_batches(const ModelShape& m, const Layout& l);

struct LayoutRules {
  bool allow_cross_node_tp = false;  // tp larger than a node's GPUs (all-reduces over the NICs)
};

// Why `l` cannot run `m` on `c` (short sentence naming the numbers), or nullopt when it can.
// Memory is not checked here: that is the cost model's "fits".
std::optional<std::string> layout_problem(const ModelShape& m, const Cluster& c, const Layout& l,
                                          const LayoutRules& rules = {});
// The ZeRO part of layout_problem: a level outside 0..3, a shard size that does not divide dp x cp,
// or shard groups smaller than dp x cp below ZeRO-2.
std::optional<std::string> zero_problem(const Layout& l);
// The context-parallel part of layout_problem: cp < 1, or a sequence that 2 cp chunks (times tp
// under sequence parallelism) do not divide.
std::optional<std::string> cp_problem(const ModelShape& m, const Layout& l);

// "tp2 cp2 pp4 dp8 v2 mbs1 interleaved full sp zero3 hsdp4" style summary (cpN only when cp > 1,
// then cp-allgather for that variant; zero1 / zero2 / zero3, and hsdpN when the shard groups are
// smaller than dp x cp).
std::string describe(const Layout& l);

}  // namespace triax::plan
