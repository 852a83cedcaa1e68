// Alpha-beta collective costs: group placement on nodes and the fat tree, ring / tree formulas,
// calibration files (JSON via nlohmann-json, TOML via toml++) and the least-squares sample fit.
#include "triax/plan/collective_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "triax/core/enum_names.h"
#include "triax/core/error.h"

#ifdef TRIAX_HAVE_TOML
#include <toml++/toml.h>
#endif

namespace triax {
// Names of the collective model's enums (the print/parse functions are core/enum_names.h's).
template <>
struct EnumNames<plan::LinkClass> {
  static constexpr std::string_view what = "link class";
  static constexpr std::array<EnumName<plan::LinkClass>, 2> table{
      {{"intra", plan::LinkClass::intra}, {"inter", plan::LinkClass::inter}}};
};
template <>
struct EnumNames<plan::CollectiveOp> {
  static constexpr std::string_view what = "collective";
  static constexpr std::array<EnumName<plan::CollectiveOp>, 4> table{{{"all_reduce", plan::CollectiveOp::all_reduce},
                                                                      {"all_gather", plan::CollectiveOp::all_gather},
                                                                      {"reduce_scatter", plan::CollectiveOp::reduce_scatter},
                                                                      {"p2p", plan::CollectiveOp::p2p}}};
};
template <>
struct EnumNames<plan::Algorithm> {
  static constexpr std::string_view what = "algorithm";
  static constexpr std::array<EnumName<plan::Algorithm>, 3> table{
      {{"ring", plan::Algorithm::ring}, {"tree", plan::Algorithm::tree}, {"direct", plan::Algorithm::direct}}};
};
}  // namespace triax

namespace triax::plan {

namespace {
int ceil_log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}
}  // namespace

std::string_view to_string(LinkClass l) { return enum_name(l); }
std::string_view to_string(CollectiveOp o) { return enum_name(o); }
std::string_view to_string(Algorithm a) { return enum_name(a); }
LinkClass parse_link_class(std::string_view s) { return parse_enum<LinkClass>(s); }
CollectiveOp parse_collective_op(std::string_view s) { return parse_enum<CollectiveOp>(s); }
Algorithm parse_algorithm(std::string_view s) { return parse_enum<Algorithm>(s); }

void Calibration::set(CollectiveOp op, LinkClass link, Algorithm algo, LinkCalibration c) {
  entries_[{op, link, algo}] = c;
}

std::optional<LinkCalibration> Calibration::find(CollectiveOp op, LinkClass link, Algorithm algo) const {
  auto it = entries_.find({op, link, algo});
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

GroupPlacement place_group(const Cluster& c, int ranks, int stride) {
  GroupPlacement g;
  g.ranks = std::max(1, ranks);
  const int G = c.gpus_per_node;
  if (stride >= G) {
    g.per_node = 1;
  } else {
    g.per_node = std::min(g.ranks, std::max(1, G / std::max(1, stride)));
  }
  g.nodes = (g.ranks + g.per_node - 1) / g.per_node;
  // Nodes between the first and last member (ranks are numbered node by node).
  const long last = long(g.ranks - 1) * stride;
  const long node_range = last / G + 1;
  if (node_range <= 1) g.level = 0;
  else if (node_range <= c.nodes_per_access) g.level = 1;
  else if (node_range <= long(c.nodes_per_access) * c.access_per_aggregation) g.level = 2;
  else g.level = 3;
  return g;
}

int algorithm_steps(CollectiveOp op, Algorithm algo, const GroupPlacement& g) {
  const int n = g.ranks;
  if (n <= 1) return 0;
  switch (op) {
    case CollectiveOp::all_reduce:
      if (algo == Algorithm::tree) return 2 * (ceil_log2(g.nodes) + g.per_node - 1);
      return 2 * (n - 1);
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
      return n - 1;
    case CollectiveOp::p2p:
      return 1;
  }
  return 0;
}

double bus_factor(CollectiveOp op, int ranks) {
  const double n = ranks;
  switch (op) {
    case CollectiveOp::all_reduce: return 2 * (n - 1) / n;
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: return (n - 1) / n;
    case CollectiveOp::p2p: return 1;
  }
  return 1;
}

CollectiveModel::CollectiveModel(Cluster c, Calibration cal) : cluster_(std::move(c)), cal_(std::move(cal)) {
  validate(cluster_);
}

LinkCalibration CollectiveModel::link(CollectiveOp op, Algorithm algo, const GroupPlacement& g) const {
  const Cluster& c = cluster_;
  LinkCalibration intra{c.intra_latency_us, c.intra_gbps * c.intra_efficiency, std::nullopt};
  if (auto k = cal_.find(op, LinkClass::intra, algo == Algorithm::tree ? Algorithm::ring : algo)) intra = *k;
  if (g.nodes <= 1) return intra;
  // Across nodes: each member of the group on a node drives its share of the node's NICs, so the
  // ring's bus bandwidth grows with the members per node until NVLink is the narrower link.
  LinkCalibration inter{c.inter_latency_us, c.nic_share_gbps() * c.nic_efficiency, std::nullopt};
  if (auto k = cal_.find(op, LinkClass::inter, algo)) inter = *k;
  double oversub = 1;
  if (g.level == 2) oversub = c.oversub_access;
  if (g.level >= 3) oversub = c.oversub_access * c.oversub_aggregation * c.oversub_core;
  LinkCalibration out = inter;
  out.bus_gbps = g.per_node * inter.bus_gbps / oversub;
  if (g.per_node > 1) out.bus_gbps = std::min(out.bus_gbps, intra.bus_gbps);
  return out;
}

double CollectiveModel::time(CollectiveOp op, Algorithm algo, const GroupPlacement& g, double bytes) const {
  if (g.ranks <= 1 || bytes <= 0) return 0;
  const LinkCalibration k = link(op, algo, g);
  const double launch = k.launch_us.value_or(cluster_.collective_launch_us);
  const double us = launch + algorithm_steps(op, algo, g) * k.alpha_us +
                    bus_factor(op, g.ranks) * bytes / (k.bus_gbps * 1e3);  // GB/s = 1e3 bytes/us
  return us * 1e-6;
}

CollectiveCost CollectiveModel::cost(CollectiveOp op, const GroupPlacement& g, double bytes) const {
  if (op == CollectiveOp::p2p) return {time(op, Algorithm::direct, g, bytes), Algorithm::direct};
  CollectiveCost best{time(op, Algorithm::ring, g, bytes), Algorithm::ring};
  // NCCL's double binary tree: only across nodes, only for all-reduce; wins on latency.
  if (op == CollectiveOp::all_reduce && g.nodes > 1) {
    const double t = time(op, Algorithm::tree, g, bytes);
    if (t < best.seconds) best = {t, Algorithm::tree};
  }
  return best;
}

LinkCalibration fit_samples(CollectiveOp op, Algorithm algo, const GroupPlacement& g,
                            const std::vector<Sample>& samples) {
  std::set<double> sizes;
  for (const auto& s : samples) {
    if (!(s.bytes > 0) || !(s.time_us > 0))
      TRIAX_THROW(ConfigError, "calibration sample ({} bytes, {} us) must have positive size and time",
                  s.bytes, s.time_us);
    sizes.insert(s.bytes);
  }
  if (sizes.size() < 2)
    TRIAX_THROW(ConfigError, "calibration fit of {} needs samples at 2 or more distinct sizes, got {}",
                to_string(op), sizes.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double n = samples.size();
  for (const auto& s : samples) {
    sx += s.bytes;
    sy += s.time_us;
    sxx += s.bytes * s.bytes;
    sxy += s.bytes * s.time_us;
  }
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);  // us per byte
  const double intercept = (sy - slope * sx) / n;
  if (!(slope > 0))
    TRIAX_THROW(ConfigError, "calibration fit of {}: time does not grow with size (slope {} us/byte)",
                to_string(op), slope);
  LinkCalibration k;
  const int steps = std::max(1, algorithm_steps(op, algo, g));
  k.alpha_us = std::max(0.0, intercept) / steps;
  k.bus_gbps = bus_factor(op, g.ranks) / slope / 1e3;
  if (g.nodes > 1) k.bus_gbps /= g.per_node;
  k.launch_us = 0;
  return k;
}

namespace {

// One calibration entry after parsing, before it becomes a LinkCalibration.
struct RawEntry {
  std::string op, link, algorithm = "ring";
  std::optional<double> alpha_us, bus_gbps, launch_us;
  std::optional<int> ranks, ranks_per_node;
  std::vector<Sample> samples;
  bool has_samples = false;
};

void add_entry(Calibration& cal, const RawEntry& e, const std::string& where) {
  CollectiveOp op;
  LinkClass link;
  Algorithm algo;
  try {
    op = parse_collective_op(e.op);
    link = parse_link_class(e.link);
    algo = parse_algorithm(e.algorithm);
  } catch (const ConfigError& x) {
    TRIAX_THROW(IoError, "{}: {}", where, x.what());
  }
  const bool direct = e.alpha_us.has_value() || e.bus_gbps.has_value();
  if (direct == e.has_samples)
    TRIAX_THROW(IoError, "{}: give either alpha_us and bus_gbps, or samples (not both, not neither)", where);
  LinkCalibration k;
  if (direct) {
    if (!e.alpha_us || !e.bus_gbps) TRIAX_THROW(IoError, "{}: alpha_us and bus_gbps go together", where);
    if (!(*e.alpha_us >= 0)) TRIAX_THROW(IoError, "{}: alpha_us must be >= 0, got {}", where, *e.alpha_us);
    if (!(*e.bus_gbps > 0)) TRIAX_THROW(IoError, "{}: bus_gbps must be > 0, got {}", where, *e.bus_gbps);
    k.alpha_us = *e.alpha_us;
    k.bus_gbps = *e.bus_gbps;
    if (link == LinkClass::inter && e.ranks_per_node) k.bus_gbps /= *e.ranks_per_node;
  } else {
    if (!e.ranks || *e.ranks < 2) TRIAX_THROW(IoError, "{}: samples need 'ranks' >= 2", where);
    GroupPlacement g;
    g.ranks = *e.ranks;
    g.per_node = e.ranks_per_node.value_or(link == LinkClass::intra ? *e.ranks : 1);
    if (g.per_node < 1 || g.ranks % g.per_node != 0)
      TRIAX_THROW(IoError, "{}: ranks_per_node {} must divide ranks {}", where, g.per_node, g.ranks);
    g.nodes = g.ranks / g.per_node;
    if ((link == LinkClass::intra) != (g.nodes == 1))
      TRIAX_THROW(IoError, "{}: link '{}' but ranks {} / ranks_per_node {} = {} nodes", where, e.link,
                  g.ranks, g.per_node, g.nodes);
    try {
      k = fit_samples(op, algo, g, e.samples);
    } catch (const ConfigError& x) {
      TRIAX_THROW(IoError, "{}: {}", where, x.what());
    }
  }
  if (e.launch_us) k.launch_us = *e.launch_us;
  cal.set(op, link, algo, k);
}

constexpr const char* kFormat = "triax-collective-calibration";
const std::set<std::string> kEntryKeys = {"op", "link", "algorithm", "alpha_us", "bus_gbps", "launch_us",
                                          "ranks", "ranks_per_node", "samples"};

Calibration load_json(const std::filesystem::path& path) {
  const std::string file = path.string();
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TRIAX_THROW(IoError, "{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_object() || j.value("format", "") != kFormat)
    TRIAX_THROW(IoError, "{}: expected an object with \"format\": \"{}\"", file, kFormat);
  if (j.value("version", 0) != 1) TRIAX_THROW(IoError, "{}: unsupported version (expected 1)", file);
  for (const auto& [k, v] : j.items())
    if (k != "format" && k != "version" && k != "entries" && k != "source")
      TRIAX_THROW(IoError, "{}: unknown key '{}'", file, k);
  if (!j.contains("entries") || !j["entries"].is_array())
    TRIAX_THROW(IoError, "{}: \"entries\" must be an array", file);
  Calibration cal;
  int i = 0;
  for (const auto& e : j["entries"]) {
    const std::string where = fmt::format("{}: entries[{}]", file, i++);
    if (!e.is_object()) TRIAX_THROW(IoError, "{}: must be an object", where);
    RawEntry r;
    try {
      for (const auto& [k, v] : e.items())
        if (!kEntryKeys.count(k)) TRIAX_THROW(IoError, "{}: unknown key '{}'", where, k);
      if (!e.contains("op") || !e.contains("link")) TRIAX_THROW(IoError, "{}: needs \"op\" and \"link\"", where);
      r.op = e.at("op").get<std::string>();
      r.link = e.at("link").get<std::string>();
      if (e.contains("algorithm")) r.algorithm = e.at("algorithm").get<std::string>();
      if (e.contains("alpha_us")) r.alpha_us = e.at("alpha_us").get<double>();
      if (e.contains("bus_gbps")) r.bus_gbps = e.at("bus_gbps").get<double>();
      if (e.contains("launch_us")) r.launch_us = e.at("launch_us").get<double>();
      if (e.contains("ranks")) r.ranks = e.at("ranks").get<int>();
      if (e.contains("ranks_per_node")) r.ranks_per_node = e.at("ranks_per_node").get<int>();
      if (e.contains("samples")) {
        r.has_samples = true;
        for (const auto& s : e.at("samples")) {
          if (!s.is_array() || s.size() != 2) TRIAX_THROW(IoError, "{}: each sample is [bytes, time_us]", where);
          r.samples.push_back({s[0].get<double>(), s[1].get<double>()});
        }
      }
    } catch (const nlohmann::json::exception& x) {
      TRIAX_THROW(IoError, "{}: wrong type: {}", where, x.what());
    }
    add_entry(cal, r, where);
  }
  return cal;
}

#ifdef TRIAX_HAVE_TOML
Calibration load_toml(const std::filesystem::path& path) {
  const std::string file = path.string();
  toml::table root;
  try {
    root = toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    TRIAX_THROW(IoError, "{}:{}:{}: {}", file, e.source().begin.line, e.source().begin.column, e.description());
  }
  if (root["format"].value_or(std::string()) != kFormat)
    TRIAX_THROW(IoError, "{}: expected format = \"{}\"", file, kFormat);
  if (root["version"].value_or(int64_t(0)) != 1) TRIAX_THROW(IoError, "{}: unsupported version (expected 1)", file);
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "format" && key != "version" && key != "entries" && key != "source")
      TRIAX_THROW(IoError, "{}: unknown key '{}'", file, key);
  }
  const toml::array* entries = root["entries"].as_array();
  if (!entries) TRIAX_THROW(IoError, "{}: needs [[entries]]", file);
  Calibration cal;
  int i = 0;
  for (const auto& node : *entries) {
    const std::string where = fmt::format("{}: entries[{}]", file, i++);
    const toml::table* t = node.as_table();
    if (!t) TRIAX_THROW(IoError, "{}: must be a table", where);
    for (const auto& [k, v] : *t)
      if (!kEntryKeys.count(std::string(k.str()))) TRIAX_THROW(IoError, "{}: unknown key '{}'", where, k.str());
    auto str = [&](const char* key) -> std::optional<std::string> {
      const toml::node* n = t->get(key);
      if (!n) return std::nullopt;
      auto v = n->value_exact<std::string>();
      if (!v) TRIAX_THROW(IoError, "{}: {} must be a string", where, key);
      return v;
    };
    auto num = [&](const char* key) -> std::optional<double> {
      const toml::node* n = t->get(key);
      if (!n) return std::nullopt;
      if (auto v = n->value_exact<double>()) return *v;
      if (auto v = n->value_exact<int64_t>()) return double(*v);
      TRIAX_THROW(IoError, "{}: {} must be a number", where, key);
    };
    auto integer = [&](const char* key) -> std::optional<int> {
      const toml::node* n = t->get(key);
      if (!n) return std::nullopt;
      auto v = n->value_exact<int64_t>();
      if (!v) TRIAX_THROW(IoError, "{}: {} must be an integer", where, key);
      return int(*v);
    };
    RawEntry r;
    auto op = str("op");
    auto link = str("link");
    if (!op || !link) TRIAX_THROW(IoError, "{}: needs op and link", where);
    r.op = *op;
    r.link = *link;
    if (auto a = str("algorithm")) r.algorithm = *a;
    r.alpha_us = num("alpha_us");
    r.bus_gbps = num("bus_gbps");
    r.launch_us = num("launch_us");
    r.ranks = integer("ranks");
    r.ranks_per_node = integer("ranks_per_node");
    if (const toml::node* sn = t->get("samples")) {
      const toml::array* arr = sn->as_array();
      if (!arr) TRIAX_THROW(IoError, "{}: samples must be an array of [bytes, time_us]", where);
      r.has_samples = true;
      for (const auto& s : *arr) {
        const toml::array* pair = s.as_array();
        if (!pair || pair->size() != 2) TRIAX_THROW(IoError, "{}: each sample is [bytes, time_us]", where);
        double v[2];
        for (size_t q = 0; q < 2; ++q) {
          const toml::node& x = *pair->get(q);
          if (auto d = x.value_exact<double>()) v[q] = *d;
          else if (auto k = x.value_exact<int64_t>()) v[q] = double(*k);
          else TRIAX_THROW(IoError, "{}: sample values must be numbers", where);
        }
        r.samples.push_back({v[0], v[1]});
      }
    }
    add_entry(cal, r, where);
  }
  return cal;
}
#endif

}  // namespace

Calibration load_calibration(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) TRIAX_THROW(IoError, "{}: calibration file does not exist", path.string());
  const std::string ext = path.extension().string();
  if (ext == ".json") return load_json(path);
  if (ext == ".toml") {
#ifdef TRIAX_HAVE_TOML
    return load_toml(path);
#else
    TRIAX_THROW(IoError, "{}: this triax was built without toml++; use the JSON form", path.string());
#endif
  }
  TRIAX_THROW(IoError, "{}: calibration files end in .json or .toml", path.string());
}

}  // namespace triax::plan
