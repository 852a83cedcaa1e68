// Heterogeneous clusters: node classes of different devices (docs/PLANNER.md "Heterogeneous
// clusters"), plans that give each class its own share of the work (uneven pipeline stages placed
// on classes, uneven data-parallel micro-batch shares), their cost from the homogeneous model's
// pieces (cost_model.h: stage_costs, sync_seconds), the search over them, and the train_gpt config
// file of a plan.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "triax/plan/cost_model.h"

namespace triax::plan {

// One class of identical nodes. `device.nodes` == nodes; ranks of the class carry
// TRIAX_DEVICE_CLASS=name.
struct NodeClass {
  std::string name;
  int nodes = 0;
  Cluster device;
  int devices() const { return device.total_devices(); }
};

struct HeteroCluster {
  std::string name;
  std::string description;
  std::vector<NodeClass> classes;
  // The link of groups that span classes: the slower class's cluster (by per-device NIC share) with
  // the file's [between_classes] network keys on top.
  Cluster between;
  int total_devices() const;
  // Index of the class `name`; ConfigError listing the classes otherwise.
  int class_index(std::string_view name) const;
};

// Reads a cluster file: with [[node_class]] tables a heterogeneous cluster, otherwise the
// homogeneous file as one class named "default" (TRIAX_DEVICE_CLASS unset). IoError /
// ConfigError naming the file, the class and the key.
HeteroCluster load_hetero_cluster(const std::filesystem::path& path);
// A preset name (one class "default") or a .toml path.
HeteroCluster resolve_hetero_cluster(std::string_view name_or_path);
// Whether `name_or_path` is a cluster file with [[node_class]] tables.
bool is_hetero_cluster_file(std::string_view name_or_path);

// A layout (tp, pp, dp, micro-batch size, recompute, ZeRO; vpp 1, 1F1B) with each class's share.
// Placement: stage_classes (every rank of stage s on that class, the replicas alike), or, when it is
// empty, replica_classes (every rank of replica d on that class).
struct HeteroPlan {
  Layout layout;
  std::vector<int> stage_layers;           // pp entries, sum = the model's layers
  std::vector<int> stage_classes;          // pp class indices, or empty
  std::vector<int> replica_classes;        // dp class indices (used when stage_classes is empty)
  std::vector<long> replica_microbatches;  // dp entries, each >= 1
  int class_of(int replica, int stage) const {
    return stage_classes.empty() ? replica_classes[size_t(replica)] : stage_classes[size_t(stage)];
  }
  long microbatches() const;
  // Ranks of each class the plan uses (classes entries).
  std::vector<int> ranks_per_class(size_t classes) const;
};

// What a class does in a plan.
struct ClassUse {
  std::string name;
  int ranks = 0;
  double busy = 0;         // mean seconds of work per rank and step (micro-batches x stage + optimizer)
  double utilisation = 0;  // busy / step
  MemoryBreakdown memory;  // its rank that needs most
};

struct HeteroEstimate {
  HeteroPlan plan;
  double seconds = 0;                  // the step: slowest replica + sync + optimizer + core sharing
  std::vector<double> replica_seconds; // each replica's 1F1B pipeline time
  std::vector<std::vector<double>> stage_seconds;  // [replica][stage] one micro-batch forward + backward
  double sync = 0, optimizer = 0, core_sharing = 0;
  std::vector<ClassUse> classes;       // every class of the cluster
  bool fits = true;
  double tokens_per_second = 0;
};

// The cluster a class's ranks are priced on: its device; a class without a network
// (nics_per_node 0, CPU machines) in a cluster of several classes shares one machine with the
// others: one node of all the cluster's devices, whose shared-memory link joins them.
Cluster pricing_cluster(const HeteroCluster& hc, int cls);

// Prices a plan. ConfigError naming the problem when the plan does not match the model or the
// cluster (layer sum, entry counts, class capacity, layout rules).
HeteroEstimate estimate_hetero(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& plan);

struct HeteroSearchSpace {
  std::vector<int> tp, pp, dp, micro_batch;  // empty: every valid value
  std::vector<Recompute> recompute;          // empty: none, selective, full
  std::vector<int> zero;                     // empty: 0..3 (dp > 1), 0 (dp 1)
  Layout base;                               // precision and software options
  // Pins (empty: searched): the layers per stage, the micro-batches per replica, the stage classes.
  std::vector<int> pipeline_layers;
  std::vector<long> dp_microbatches;
  std::vector<int> stage_classes;
  bool even = false;  // price only the even split of each layout (layers even, shares even)
  int top_k = 5;
};

// A chosen plan and the even split of the same layout and placement.
struct HeteroChoice {
  HeteroEstimate plan;
  HeteroEstimate even;
  double speedup() const { return even.seconds / plan.seconds; }
};

struct HeteroSearchResult {
  std::vector<HeteroChoice> best;  // fitting, fastest first, at most top_k
  long priced = 0, no_fit = 0, invalid = 0;
  long over_capacity = 0;  // placements needing more ranks of a class than it has
};

HeteroSearchResult search_hetero(const ModelShape& m, const HeteroCluster& hc, const HeteroSearchSpace& space);

// Balanced splits (the search's own, exposed for tests): `layers` over stages whose time with n
// layers is a[s] + b[s] n, each at most cap[s] layers (memory), minimising the slowest stage; and
// `total` micro-batches over replicas whose pipeline takes sum[d] + (n - 1) max[d], minimising the
// slowest replica. Empty when no split exists.
std::vector<int> balance_layers(int layers, const std::vector<double>& a, const std::vector<double>& b,
                                const std::vector<int>& cap);
std::vector<long> balance_microbatches(long total, const std::vector<double>& sum, const std::vector<double>& max);

// "tp1 pp2 dp1 mbs4 layers 5,3 stages fast,slow" style summary.
std::string describe(const HeteroPlan& p, const HeteroCluster& hc);
// The search's table: each plan with step time, per-class utilisation and memory, and the even
// split with its time and the speed-up; JSON of the same.
std::string format_hetero(const HeteroSearchResult& r, const HeteroCluster& hc);
std::string hetero_json(const HeteroSearchResult& r, const HeteroCluster& hc);
// The mpirun MPMD line that launches the plan (world ranks in the order tp-dp-pp, each run of
// consecutive ranks of one class an app context with its TRIAX_DEVICE_CLASS).
std::string mpmd_launch_line(const HeteroPlan& p, const HeteroCluster& hc, std::string_view config_file);
// A train_gpt --config file for the plan (docs/TRAINING.md keys; docs/PLANNER.md).
std::string train_config_toml(const ModelShape& m, const HeteroChoice& c, const HeteroCluster& hc,
                              std::string_view config_file, std::string_view runtime_preset = {});

}  // namespace triax::plan
