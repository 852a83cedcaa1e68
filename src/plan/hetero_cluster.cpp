// Heterogeneous cluster files: [[node_class]] tables, each a preset or a homogeneous file (its
// `base`) with a node count and section overrides, and an optional [between_classes] network.
#include <fmt/format.h>

#include <set>

#include "cluster_toml.h"
#include "triax/core/error.h"
#include "triax/plan/hetero.h"

namespace triax::plan {

int HeteroCluster::total_devices() const {
  int n = 0;
  for (const auto& c : classes) n += c.devices();
  return n;
}

int HeteroCluster::class_index(std::string_view want) const {
  std::string names;
  for (size_t i = 0; i < classes.size(); ++i) {
    if (classes[i].name == want) return int(i);
    names += (names.empty() ? "" : ", ") + classes[i].name;
  }
  TRIAX_THROW(ConfigError, "cluster '{}' has no device class '{}'; its classes: {}", name, want, names);
}

namespace {

bool is_path(std::string_view s) {
  return (s.size() > 5 && s.substr(s.size() - 5) == ".toml") || s.find('/') != std::string_view::npos;
}

// The slower network of the classes: the smaller per-device NIC share (a one-node class: its
// intra-node link), with [between_classes] keys on top.
Cluster slower_network(const std::vector<NodeClass>& classes) {
  const Cluster* slow = &classes[0].device;
  auto rate = [](const Cluster& c) { return c.nics_per_node > 0 ? c.nic_share_gbps() : c.intra_gbps; };
  int devices = 0;
  for (const auto& k : classes) {
    if (rate(k.device) <= rate(*slow)) slow = &k.device;
    devices += k.devices();
  }
  Cluster c = *slow;
  if (c.nics_per_node == 0) {  // no network: the classes share one machine (pricing_cluster)
    c.gpus_per_node = devices;
    c.nodes = 1;
  }
  return c;
}

HeteroCluster one_class(Cluster c) {
  HeteroCluster hc{c.name, c.description, {}, c};
  hc.classes.push_back({"default", c.nodes, std::move(c)});
  return hc;
}

}  // namespace

#ifdef TRIAX_HAVE_TOML
namespace {

const std::set<std::string> kSections = {"node", "compute", "memory", "intra_node", "network", "collectives", "fat_tree"};

// Copies `v` into table `t` under `key` (replacing what was there).
void assign(toml::table& t, std::string_view key, const toml::node& v) {
  v.visit([&](const auto& x) { t.insert_or_assign(key, x); });
}

// The base of a class as a parsed homogeneous file: a preset, or a .toml path relative to `dir`.
toml::table class_base(const std::string& where, const std::string& base, const std::filesystem::path& dir) {
  if (!is_path(base)) {
    const Cluster preset = [&] {
      try {
        return cluster_preset(base);
      } catch (const ConfigError& e) {
        TRIAX_THROW(ConfigError, "{}: base: {}", where, e.what());
      }
    }();
    return toml::parse(cluster_toml(preset));
  }
  const std::filesystem::path p = std::filesystem::path(base).is_absolute() ? std::filesystem::path(base) : dir / base;
  toml::table t = parse_cluster_file(p);
  if (t.contains("node_class")) TRIAX_THROW(ConfigError, "{}: base '{}' is itself heterogeneous", where, base);
  return t;
}

std::string required_string(const toml::table& t, const std::string& where, const char* key) {
  const toml::node* n = t.get(key);
  if (!n) TRIAX_THROW(ConfigError, "{}: missing key '{}'", where, key);
  auto v = n->value_exact<std::string>();
  if (!v || v->empty()) TRIAX_THROW(ConfigError, "{}: '{}' must be a non-empty string", where, key);
  return *v;
}

NodeClass read_class(const toml::table& t, const std::string& file, size_t index, const std::filesystem::path& dir) {
  std::string where = fmt::format("{}: [[node_class]] #{}", file, index + 1);
  NodeClass k;
  k.name = required_string(t, where, "name");
  for (char ch : k.name)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_' && ch != '-' && ch != '.')
      TRIAX_THROW(ConfigError, "{}: name '{}' may hold only letters, digits, '_', '-' and '.' (TRIAX_DEVICE_CLASS)",
                  where, k.name);
  where = fmt::format("{}: [[node_class]] '{}'", file, k.name);
  const toml::node* count = t.get("count");
  if (!count) TRIAX_THROW(ConfigError, "{}: missing key 'count'", where);
  const auto n = count->value_exact<int64_t>();
  if (!n || *n < 1) TRIAX_THROW(ConfigError, "{}: count must be an integer >= 1 (nodes)", where);
  k.nodes = int(*n);
  toml::table merged = class_base(where, required_string(t, where, "base"), dir);
  for (const auto& [key, value] : t) {
    const std::string name(key.str());
    if (name == "name" || name == "count" || name == "base") continue;
    if (!kSections.count(name))
      TRIAX_THROW(ConfigError, "{}: unknown key '{}' (a class has name, count, base and the sections {})", where, name,
                  "node, compute, memory, intra_node, network, collectives, fat_tree");
    const toml::table* over = value.as_table();
    if (!over) TRIAX_THROW(ConfigError, "{}: '{}' must be a table [node_class.{}]", where, name, name);
    if (!merged.contains(name)) merged.insert(name, toml::table{});
    for (const auto& [k2, v2] : *over) assign(*merged[name].as_table(), k2.str(), v2);
  }
  merged.insert_or_assign("name", k.name);
  if (!merged["node"].as_table()) TRIAX_THROW(ConfigError, "{}: its base has no [node] section", where);
  merged["node"].as_table()->insert_or_assign("count", int64_t(k.nodes));
  k.device = read_cluster_table(merged, where);
  return k;
}

// [between_classes]: network keys over the slower class's cluster.
Cluster read_between(const toml::table* t, const std::string& file, const std::vector<NodeClass>& classes) {
  Cluster c = slower_network(classes);
  c.name = "between-classes";
  if (!t) return c;
  toml::table doc = toml::parse(cluster_toml(c));
  for (const auto& [key, value] : *t) assign(*doc["network"].as_table(), key.str(), value);
  return read_cluster_table(doc, file + ": [between_classes] (network keys: nics_per_node, nic_gbps, efficiency, "
                                        "latency_us)");
}

}  // namespace

HeteroCluster load_hetero_cluster(const std::filesystem::path& path) {
  const std::string file = path.string();
  const toml::table root = parse_cluster_file(path);
  if (!root.contains("node_class")) return one_class(load_cluster_toml(path));
  HeteroCluster hc;
  for (const auto& [key, value] : root) {
    const std::string k(key.str());
    if (k != "name" && k != "description" && k != "node_class" && k != "between_classes")
      TRIAX_THROW(ConfigError, "{}: unknown key '{}' (a heterogeneous file has name, description, [[node_class]] and "
                               "[between_classes])", file, k);
  }
  hc.name = required_string(root, file, "name");
  if (auto d = root["description"].value<std::string>()) hc.description = *d;
  const toml::array* list = root["node_class"].as_array();
  if (!list || list->empty() || !list->is_array_of_tables())
    TRIAX_THROW(ConfigError, "{}: node_class must be one or more [[node_class]] tables", file);
  std::set<std::string> seen;
  for (size_t i = 0; i < list->size(); ++i) {
    NodeClass k = read_class(*list->get(i)->as_table(), file, i, path.parent_path());
    if (!seen.insert(k.name).second)
      TRIAX_THROW(ConfigError, "{}: [[node_class]] #{}: duplicate class name '{}'", file, i + 1, k.name);
    hc.classes.push_back(std::move(k));
  }
  const toml::node* between = root.get("between_classes");
  if (between && !between->as_table()) TRIAX_THROW(ConfigError, "{}: between_classes must be a table", file);
  hc.between = read_between(between ? between->as_table() : nullptr, file, hc.classes);
  return hc;
}

bool is_hetero_cluster_file(std::string_view name_or_path) {
  if (!is_path(name_or_path)) return false;
  return parse_cluster_file(std::string(name_or_path)).contains("node_class");
}
#else
HeteroCluster load_hetero_cluster(const std::filesystem::path& path) { return one_class(load_cluster_toml(path)); }
bool is_hetero_cluster_file(std::string_view) { return false; }
#endif

HeteroCluster resolve_hetero_cluster(std::string_view name_or_path) {
  if (is_path(name_or_path)) return load_hetero_cluster(std::string(name_or_path));
  return one_class(cluster_preset(name_or_path));
}

}  // namespace triax::plan
