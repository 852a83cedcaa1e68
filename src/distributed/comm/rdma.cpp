// RDMA discovery: sysfs parsing (works on a fixture tree), rdma-core's device list where it was
// found at build time, and the NCCL settings derived from both.
#include "triax/distributed/comm/rdma.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "triax/core/env.h"
#include "triax/core/error.h"

#if defined(TRIAX_HAVE_IBVERBS)
#include <infiniband/verbs.h>
#endif

namespace triax::probe {
namespace fs = std::filesystem;
namespace {

std::string read_line(const fs::path& p, bool required = true) {
  std::ifstream f(p);
  if (!f) {
    if (!required) return {};
    throw IoError(fmt::format("RDMA discovery: cannot read {}", p.string()));
  }
  std::string s;
  std::getline(f, s);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// "4: ACTIVE" -> "ACTIVE"
std::string after_colon(const fs::path& p, const std::string& s) {
  const auto c = s.find(':');
  if (c == std::string::npos)
    throw IoError(fmt::format("RDMA discovery: {} reads '{}', expected 'N: STATE'", p.string(), s));
  std::string v = s.substr(c + 1);
  v.erase(0, v.find_first_not_of(' '));
  return v;
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> v;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return v;
  for (const auto& e : fs::directory_iterator(dir, ec)) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

int parse_index(const fs::path& p) {
  const std::string n = p.filename().string();
  try {
    size_t used = 0;
    const int v = std::stoi(n, &used);
    if (used == n.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw IoError(fmt::format("RDMA discovery: {} is not a numbered entry", p.string()));
}

bool zero_gid(const std::string& g) { return g.find_first_not_of("0:") == std::string::npos; }

bool virtual_interface(const std::string& n) {
  for (const char* prefix : {"lo", "docker", "veth", "virbr", "br-", "cni", "flannel", "cali", "ifb", "tun", "tap"})
    if (n.rfind(prefix, 0) == 0) return true;
  return false;
}

}  // namespace

bool RdmaGid::ipv4_mapped() const { return gid.rfind("0000:0000:0000:0000:0000:ffff:", 0) == 0; }

int RdmaPort::roce_v2_gid_index() const {
  int any = -1;
  for (const auto& g : gids) {
    if (g.type != "RoCE v2") continue;
    if (g.ipv4_mapped()) return g.index;
    if (any < 0) any = g.index;
  }
  return any;
}

RdmaInfo read_rdma_sysfs(const std::string& root) {
  RdmaInfo info;
  for (const auto& dev : sorted_entries(fs::path(root) / "class" / "infiniband")) {
    RdmaDevice d;
    d.name = dev.filename().string();
    for (const auto& n : sorted_entries(dev / "device" / "net")) d.netdevs.push_back(n.filename().string());
    for (const auto& pp : sorted_entries(dev / "ports")) {
      RdmaPort p;
      p.port = parse_index(pp);
      p.state = after_colon(pp / "state", read_line(pp / "state"));
      p.link_layer = read_line(pp / "link_layer");
      if (p.link_layer != "InfiniBand" && p.link_layer != "Ethernet")
        throw IoError(fmt::format("RDMA discovery: {} reads '{}', expected InfiniBand or Ethernet",
                                  (pp / "link_layer").string(), p.link_layer));
      p.rate = read_line(pp / "rate", false);
      for (const auto& gp : sorted_entries(pp / "gids")) {
        RdmaGid g;
        g.index = parse_index(gp);
        g.gid = read_line(gp);
        if (zero_gid(g.gid)) continue;  // unused table entry
        // The kernel answers EINVAL for the type of an unused or InfiniBand entry: optional.
        g.type = read_line(pp / "gid_attrs" / "types" / gp.filename(), false);
        g.ndev = read_line(pp / "gid_attrs" / "ndevs" / gp.filename(), false);
        p.gids.push_back(g);
      }
      std::sort(p.gids.begin(), p.gids.end(), [](const RdmaGid& a, const RdmaGid& b) { return a.index < b.index; });
      d.ports.push_back(std::move(p));
    }
    std::sort(d.ports.begin(), d.ports.end(), [](const RdmaPort& a, const RdmaPort& b) { return a.port < b.port; });
    info.devices.push_back(std::move(d));
  }
  for (const auto& n : sorted_entries(fs::path(root) / "class" / "net"))
    info.interfaces.push_back({n.filename().string(), read_line(n / "operstate", false)});
  return info;
}

RdmaInfo discover_rdma() {
  RdmaInfo info = read_rdma_sysfs("/sys");
#if defined(TRIAX_HAVE_IBVERBS)
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    info.verbs_devices = 0;
    const int err = errno;
    // rdma-core answers ENOSYS when the kernel has no RDMA subsystem at all: none found.
    info.verbs_note = err == ENOSYS ? std::string("rdma-core: no RDMA subsystem in this kernel (ENOSYS)")
                                    : fmt::format("ibv_get_device_list failed: {}", std::strerror(err));
  } else {
    info.verbs_devices = n;
    ibv_free_device_list(list);
  }
#else
  info.verbs_note = "triax was built without libibverbs (rdma-core); sysfs only";
#endif
  return info;
}

NcclSettings suggest_nccl(const RdmaInfo& info) {
  NcclSettings s;
  std::vector<std::string> hcas;
  std::string gid_index, roce_ndev;
  for (const auto& d : info.devices) {
    for (const auto& p : d.ports) {
      if (!p.active()) {
        s.notes.push_back(fmt::format("{}:{} is {}: not used", d.name, p.port, p.state));
        continue;
      }
      if (p.roce()) {
        const int g = p.roce_v2_gid_index();
        if (g < 0) {
          s.notes.push_back(fmt::format("{}:{} is RoCE without a RoCE v2 GID: not used", d.name, p.port));
          continue;
        }
        if (!gid_index.empty() && gid_index != std::to_string(g))
          s.notes.push_back(fmt::format("{}:{} has its RoCE v2 GID at index {}, another HCA at {}: NCCL takes one "
                                        "index for all; check the GID tables",
                                        d.name, p.port, g, gid_index));
        if (gid_index.empty()) {
          gid_index = std::to_string(g);
          for (const auto& gg : p.gids)
            if (gg.index == g) roce_ndev = gg.ndev;
        }
      }
      hcas.push_back(fmt::format("{}:{}", d.name, p.port));
      s.notes.push_back(fmt::format("{}:{} {} {} {}", d.name, p.port, p.roce() ? "RoCE" : "InfiniBand", p.rate,
                                    p.roce() ? fmt::format("(RoCE v2 GID {})", p.roce_v2_gid_index()) : ""));
    }
  }
  s.ib_hca = fmt::format("{}", fmt::join(hcas, ","));
  s.ib_gid_index = gid_index;
  s.ib_disable = hcas.empty();
  if (s.ib_disable) s.notes.push_back("no active RDMA port: NCCL uses sockets (NCCL_IB_DISABLE=1)");
  if (!roce_ndev.empty()) {
    s.socket_ifname = roce_ndev;
    s.socket_from_rdma = true;
    s.notes.push_back(fmt::format("socket interface {}: the net device of the RoCE v2 GID", roce_ndev));
  } else {
    // As NCCL's own default: IPoIB (ib*) first, then any other physical interface that is up.
    for (const bool ib_pass : {true, false}) {
      for (const auto& i : info.interfaces)
        if (!virtual_interface(i.name) && (i.name.rfind("ib", 0) == 0) == ib_pass &&
            (i.operstate == "up" || i.operstate == "unknown")) {
          s.socket_ifname = i.name;
          s.socket_from_rdma = ib_pass && !s.ib_disable;
          s.notes.push_back(fmt::format("socket interface {}: the first {} interface that is up", i.name,
                                        ib_pass ? "IPoIB" : "physical"));
          break;
        }
      if (!s.socket_ifname.empty()) break;
    }
  }
  if (s.socket_ifname.empty()) s.notes.push_back("no physical interface up: NCCL_SOCKET_IFNAME left to NCCL");
  return s;
}

std::vector<std::string> apply_nccl_settings(const NcclSettings& s) {
  std::vector<std::string> done;
  auto set = [&](const char* name, const std::string& v) {
    if (v.empty()) return;
    if (env_set(name)) return;  // the user's choice, even "" (NCCL's own default)
    ::setenv(name, v.c_str(), 0);
    done.push_back(fmt::format("{}={}", name, v));
  };
  set("NCCL_IB_HCA", s.ib_hca);
  set("NCCL_IB_GID_INDEX", s.ib_gid_index);
  if (s.socket_from_rdma) set("NCCL_SOCKET_IFNAME", s.socket_ifname);
  return done;
}

std::vector<std::string> apply_discovered_nccl_settings_once() {
  static std::atomic<bool> first{true};
  if (!first.exchange(false)) return {};
  return [] {
    if (!env_flag("TRIAX_NCCL_AUTO_ENV", true)) return std::vector<std::string>{};
    try {
      return apply_nccl_settings(suggest_nccl(discover_rdma()));
    } catch (const std::exception& e) {
      return std::vector<std::string>{fmt::format("RDMA discovery failed: {}", e.what())};
    }
  }();
}

std::string describe(const RdmaInfo& info, const NcclSettings& s) {
  std::string out;
  out += fmt::format("RDMA: {} HCA(s) in sysfs", info.devices.size());
  if (info.verbs_devices >= 0) out += fmt::format(", {} from ibv_get_device_list", info.verbs_devices);
  if (!info.verbs_note.empty()) out += fmt::format(" ({})", info.verbs_note);
  out += "\n";
  for (const auto& d : info.devices)
    for (const auto& p : d.ports) {
      out += fmt::format("  {} port {}: {} {} {}\n", d.name, p.port, p.state, p.link_layer, p.rate);
      for (const auto& g : p.gids)
        out += fmt::format("    gid {:>3} {} {}{}\n", g.index, g.gid, g.type, g.ndev.empty() ? "" : " on " + g.ndev);
    }
  for (const auto& n : s.notes) out += fmt::format("  - {}\n", n);
  out += "suggested NCCL settings:\n";
  if (!s.ib_hca.empty()) out += fmt::format("  export NCCL_IB_HCA={}\n", s.ib_hca);
  if (!s.ib_gid_index.empty()) out += fmt::format("  export NCCL_IB_GID_INDEX={}\n", s.ib_gid_index);
  if (s.ib_disable) out += "  export NCCL_IB_DISABLE=1\n";
  if (!s.socket_ifname.empty()) out += fmt::format("  export NCCL_SOCKET_IFNAME={}\n", s.socket_ifname);
  return out;
}

}  // namespace triax::probe
