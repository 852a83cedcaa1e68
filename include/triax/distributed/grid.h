// The process grid: tp x cp x pp x dp ranks (ep carved out of dp) over the world, with a
// configurable axis order. cp (context parallel) splits every sequence; its ranks hold the same
// weights, so the weights' data-parallel group is dp x cp (dp_cp_group). GridLayout is the pure arithmetic (coordinates, groups, neighbours) and needs no
// communication, so it is tested over every factorisation; ProcessGrid adds a communicator per group.
#pragma once
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"

namespace triax {

enum class Axis { tp = 0, pp = 1, dp = 2, cp = 3 };
constexpr std::array<Axis, 4> kAxes{Axis::tp, Axis::pp, Axis::dp, Axis::cp};
std::string_view axis_name(Axis a);

struct GridShape {
  int tp = 1;
  int pp = 1;
  int dp = 1;
  int ep = 1;  // expert parallel: divides dp; ep groups are consecutive dp coordinates
  // Axes from fastest-varying to slowest, joined by '-'. Megatron's default keeps TP inside a node.
  // An order naming only tp, pp and dp places cp right after tp (TP x CP inside a node).
  std::string order = "tp-dp-pp";
  int cp = 1;  // context parallel: each sequence split over cp ranks
};

struct GridCoord {
  int tp = 0, pp = 0, dp = 0, cp = 0;
  int operator[](Axis a) const { return a == Axis::tp ? tp : a == Axis::pp ? pp : a == Axis::dp ? dp : cp; }
  int& operator[](Axis a) { return a == Axis::tp ? tp : a == Axis::pp ? pp : a == Axis::dp ? dp : cp; }
  bool operator==(const GridCoord&) const = default;
};

class GridLayout {
 public:
  // Throws ConfigError showing the numbers when tp*cp*pp*dp != world_size, a size is < 1, ep does
  // not divide dp, or the order names unknown or repeated axes.
  GridLayout(int world_size, const GridShape& shape);

  int world_size() const { return world_size_; }
  int size(Axis a) const { return sizes_[static_cast<int>(a)]; }
  int ep() const { return ep_; }
  const GridShape& shape() const { return shape_; }
  // Axes fastest first, as parsed from the order string.
  const std::array<Axis, 4>& order() const { return order_; }

  GridCoord coord(int rank) const;
  int rank_of(const GridCoord& c) const;

  // World ranks of the group along axis a that contains rank, ordered by that axis' coordinate
  // (so the group rank equals coord(rank)[a]).
  std::vector<int> group(Axis a, int rank) const;
  // Every group along axis a: a partition of the world.
  std::vector<std::vector<int>> groups(Axis a) const;
  // Model-parallel group (same dp and cp coordinates): ordered by pp, then tp.
  std::vector<int> model_parallel_group(int rank) const;
  // First and last pipeline stage of rank's pipeline (one rank when pp == 1); the tied embedding
  // lives there. Ranks in the middle stages are in no embedding group (empty).
  std::vector<int> embedding_group(int rank) const;
  // Expert-parallel group (ep consecutive dp coordinates) and the expert-data-parallel group
  // (dp/ep ranks holding the same experts).
  std::vector<int> ep_group(int rank) const;
  std::vector<int> expert_dp_group(int rank) const;
  // The weights' data-parallel groups: dp x cp ranks (same tp and pp), ordered dp-major (group rank
  // = dp * cp_size + cp), and its expert twin (expert_dp x cp). Equal to dp / expert_dp at cp = 1.
  std::vector<int> dp_cp_group(int rank) const;
  std::vector<int> expert_dp_cp_group(int rank) const;

  bool is_first_stage(int rank) const { return coord(rank).pp == 0; }
  bool is_last_stage(int rank) const { return coord(rank).pp == size(Axis::pp) - 1; }
  // World rank of the previous / next pipeline stage in the same pipeline; -1 at the ends.
  int prev_stage(int rank) const;
  int next_stage(int rank) const;
  // Same, wrapping around (the interleaved schedule sends from the last stage to the first).
  int prev_stage_wrap(int rank) const;
  int next_stage_wrap(int rank) const;

  // "tp=2 pp=2 dp=2 order=tp-dp-pp"
  std::string describe() const;

 private:
  int world_size_;
  GridShape shape_;
  std::array<int, 4> sizes_{};
  std::array<Axis, 4> order_{};
  std::array<int, 4> stride_{};  // stride of each axis (indexed by Axis) in the rank number
  int ep_ = 1;
};

// Refuses a tensor-parallel group that spans hosts (its all-reduces would cross the network on
// every layer), naming the ranks and the hosts, unless allow is set. hosts[r] is rank r's host.
// With cp > 1 the tp x cp block (the ring's K/V exchanges every layer) must fit in a host too,
// where the hosts allow it (a host with at least tp x cp ranks).
void check_tp_placement(const GridLayout& layout, const std::vector<std::string>& hosts, bool allow);

// Every rank's host name, by world rank (a fixed-width all_gather of host_name(), truncated to 255
// bytes). Collective over world.
std::vector<std::string> gather_host_names(Communicator& world);
// The rank's position among the ranks on its own host (hosts[r] is rank r's host), and their number.
int local_rank_of(const std::vector<std::string>& hosts, int rank);
int local_size_of(const std::vector<std::string>& hosts, int rank);

// Device classes (heterogeneous clusters, docs/HETEROGENEOUS.md): each rank's class is the
// TRIAX_DEVICE_CLASS variable, else its host's `# class=NAME` comment in the hostfile named by
// TRIAX_HOSTFILE (mpirun's own hostfile: `node01 slots=8  # class=h100`), else "default"; a name
// of letters, digits, '_', '-' and '.', at most 64 bytes. device_class_problem says what is wrong
// with a name ("" when it is valid).
inline constexpr const char* kDefaultDeviceClass = "default";
std::string device_class_problem(std::string_view name);
std::string device_class_from_env();
// The class a hostfile gives `host` (its line's `# class=NAME`), nullopt when its line has none or
// there is no line; IoError when the file cannot be read, ConfigError for a bad name.
std::optional<std::string> device_class_in_hostfile(const std::string& path, const std::string& host);
// Every rank's class by world rank (a fixed-width all_gather). Collective over world.
std::vector<std::string> gather_device_classes(Communicator& world);

struct GridOptions {
  bool allow_tp_across_hosts = false;
  // Every world rank's device class; empty: gathered through world (gather_device_classes).
  std::vector<std::string> device_classes;
};

// The live grid: one communicator per group this rank belongs to, split from the world.
class ProcessGrid {
 public:
  // Collective over world. hosts: every rank's host name (all_gather of host_name()); empty means
  // discover them through world.
  ProcessGrid(std::shared_ptr<Communicator> world, const GridShape& shape, const GridOptions& opts = {},
              std::vector<std::string> hosts = {});

  const GridLayout& layout() const { return layout_; }
  int rank() const { return world_->rank(); }
  GridCoord coord() const { return layout_.coord(rank()); }
  const std::vector<std::string>& hosts() const { return hosts_; }
  // Every world rank's device class (TRIAX_DEVICE_CLASS), and this rank's.
  const std::vector<std::string>& device_classes() const { return classes_; }
  const std::string& device_class() const { return classes_.at(static_cast<size_t>(rank())); }
  // Rank on this host and ranks on this host, from the host names.
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  Communicator& world() { return *world_; }
  Communicator& tp() { return *tp_; }
  Communicator& pp() { return *pp_; }
  Communicator& dp() { return *dp_; }
  Communicator& mp() { return *mp_; }
  Communicator& ep() { return *ep_; }
  Communicator& expert_dp() { return *edp_; }
  Communicator& cp() { return *cp_; }
  // The weights' data-parallel groups (gradient reduction, ZeRO shards): dp x cp ranks.
  Communicator& dp_cp() { return cp_->size() > 1 ? *dpcp_ : *dp_; }
  Communicator& expert_dp_cp() { return cp_->size() > 1 ? *edpcp_ : *edp_; }
  // Null on middle pipeline stages, which hold no embedding.
  Communicator* embedding() { return emb_.get(); }

  bool is_first_stage() const { return layout_.is_first_stage(rank()); }
  bool is_last_stage() const { return layout_.is_last_stage(rank()); }
  // Neighbour stages as ranks of the pp communicator; -1 at the ends.
  int prev_stage() const;
  int next_stage() const;

 private:
  std::shared_ptr<Communicator> world_;
  GridLayout layout_;
  std::vector<std::string> hosts_;
  std::vector<std::string> classes_;
  int local_rank_ = 0, local_size_ = 1;
  std::unique_ptr<Communicator> tp_, pp_, dp_, mp_, ep_, edp_, emb_, cp_, dpcp_, edpcp_;
};

}  // namespace triax
