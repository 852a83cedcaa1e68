// Heterogeneous clusters (docs/HETEROGENEOUS.md): the ranks' device classes against
// --dp-microbatches (uneven data-parallel shares, per replica or per class) and --stage-classes
// (which class each pipeline stage runs on). Pure functions of the configuration, the grid's
// arithmetic and every rank's class, so every rank resolves the same plan (and the same error).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "triax/config/train_config.h"
#include "triax/distributed/grid.h"

namespace triax {

// "6,2" or "fast=6,slow=2": the text --dp-microbatches reads back.
std::string format_dp_microbatches(const std::vector<DpShare>& shares);

// World ranks of DP replica d, in increasing order.
std::vector<int> replica_ranks(const GridLayout& layout, int d);

// Micro-batches of each DP replica from cfg.dp_microbatches; empty when it is not given. Per class:
// every rank of a replica must be of one class, every replica's class named, every class named held
// by a replica. ConfigError naming the replica, its ranks and their classes otherwise.
std::vector<int64_t> resolve_dp_shares(const TrainConfig& cfg, const GridLayout& layout,
                                       const std::vector<std::string>& rank_classes);

// Uneven shares against the collectives that run once per micro-batch on ranks of different
// replicas: ZeRO-2/3 reduce-scatter (and ZeRO-3 gathers) each unit per backward/forward pass over
// the data-parallel group, and expert parallelism's all-to-alls span ep consecutive replicas. Both
// need equal counts (ZeRO 2/3: every replica; ep: within each ep group); ConfigError naming them.
void check_shares_collectives(const TrainConfig& cfg, const std::vector<int64_t>& shares);

// --stage-classes: one class per pipeline stage, and every rank of stage s of class
// stage_classes[s]; ConfigError naming each rank that is not, with its class and host order hint.
void check_stage_classes(const TrainConfig& cfg, const GridLayout& layout, const std::vector<std::string>& rank_classes);

// "fast: ranks 0-1, slow: ranks 2-3" (for the start-up line); "" when every rank is "default".
std::string describe_device_classes(const std::vector<std::string>& rank_classes);

}  // namespace triax
