// GridLayout arithmetic and ProcessGrid's communicator splits.
#include "triax/distributed/grid.h"

#include "triax/core/env.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <optional>
#include <map>
#include <sstream>

namespace triax {

std::string_view axis_name(Axis a) {
  switch (a) {
    case Axis::tp: return "tp";
    case Axis::pp: return "pp";
    case Axis::dp: return "dp";
    case Axis::cp: return "cp";
  }
  return "?";
}

namespace {
std::array<Axis, 4> parse_order(const std::string& order) {
  std::vector<std::string> parts;
  std::stringstream ss(order);
  for (std::string p; std::getline(ss, p, '-');) parts.push_back(p);
  if (parts.size() == 3 && std::find(parts.begin(), parts.end(), "cp") == parts.end()) {
    // The three-axis orders of before context parallelism: cp goes right after tp.
    const auto tp = std::find(parts.begin(), parts.end(), "tp");
    parts.insert(tp == parts.end() ? parts.begin() : tp + 1, "cp");
  }
  if (parts.size() != 4)
    TRIAX_THROW(ConfigError, "grid order '{}' must name the axes tp, pp and dp (and optionally cp) once each, "
                "fastest first (e.g. 'tp-dp-pp' or 'tp-cp-dp-pp')", order);
  std::array<Axis, 4> out{};
  bool seen[4] = {false, false, false, false};
  for (size_t i = 0; i < 4; ++i) {
    Axis a;
    if (parts[i] == "tp") a = Axis::tp;
    else if (parts[i] == "pp") a = Axis::pp;
    else if (parts[i] == "dp") a = Axis::dp;
    else if (parts[i] == "cp") a = Axis::cp;
    else
      TRIAX_THROW(ConfigError, "grid order '{}': unknown axis '{}' (known: tp, cp, pp, dp)", order, parts[i]);
    if (seen[static_cast<int>(a)]) TRIAX_THROW(ConfigError, "grid order '{}': axis '{}' appears twice", order, parts[i]);
    seen[static_cast<int>(a)] = true;
    out[i] = a;
  }
  return out;
}
}  // namespace

GridLayout::GridLayout(int world_size, const GridShape& shape) : world_size_(world_size), shape_(shape) {
  if (world_size < 1) TRIAX_THROW(ConfigError, "world size must be at least 1, got {}", world_size);
  if (shape.tp < 1 || shape.pp < 1 || shape.dp < 1 || shape.ep < 1 || shape.cp < 1)
    TRIAX_THROW(ConfigError, "parallel sizes must be at least 1: tp={} cp={} pp={} dp={} ep={}", shape.tp, shape.cp,
                shape.pp, shape.dp, shape.ep);
  const long long product = static_cast<long long>(shape.tp) * shape.cp * shape.pp * shape.dp;
  if (product != world_size) {
    if (shape.cp > 1)
      TRIAX_THROW(ConfigError, "tp x cp x pp x dp = {} x {} x {} x {} = {} but the world has {} ranks", shape.tp,
                  shape.cp, shape.pp, shape.dp, product, world_size);
    TRIAX_THROW(ConfigError, "tp x pp x dp = {} x {} x {} = {} but the world has {} ranks", shape.tp, shape.pp,
                shape.dp, product, world_size);
  }
  if (shape.dp % shape.ep != 0)
    TRIAX_THROW(ConfigError, "expert parallel size ep={} must divide dp={} (experts are carved out of data parallel)",
                shape.ep, shape.dp);
  order_ = parse_order(shape.order);
  sizes_ = {shape.tp, shape.pp, shape.dp, shape.cp};
  ep_ = shape.ep;
  int stride = 1;
  for (Axis a : order_) {
    stride_[static_cast<int>(a)] = stride;
    stride *= sizes_[static_cast<int>(a)];
  }
}

GridCoord GridLayout::coord(int rank) const {
  if (rank < 0 || rank >= world_size_)
    TRIAX_THROW(ConfigError, "rank {} is outside the world of {} ranks", rank, world_size_);
  GridCoord c;
  for (Axis a : kAxes) c[a] = (rank / stride_[static_cast<int>(a)]) % size(a);
  return c;
}

int GridLayout::rank_of(const GridCoord& c) const {
  int r = 0;
  for (Axis a : kAxes) {
    if (c[a] < 0 || c[a] >= size(a))
      TRIAX_THROW(ConfigError, "coordinate {}={} is outside [0, {})", axis_name(a), c[a], size(a));
    r += c[a] * stride_[static_cast<int>(a)];
  }
  return r;
}

std::vector<int> GridLayout::group(Axis a, int rank) const {
  GridCoord c = coord(rank);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(size(a)));
  for (int i = 0; i < size(a); ++i) {
    c[a] = i;
    out.push_back(rank_of(c));
  }
  return out;
}

std::vector<std::vector<int>> GridLayout::groups(Axis a) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < world_size_; ++r)
    if (coord(r)[a] == 0) out.push_back(group(a, r));
  return out;
}

std::vector<int> GridLayout::model_parallel_group(int rank) const {
  GridCoord c = coord(rank);
  std::vector<int> out;
  for (int p = 0; p < size(Axis::pp); ++p)
    for (int t = 0; t < size(Axis::tp); ++t) out.push_back(rank_of({t, p, c.dp, c.cp}));
  return out;
}

std::vector<int> GridLayout::embedding_group(int rank) const {
  const GridCoord c = coord(rank);
  const int last = size(Axis::pp) - 1;
  if (last == 0) return {rank};
  if (c.pp != 0 && c.pp != last) return {};
  return {rank_of({c.tp, 0, c.dp, c.cp}), rank_of({c.tp, last, c.dp, c.cp})};
}

std::vector<int> GridLayout::ep_group(int rank) const {
  const GridCoord c = coord(rank);
  const int base = (c.dp / ep_) * ep_;
  std::vector<int> out;
  for (int i = 0; i < ep_; ++i) out.push_back(rank_of({c.tp, c.pp, base + i, c.cp}));
  return out;
}

std::vector<int> GridLayout::expert_dp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> out;
  for (int j = 0; j < size(Axis::dp) / ep_; ++j) out.push_back(rank_of({c.tp, c.pp, j * ep_ + c.dp % ep_, c.cp}));
  return out;
}
std::vector<int> GridLayout::dp_cp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> out;
  for (int d = 0; d < size(Axis::dp); ++d)
    for (int k = 0; k < size(Axis::cp); ++k) out.push_back(rank_of({c.tp, c.pp, d, k}));
  return out;
}
std::vector<int> GridLayout::expert_dp_cp_group(int rank) const {
  const GridCoord c = coord(rank);
  std::vector<int> out;
  for (int j = 0; j < size(Axis::dp) / ep_; ++j)
    for (int k = 0; k < size(Axis::cp); ++k) out.push_back(rank_of({c.tp, c.pp, j * ep_ + c.dp % ep_, k}));
  return out;
}

int GridLayout::prev_stage(int rank) const {
  GridCoord c = coord(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return rank_of(c);
}
int GridLayout::next_stage(int rank) const {
  GridCoord c = coord(rank);
  if (c.pp == size(Axis::pp) - 1) return -1;
  ++c.pp;
  return rank_of(c);
}
int GridLayout::prev_stage_wrap(int rank) const {
  GridCoord c = coord(rank);
  c.pp = (c.pp + size(Axis::pp) - 1) % size(Axis::pp);
  return rank_of(c);
}
int GridLayout::next_stage_wrap(int rank) const {
  GridCoord c = coord(rank);
  c.pp = (c.pp + 1) % size(Axis::pp);
  return rank_of(c);
}

std::string GridLayout::describe() const {
  std::string s = fmt::format("tp={} pp={} dp={}", size(Axis::tp), size(Axis::pp), size(Axis::dp));
  if (size(Axis::cp) > 1) s += fmt::format(" cp={}", size(Axis::cp));
  if (ep_ > 1) s += fmt::format(" ep={}", ep_);
  return s + fmt::format(" order={}", shape_.order);
}

namespace {
// The tp x cp block of rank 0's coordinates (same pp and dp) for every block: refused when it
// spans hosts although every host holds at least tp x cp ranks.
void check_tp_cp_placement(const GridLayout& layout, const std::vector<std::string>& hosts, bool allow) {
  const int tp = layout.size(Axis::tp), cp = layout.size(Axis::cp);
  if (cp <= 1 || allow) return;
  std::map<std::string, int> per_host;
  for (const auto& h : hosts) ++per_host[h];
  for (const auto& [h, n] : per_host)
    if (n < tp * cp) return;  // some host cannot hold a whole block: spanning is unavoidable
  for (const auto& g : layout.groups(Axis::cp)) {
    std::vector<int> block;
    for (int r : g) {
      const auto t = layout.group(Axis::tp, r);
      block.insert(block.end(), t.begin(), t.end());
    }
    std::map<std::string, std::vector<int>> by_host;
    for (int r : block) by_host[hosts[static_cast<size_t>(r)]].push_back(r);
    if (by_host.size() <= 1) continue;
    TRIAX_THROW(ConfigError,
                "the tp x cp block of world ranks [{}] (tp={} cp={}) spans {} hosts although each host has at least "
                "{} ranks: the context-parallel ring would cross the network in every layer. Use an axis order with "
                "tp and cp fastest (e.g. 'tp-cp-dp-pp'), or allow it explicitly (--allow-tp-across-hosts)",
                fmt::join(block, ","), tp, cp, by_host.size(), tp * cp);
  }
}
}  // namespace

void check_tp_placement(const GridLayout& layout, const std::vector<std::string>& hosts, bool allow) {
  if (static_cast<int>(hosts.size()) != layout.world_size())
    TRIAX_THROW(ConfigError, "{} host names for a world of {} ranks", hosts.size(), layout.world_size());
  check_tp_cp_placement(layout, hosts, allow);
  for (const auto& g : layout.groups(Axis::tp)) {
    std::map<std::string, std::vector<int>> by_host;
    for (int r : g) by_host[hosts[static_cast<size_t>(r)]].push_back(r);
    if (by_host.size() <= 1 || allow) continue;
    std::vector<std::string> parts;
    for (const auto& [h, rs] : by_host) parts.push_back(fmt::format("{} has ranks [{}]", h, fmt::join(rs, ",")));
    TRIAX_THROW(ConfigError,
                "tensor-parallel group of world ranks [{}] spans {} hosts ({}): its all-reduces in every layer would "
                "cross the network. Use a tp that fits in one host, an axis order with tp fastest, or allow it "
                "explicitly (--allow-tp-across-hosts)",
                fmt::join(g, ","), by_host.size(), fmt::join(parts, "; "));
  }
}

// ---- ProcessGrid ----
namespace {
// Color of rank's group: its lowest world rank (unique per group, since groups partition the world).
int color_of(const std::vector<int>& g) { return g.empty() ? -1 : *std::min_element(g.begin(), g.end()); }
int index_in(const std::vector<int>& g, int rank) {
  return static_cast<int>(std::find(g.begin(), g.end(), rank) - g.begin());
}
std::unique_ptr<Communicator> split_by(Communicator& world, const std::vector<int>& g, const std::string& name) {
  const int r = world.rank();
  auto c = world.split(color_of(g), g.empty() ? 0 : index_in(g, r), name);
  if (!g.empty() && (!c || c->rank() != index_in(g, r) || c->size() != static_cast<int>(g.size())))
    TRIAX_THROW(CommError, "split of group '{}' at world rank {} gave the wrong membership", name, r);
  return c;
}
}  // namespace

namespace {
// Every rank's `mine` by world rank: a fixed-width all_gather, each string cut to kW - 1 bytes.
std::vector<std::string> gather_strings(Communicator& world, const std::string& mine) {
  constexpr size_t kW = 256;
  std::vector<char> in(kW, '\0'), out(kW * static_cast<size_t>(world.size()), '\0');
  std::memcpy(in.data(), mine.data(), std::min(mine.size(), kW - 1));
  world.all_gather(std::span<const char>(in), std::span<char>(out)).wait();
  std::vector<std::string> all;
  for (int r = 0; r < world.size(); ++r) all.emplace_back(out.data() + static_cast<size_t>(r) * kW);
  return all;
}
}  // namespace

std::vector<std::string> gather_host_names(Communicator& world) { return gather_strings(world, host_name()); }

std::string device_class_problem(std::string_view name) {
  if (name.empty()) return "an empty name";
  if (name.size() > 64) return fmt::format("{} bytes (at most 64)", name.size());
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return fmt::format("the character '{}' (letters, digits, '_', '-' and '.' only)", c);
  return {};
}

std::optional<std::string> device_class_in_hostfile(const std::string& path, const std::string& host) {
  std::ifstream in(path);
  if (!in) TRIAX_THROW(IoError, "TRIAX_HOSTFILE {}: cannot read the file", path);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t hash = line.find('#');
    std::istringstream words(line.substr(0, hash));
    std::string first;
    if (!(words >> first) || first != host || hash == std::string::npos) continue;
    std::istringstream comment(line.substr(hash + 1));
    for (std::string w; comment >> w;) {
      if (w.rfind("class=", 0) != 0) continue;
      const std::string name = w.substr(6);
      if (const std::string why = device_class_problem(name); !why.empty())
        TRIAX_THROW(ConfigError, "TRIAX_HOSTFILE {} line {}: class '{}' of host {}: {}", path, n, name, host, why);
      return name;
    }
  }
  return std::nullopt;
}

std::string device_class_from_env() {
  if (const auto cls = env_string_opt("TRIAX_DEVICE_CLASS")) {
    if (const std::string why = device_class_problem(*cls); !why.empty())
      TRIAX_THROW(ConfigError, "TRIAX_DEVICE_CLASS='{}': {}; expected a device class name such as h100 or slow", *cls,
                  why);
    return *cls;
  }
  if (const auto file = env_string_opt("TRIAX_HOSTFILE", "a hostfile path"))
    if (const auto cls = device_class_in_hostfile(*file, host_name())) return *cls;
  return kDefaultDeviceClass;
}

std::vector<std::string> gather_device_classes(Communicator& world) {
  return gather_strings(world, device_class_from_env());
}

int local_rank_of(const std::vector<std::string>& hosts, int rank) {
  const auto& mine = hosts.at(static_cast<size_t>(rank));
  return static_cast<int>(std::count(hosts.begin(), hosts.begin() + rank, mine));
}

int local_size_of(const std::vector<std::string>& hosts, int rank) {
  return static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts.at(static_cast<size_t>(rank))));
}

ProcessGrid::ProcessGrid(std::shared_ptr<Communicator> world, const GridShape& shape, const GridOptions& opts,
                         std::vector<std::string> hosts)
    : world_(std::move(world)), layout_(world_->size(), shape), hosts_(std::move(hosts)) {
  if (hosts_.empty()) hosts_ = gather_host_names(*world_);
  classes_ = opts.device_classes.empty() ? gather_device_classes(*world_) : opts.device_classes;
  if (static_cast<int>(classes_.size()) != world_->size())
    TRIAX_THROW(ConfigError, "{} device classes for a world of {} ranks", classes_.size(), world_->size());
  check_tp_placement(layout_, hosts_, opts.allow_tp_across_hosts);
  const int me = rank();
  local_rank_ = local_rank_of(hosts_, me);
  local_size_ = local_size_of(hosts_, me);

  Communicator& w = *world_;
  tp_ = split_by(w, layout_.group(Axis::tp, me), "tp");
  pp_ = split_by(w, layout_.group(Axis::pp, me), "pp");
  dp_ = split_by(w, layout_.group(Axis::dp, me), "dp");
  mp_ = split_by(w, layout_.model_parallel_group(me), "mp");
  ep_ = split_by(w, layout_.ep_group(me), "ep");
  edp_ = split_by(w, layout_.expert_dp_group(me), "expert_dp");
  emb_ = split_by(w, layout_.embedding_group(me), "embedding");
  cp_ = split_by(w, layout_.group(Axis::cp, me), "cp");
  if (layout_.size(Axis::cp) > 1) {
    dpcp_ = split_by(w, layout_.dp_cp_group(me), "dp_cp");
    edpcp_ = split_by(w, layout_.expert_dp_cp_group(me), "expert_dp_cp");
  }
}

int ProcessGrid::prev_stage() const { return coord().pp == 0 ? -1 : coord().pp - 1; }
int ProcessGrid::next_stage() const {
  return coord().pp == layout_.size(Axis::pp) - 1 ? -1 : coord().pp + 1;
}

}  // namespace triax
