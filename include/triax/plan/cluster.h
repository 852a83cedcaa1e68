// A cluster as the cost model sees it: nodes of accelerators with a peak rate and the GEMM
// efficiency they reach, memory capacity and bandwidth, an intra-node link (NVLink or shared
// memory), NICs and a three-level fat tree. Built-in presets or a TOML file (docs/PLANNER.md).
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace triax::plan {

struct Cluster {
  std::string name;
  std::string description;
  int gpus_per_node = 0;  // accelerators (or CPU ranks) per node
  // CPU clusters: physical cores the node's ranks share (0: every device is its own). With more
  // ranks on a node than cores, the ranks time-slice (cost_model.h, TimeBreakdown::core_sharing).
  int cores_per_node = 0;
  int nodes = 0;

  // Compute. Rates in TFLOP/s per device, dense.
  double peak_tflops_bf16 = 0;  // also used for fp16
  double peak_tflops_fp32 = 0;
  double gemm_efficiency = 0;   // fraction of peak that large GEMMs reach
  double kernel_overhead_us = 0;  // idle gap per kernel launch on the device
  // GEMM structure (gemm_model.h); sm_count 0 means a flat rate (CPUs).
  int sm_count = 0;             // streaming multiprocessors: tiles computed at once
  int gemm_tile_m = 0;          // output tile of one SM (rows x columns; both orientations tried)
  int gemm_tile_n = 0;
  double gemm_k_overhead = 0;   // per-tile prologue/epilogue, in elements of K
  // Fused attention's sustained fraction of peak on its counted FLOPs (4 b s^2 h / t forward,
  // 2.5x that backward), measured on the attention kernel itself; 0: the GEMM model prices it on
  // its score tiles (GPU clusters).
  double attention_efficiency = 0;

  // Device memory.
  double memory_gib = 0;          // capacity per device
  double memory_gbps = 0;         // bandwidth per device, GB/s (1e9 bytes/s)
  double memory_efficiency = 0;   // fraction of memory_gbps streaming kernels reach
  double reserved_gib = 0;        // context, library workspaces, allocator slack
  // Rate of plain copies, bias fills and bias-gradient column sums (Layout::runtime_copies), GB/s
  // in the same byte accounting; 0: memory_gbps x memory_efficiency.
  double copy_gbps = 0;

  // Inside a node (NVLink/NVSwitch, or shared memory for CPU ranks).
  double intra_gbps = 0;          // per device, per direction, GB/s
  double intra_efficiency = 0;    // achieved collective bus bandwidth / intra_gbps
  double intra_latency_us = 0;    // per algorithm step

  // Across nodes.
  int nics_per_node = 0;
  double nic_gbps = 0;            // per NIC, per direction, GB/s
  double nic_efficiency = 0;      // achieved bus bandwidth / NIC bandwidth
  double inter_latency_us = 0;    // per algorithm step
  double collective_launch_us = 0;  // fixed cost of starting one collective
  double collective_buffer_mib = 0; // library buffers per communicator (NCCL channels)
  // Fraction of the SMs an overlapped data-parallel collective holds while it runs: NCCL's thread
  // blocks do not share an SM with compute kernels, so the kernels beside it (the last backward,
  // the first forward) lose that share of their rate for the collective's duration; 0: none.
  double comm_sm_fraction = 0;

  // Three-level fat tree: nodes under one access switch, access switches under one aggregation
  // block; above that the core. Oversubscription: downlink / uplink bandwidth at each level.
  int nodes_per_access = 1;
  int access_per_aggregation = 1;
  double oversub_access = 1;
  double oversub_aggregation = 1;
  double oversub_core = 1;

  int total_devices() const { return gpus_per_node * nodes; }
  // Per-device share of the node's NIC bandwidth (GB/s, before efficiency).
  double nic_share_gbps() const { return nics_per_node * nic_gbps / gpus_per_node; }
};

// Throws ConfigError naming the cluster, the field and the value when a field is out of range.
void validate(const Cluster& c);

const std::vector<Cluster>& cluster_presets();
// Throws ConfigError listing the known names.
Cluster cluster_preset(std::string_view name);
// Reads a cluster TOML file (format in docs/PLANNER.md). Throws IoError naming the file and the
// key on unreadable files, unknown keys, missing keys and wrong types; ConfigError on bad values.
Cluster load_cluster_toml(const std::filesystem::path& path);
// The homogeneous cluster file of `c` (every key written), which load_cluster_toml reads back.
std::string cluster_toml(const Cluster& c);
// A preset name, or a path to a .toml file.
Cluster resolve_cluster(std::string_view name_or_path);
// Whether this build can read TOML (toml++ was found).
bool toml_supported();

}  // namespace triax::plan
