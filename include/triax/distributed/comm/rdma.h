// RDMA discovery for NCCL: the HCAs, their ports, link layer (InfiniBand or RoCE over Ethernet)
// and RoCEv2 GID indices, read from sysfs (/sys/class/infiniband, the kernel's stable ABI) and
// cross-checked with rdma-core's ibv_get_device_list; turned into the NCCL_IB_HCA,
// NCCL_IB_GID_INDEX and NCCL_SOCKET_IFNAME values to use, applied only where the user set none.
#pragma once
#include <string>
#include <vector>

namespace triax::probe {

struct RdmaGid {
  int index = 0;
  std::string gid;    // "fe80:0000:...", as sysfs prints it
  std::string type;   // "IB/RoCE v1" | "RoCE v2" ("" when the kernel gives none: InfiniBand)
  std::string ndev;   // the net device of a RoCE GID ("" for InfiniBand)
  bool ipv4_mapped() const;  // ::ffff:a.b.c.d
};

struct RdmaPort {
  int port = 1;
  std::string state;       // "ACTIVE", "DOWN", ... (the text after "4: ")
  std::string link_layer;  // "InfiniBand" | "Ethernet"
  std::string rate;        // "200 Gb/sec (4X HDR)"
  std::vector<RdmaGid> gids;  // non-zero entries only
  bool active() const { return state == "ACTIVE"; }
  bool roce() const { return link_layer == "Ethernet"; }
  // The GID NCCL should use on a RoCE port: RoCE v2 and IPv4-mapped first, then any RoCE v2; -1: none.
  int roce_v2_gid_index() const;
};

struct RdmaDevice {
  std::string name;       // mlx5_0
  std::vector<RdmaPort> ports;
  std::vector<std::string> netdevs;  // device/net/* (the Ethernet or IPoIB interface)
};

struct NetInterface {
  std::string name;
  std::string operstate;  // "up", "down", "unknown"
};

struct RdmaInfo {
  std::vector<RdmaDevice> devices;
  std::vector<NetInterface> interfaces;  // /sys/class/net
  int verbs_devices = -1;                // ibv_get_device_list's count; -1: not asked (fixture)
  std::string verbs_note;                // why verbs said nothing (no library, an error)
};

struct NcclSettings {
  std::string ib_hca;        // "mlx5_0:1,mlx5_1:1"; "" when no active HCA port
  std::string ib_gid_index;  // "3" on RoCE; "" on InfiniBand or without RDMA
  std::string socket_ifname; // the interface for NCCL's bootstrap sockets
  bool socket_from_rdma = false;  // socket_ifname is the RoCE GID's device or IPoIB (else a guess)
  bool ib_disable = false;   // no active RDMA port: NCCL_IB_DISABLE=1 (sockets)
  std::vector<std::string> notes;  // why each value was chosen
};

// Parses ROOT/class/infiniband and ROOT/class/net (ROOT = "/sys" on a real machine). A missing
// class directory means none; an unreadable or malformed file is an IoError naming it.
RdmaInfo read_rdma_sysfs(const std::string& root);
// The real machine: sysfs under /sys plus the rdma-core device list.
RdmaInfo discover_rdma();
NcclSettings suggest_nccl(const RdmaInfo& info);
// Sets the NCCL_* variables of `s` that are not already set (the user's values win): the HCA list,
// the GID index, and the socket interface when it came from the RDMA device (a guessed Ethernet
// interface and NCCL_IB_DISABLE are only printed: NCCL's own choice is as good). Returns the
// "NAME=value" assignments it made.
std::vector<std::string> apply_nccl_settings(const NcclSettings& s);
// What the NCCL backend calls before each communicator: the first call discovers and applies and
// returns what it set (later calls: nothing); TRIAX_NCCL_AUTO_ENV=0 turns it off. Never throws
// (a discovery error comes back as a note).
std::vector<std::string> apply_discovered_nccl_settings_once();
// Human-readable report (what triax-probe --rdma prints).
std::string describe(const RdmaInfo& info, const NcclSettings& s);

}  // namespace triax::probe
