// Predicts one training iteration of a layout: seconds broken down into compute, pipeline bubble,
// exposed TP / PP / DP communication and optimizer; executed and model FLOPs (TFLOP/s, MFU); and
// memory per device. Equations and their sources: docs/PLANNER.md.
#pragma once
#include <string>
#include <vector>

#include "triax/plan/cluster.h"
#include "triax/plan/collective_model.h"
#include "triax/plan/layout.h"
#include "triax/plan/model_shape.h"

namespace triax::plan {

// FLOPs of one iteration of the whole job.
struct IterationFlops {
  double model = 0;     // forward + backward, no recomputation: what MFU counts
  double executed = 0;  // including recomputed forward work: what TFLOP/s counts
};
// Recomputation adds the layers' forward (full) or the attention core's forward (selective, with
// the unfused kernel; a fused kernel never stores the scores, so selective recomputes nothing).
IterationFlops iteration_flops(const ModelShape& m, const Layout& l);

// Seconds per iteration on the slowest pipeline rank.
struct TimeBreakdown {
  double compute = 0;    // kernels of the busiest rank (GEMMs, memory-bound ops, recompute)
  double bubble = 0;     // pipeline fill / drain idle time and stage imbalance
  double tp_comm = 0;    // tensor-parallel collectives (not overlapped)
  double pp_comm = 0;    // pipeline point-to-point sends on the critical path
  double dp_comm = 0;    // data-parallel gradient reduction left exposed after overlap
  double optimizer = 0;  // AdamW update, grad-norm and zeroing (memory bound)
  // Ranks time-slicing shared cores (Cluster::cores_per_node): what the node's busy time over its
  // cores exceeds the dependency-bound iteration by. The terms above are at a full core each.
  double core_sharing = 0;
  double cp_comm = 0;    // context-parallel K/V exchange past the attention it overlaps (last: keeps
                         // the positional initialisers of the terms above)
  double total() const {
    return compute + bubble + tp_comm + cp_comm + pp_comm + dp_comm + optimizer + core_sharing;
  }
};

// Bytes per device on the pipeline rank that needs the most.
struct MemoryBreakdown {
  double weights = 0;       // under ZeRO-3: the 1/d shard + 2 gathered units
  double gradients = 0;     // under ZeRO-2/3: the 1/d shard + 2 units' gradient buffers
  double optimizer = 0;     // fp32 master copy + Adam moments (divided by the shard group d under ZeRO >= 1)
  double activations = 0;   // stored for backward over all in-flight micro-batches + working set
  double comm_buffers = 0;  // p2p receive buffers and collective library buffers
  double reserved = 0;      // context / workspaces / allocator slack (cluster)
  double capacity = 0;
  int stage = 0;            // the pipeline rank these numbers are for
  double total() const {
    return weights + gradients + optimizer + activations + comm_buffers + reserved;
  }
  bool fits() const { return total() <= capacity; }
};

// The data-parallel collectives of one step on the pipeline rank with the most parameters, in the
// bytes each collective is handed (all-reduce: the buffer; reduce-scatter: its input; all-gather:
// the gathered output), summed over the step's calls. docs/PLANNER.md "ZeRO levels".
struct DpTraffic {
  double all_reduce = 0;      // ZeRO-0 gradients; HSDP: each 1/s gradient shard across the groups
  double reduce_scatter = 0;  // gradients into their shards (ZeRO-1 once, ZeRO-2/3 every micro-batch)
  double all_gather = 0;      // parameters: after the step (ZeRO-1/2), before every pass (ZeRO-3)
  int calls = 0;              // collectives issued per step (ZeRO-3 counts one per unit and pass)
  GroupPlacement shard_group;    // where the reduce-scatters and all-gathers run (s ranks)
  GroupPlacement replica_group;  // HSDP's all-reduce across the r = dp / s groups (1 rank without)
  double total() const { return all_reduce + reduce_scatter + all_gather; }
};

// The context-parallel K/V exchange of one layer for one micro-batch on one rank (docs/PLANNER.md
// "Context parallelism"). p2p: cp - 1 ring steps forward, each sending the rank's K/V block
// (block_bytes = 2 kv_heads/tp head_dim seq/cp micro_batch e) while the attention of the block in
// hand runs (1/cp of the rank's attention); backward K/V and dK/dV travel (2 block_bytes a step).
// allgather: one all-gather of the whole K/V (cp blocks; each rank sends cp - 1) forward and one
// reduce-scatter of dK/dV backward, neither overlapped. Empty at cp 1.
struct CpExchange {
  double block_bytes = 0;   // one rank's K/V block
  double fwd_bytes = 0;     // sent by the rank, forward, per layer (p2p: (cp - 1) blocks)
  double bwd_bytes = 0;     // sent by the rank, backward, per layer
  double fwd_seconds = 0, bwd_seconds = 0;  // the exchange's own time per layer
  double fwd_exposed = 0, bwd_exposed = 0;  // past the attention it overlaps
  GroupPlacement ring;      // the CP group (the ring's neighbours cross nodes when it does)
};
// `attn_fwd`, `attn_bwd`: the rank's attention core seconds of the layer (forward, backward).
CpExchange cp_exchange(const ModelShape& m, const Layout& l, const CollectiveModel& net, double attn_fwd,
                       double attn_bwd);

// Per step on the critical pipeline rank: the exchange's time, the part left exposed, the bytes sent.
struct CpTraffic {
  double seconds = 0, exposed = 0, bytes = 0;
  CpExchange per_layer;
  double hidden_share() const { return seconds > 0 ? 1 - exposed / seconds : 0; }
};

struct Estimate {
  ModelShape model;
  Layout layout;
  std::string cluster;
  long micro_batches = 0;
  TimeBreakdown time;
  MemoryBreakdown memory;
  IterationFlops flops;
  double seconds_per_iteration = 0;
  double tflops_per_gpu = 0;  // executed FLOPs / (seconds * gpus), recompute included
  double mfu = 0;             // model FLOPs / (seconds * gpus * peak)
  double tokens_per_second = 0;
  std::string dp_algorithm;   // ring or tree, as chosen for the gradient reduction
  DpTraffic dp_traffic;       // data-parallel bytes per step (empty at dp 1)
  CpTraffic cp_traffic;       // context-parallel K/V exchange per step (empty at cp 1)
};

// Throws ConfigError (with layout_problem's reason) when the layout cannot run the model.
Estimate estimate(const ModelShape& m, const CollectiveModel& net, const Layout& l,
                  const LayoutRules& rules = {});

// One pipeline rank of a layout whose stages hold uneven layer counts (heterogeneous plans,
// hetero.h): the pieces estimate() adds up, priced on net's cluster.
struct StageCost {
  double seconds = 0;    // one micro-batch forward + backward: kernels, TP collectives, pipeline p2p
  double compute = 0;    // the kernels alone
  double optimizer = 0;  // the rank's optimizer step
  double params = 0;     // parameters per rank
  MemoryBreakdown memory;  // with the schedule's micro-batches in flight (1F1B: min(m, pp - stage))
};
// Every pipeline rank of `l` (vpp 1) when rank i holds layers[i] layers and runs `micro_batches`
// micro-batches per step. ConfigError when the layout cannot run (layout_problem's reasons, layer
// divisibility aside) or a stage has no layer.
std::vector<StageCost> stage_costs(const ModelShape& m, const CollectiveModel& net, const Layout& l,
                                   const std::vector<int>& layers, long micro_batches);
// The step's exposed synchronisation after the pipelines drain, as estimate() prices it (its
// TimeBreakdown::dp_comm): data-parallel reduction, tied-embedding all-reduce, gradient norm.
double sync_seconds(const ModelShape& m, const CollectiveModel& net, const Layout& l, const std::vector<int>& layers,
                    long micro_batches);

// Korthikanti et al. 2022 activation bytes of one layer for one micro-batch, stored for backward,
// per tensor-parallel rank (their Table 2 generalised to any ffn width, dtype and dropout), for the
// seq / cp tokens a context-parallel rank holds.
double layer_activation_bytes(const ModelShape& m, const Layout& l);

}  // namespace triax::plan
