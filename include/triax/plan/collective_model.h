// Alpha-beta cost of the collectives a 3D-parallel step issues, per link class: ring and tree
// all-reduce, ring all-gather / reduce-scatter, point-to-point. Defaults come from the cluster's
// physical numbers; a calibration file (JSON or TOML, docs/PLANNER.md) measured by comm_bench
// replaces them per (collective, link class, algorithm).
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "triax/plan/cluster.h"

namespace triax::plan {

enum class LinkClass { intra, inter };  // inside a node / across nodes (NIC + fat tree)
enum class CollectiveOp { all_reduce, all_gather, reduce_scatter, p2p };
enum class Algorithm { ring, tree, direct };

std::string_view to_string(LinkClass l);
std::string_view to_string(CollectiveOp o);
std::string_view to_string(Algorithm a);
LinkClass parse_link_class(std::string_view s);
CollectiveOp parse_collective_op(std::string_view s);
Algorithm parse_algorithm(std::string_view s);

// One measured line: T(S) = launch + steps * alpha + factor * S / bus_bandwidth.
// For inter-node entries bus_gbps is per rank of a node (measured bus bandwidth divided by the
// ranks per node of the measurement), so it scales with the group's ranks per node.
struct LinkCalibration {
  double alpha_us = 0;  // per algorithm step
  double bus_gbps = 0;  // nccl-tests "busbw", GB/s
  std::optional<double> launch_us;  // replaces the cluster's collective_launch_us when set
};

class Calibration {
 public:
  void set(CollectiveOp op, LinkClass link, Algorithm algo, LinkCalibration c);
  std::optional<LinkCalibration> find(CollectiveOp op, LinkClass link, Algorithm algo) const;
  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

 private:
  std::map<std::tuple<CollectiveOp, LinkClass, Algorithm>, LinkCalibration> entries_;
};

// Reads a calibration file: .json or .toml (format in docs/PLANNER.md). Entries give alpha_us and
// bus_gbps directly, or raw samples (bytes, time_us) that are fitted here. Throws IoError naming
// the file and entry on anything malformed.
Calibration load_calibration(const std::filesystem::path& path);

// A (size, time) measurement of one collective.
struct Sample {
  double bytes = 0;
  double time_us = 0;
};
struct GroupPlacement;
// Least-squares fit of T = a + factor*S/busbw to samples measured on the group `g`; the intercept
// becomes alpha per step (launch_us = 0). For a group across nodes the bus bandwidth is divided
// by the ranks per node. ConfigError on fewer than 2 distinct sizes or a non-positive slope.
LinkCalibration fit_samples(CollectiveOp op, Algorithm algo, const GroupPlacement& g,
                            const std::vector<Sample>& samples);

// Where a communication group sits: how many ranks, how many per node, and the highest fat-tree
// level it crosses (0: one node, 1: one access switch, 2: one aggregation block, 3: the core).
struct GroupPlacement {
  int ranks = 1;
  int per_node = 1;
  int nodes = 1;
  int level = 0;
};
// The placement of `ranks` ranks whose world ranks start at 0 and step by `stride` (ranks are
// numbered node by node).
GroupPlacement place_group(const Cluster& c, int ranks, int stride);

// Steps of an algorithm and the bytes factor nccl-tests uses to turn algbw into busbw.
int algorithm_steps(CollectiveOp op, Algorithm algo, const GroupPlacement& g);
double bus_factor(CollectiveOp op, int ranks);

struct CollectiveCost {
  double seconds = 0;
  Algorithm algorithm = Algorithm::ring;
};

class CollectiveModel {
 public:
  explicit CollectiveModel(Cluster c, Calibration cal = {});
  // Time of one collective over `bytes` (all-reduce: the buffer; all-gather: the gathered output;
  // reduce-scatter: the input; p2p: the message). The fastest allowed algorithm is chosen.
  CollectiveCost cost(CollectiveOp op, const GroupPlacement& g, double bytes) const;
  double seconds(CollectiveOp op, const GroupPlacement& g, double bytes) const {
    return cost(op, g, bytes).seconds;
  }
  // The alpha / bus bandwidth used for (op, algo) on a group's widest link class.
  LinkCalibration link(CollectiveOp op, Algorithm algo, const GroupPlacement& g) const;
  const Cluster& cluster() const { return cluster_; }

 private:
  double time(CollectiveOp op, Algorithm algo, const GroupPlacement& g, double bytes) const;
  Cluster cluster_;
  Calibration cal_;
};

}  // namespace triax::plan
