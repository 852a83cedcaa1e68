// RDMA discovery: sysfs parsing on fixture trees (tests/cluster/fixtures: a RoCE and an
// InfiniBand node), the NCCL settings derived from them, errors for malformed files, applying
// settings without overriding the user's, and the real machine's path (no HCA here: none found).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "triax/core/error.h"
#include "triax/distributed/comm/rdma.h"

using namespace triax;
using namespace triax::probe;
namespace fs = std::filesystem;

namespace {
const std::string kFixtures = std::string(TRIAX_SOURCE_DIR) + "/tests/cluster/fixtures";
}

TEST_CASE("RoCE fixture: active port, IPv4-mapped RoCE v2 GID, its net device", "[rdma]") {
  const RdmaInfo info = read_rdma_sysfs(kFixtures + "/sysfs-roce");
  REQUIRE(info.devices.size() == 2);
  const auto& d = info.devices[0];
  CHECK(d.name == "mlx5_0");
  CHECK(d.netdevs == std::vector<std::string>{"eth2"});
  REQUIRE(d.ports.size() == 1);
  const auto& p = d.ports[0];
  CHECK(p.active());
  CHECK(p.roce());
  CHECK(p.rate == "100 Gb/sec (4X EDR)");
  REQUIRE(p.gids.size() == 4);  // the zero entry 4 is dropped
  CHECK(p.gids[1].type == "RoCE v2");
  CHECK_FALSE(p.gids[1].ipv4_mapped());
  CHECK(p.gids[3].ipv4_mapped());
  CHECK(p.roce_v2_gid_index() == 3);
  CHECK(info.devices[1].ports[0].state == "DOWN");
  const NcclSettings s = suggest_nccl(info);
  CHECK(s.ib_hca == "mlx5_0:1");
  CHECK(s.ib_gid_index == "3");
  CHECK(s.socket_ifname == "eth2");
  CHECK(s.socket_from_rdma);
  CHECK_FALSE(s.ib_disable);
  const std::string text = describe(info, s);
  CHECK(text.find("export NCCL_IB_GID_INDEX=3") != std::string::npos);
  CHECK(text.find("mlx5_1:1 is DOWN: not used") != std::string::npos);
}

TEST_CASE("InfiniBand fixture: both HCAs, no GID index, IPoIB for sockets", "[rdma]") {
  const RdmaInfo info = read_rdma_sysfs(kFixtures + "/sysfs-ib");
  REQUIRE(info.devices.size() == 2);
  CHECK(info.devices[1].ports[0].link_layer == "InfiniBand");
  CHECK(info.devices[1].ports[0].gids.size() == 1);
  CHECK(info.devices[1].ports[0].gids[0].type.empty());
  CHECK(info.devices[0].ports[0].roce_v2_gid_index() == -1);
  const NcclSettings s = suggest_nccl(info);
  CHECK(s.ib_hca == "mlx5_0:1,mlx5_1:1");
  CHECK(s.ib_gid_index.empty());
  CHECK(s.socket_ifname == "ib0");  // IPoIB before the Ethernet management port; ib1 is down
  CHECK(s.socket_from_rdma);
}

TEST_CASE("RoCE port without a RoCE v2 GID is not used", "[rdma]") {
  RdmaInfo info;
  RdmaDevice d;
  d.name = "mlx4_0";
  RdmaPort p;
  p.state = "ACTIVE";
  p.link_layer = "Ethernet";
  p.gids.push_back({0, "fe80:0000:0000:0000:0e42:a1ff:fe2b:3c4d", "IB/RoCE v1", "eth1"});
  d.ports.push_back(p);
  info.devices.push_back(d);
  const NcclSettings s = suggest_nccl(info);
  CHECK(s.ib_hca.empty());
  CHECK(s.ib_disable);
}

TEST_CASE("malformed sysfs files are IoErrors naming the file", "[rdma]") {
  const fs::path root = fs::temp_directory_path() / ("triax_rdma_" + std::to_string(::getpid()));
  const fs::path port = root / "class/infiniband/mlx5_9/ports/1";
  fs::create_directories(port);
  std::ofstream(port / "state") << "4: ACTIVE\n";
  std::ofstream(port / "link_layer") << "Token Ring\n";
  try {
    read_rdma_sysfs(root.string());
    FAIL("a bad link layer was accepted");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("link_layer") != std::string::npos);
    CHECK(std::string(e.what()).find("Token Ring") != std::string::npos);
  }
  std::ofstream(port / "link_layer") << "Ethernet\n";
  std::ofstream(port / "state") << "ACTIVE\n";
  CHECK_THROWS_AS(read_rdma_sysfs(root.string()), IoError);
  fs::remove(port / "state");
  CHECK_THROWS_AS(read_rdma_sysfs(root.string()), IoError);
  fs::remove_all(root);
  // No class directories at all: nothing found, no error.
  CHECK(read_rdma_sysfs((root / "absent").string()).devices.empty());
}

TEST_CASE("applying NCCL settings keeps what the user set", "[rdma]") {
  ::unsetenv("NCCL_IB_HCA");
  ::unsetenv("NCCL_IB_GID_INDEX");
  ::setenv("NCCL_SOCKET_IFNAME", "bond0", 1);
  NcclSettings s;
  s.ib_hca = "mlx5_0:1";
  s.ib_gid_index = "3";
  s.socket_ifname = "eth2";
  s.socket_from_rdma = true;
  const auto done = apply_nccl_settings(s);
  CHECK(done == std::vector<std::string>{"NCCL_IB_HCA=mlx5_0:1", "NCCL_IB_GID_INDEX=3"});
  CHECK(std::string(std::getenv("NCCL_IB_HCA")) == "mlx5_0:1");
  CHECK(std::string(std::getenv("NCCL_SOCKET_IFNAME")) == "bond0");
  ::unsetenv("NCCL_IB_HCA");
  ::unsetenv("NCCL_IB_GID_INDEX");
  ::unsetenv("NCCL_SOCKET_IFNAME");
  // A guessed Ethernet interface is printed, not applied.
  s.socket_from_rdma = false;
  s.ib_hca.clear();
  s.ib_gid_index.clear();
  CHECK(apply_nccl_settings(s).empty());
  CHECK(std::getenv("NCCL_SOCKET_IFNAME") == nullptr);
}

TEST_CASE("this machine: the real sysfs and verbs calls find what is there", "[rdma]") {
  const RdmaInfo info = discover_rdma();
  if (fs::exists("/sys/class/infiniband")) {
    // A machine with HCAs: sysfs and rdma-core must agree on the count.
    if (info.verbs_devices >= 0) CHECK(info.verbs_devices == static_cast<int>(info.devices.size()));
    return;
  }
  CHECK(info.devices.empty());
#if defined(TRIAX_TEST_HAVE_IBVERBS)
  CHECK(info.verbs_devices == 0);  // rdma-core is installed and reports no device
#endif
  const NcclSettings s = suggest_nccl(info);
  CHECK(s.ib_disable);
  CHECK(s.ib_hca.empty());
  CHECK(describe(info, s).find("0 HCA(s) in sysfs") != std::string::npos);
  CHECK(describe(info, s).find("NCCL_IB_DISABLE=1") != std::string::npos);
}
