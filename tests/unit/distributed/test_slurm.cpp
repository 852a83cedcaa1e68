// Slurm host lists and step variables: expansions checked against what `scontrol show hostnames`
// prints for the same lists (Slurm 22.05), malformed lists refused with the position, and the
// step environment read into rank, size, local rank, master node and port.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "triax/core/error.h"
#include "triax/distributed/bootstrap/slurm.h"

using namespace triax;
using V = std::vector<std::string>;

TEST_CASE("Slurm host lists expand like scontrol show hostnames", "[slurm]") {
  CHECK(expand_slurm_hostlist("localhost") == V{"localhost"});
  CHECK(expand_slurm_hostlist("n1,n2") == V{"n1", "n2"});
  CHECK(expand_slurm_hostlist("node[1-3]") == V{"node1", "node2", "node3"});
  CHECK(expand_slurm_hostlist("gpu[08-11]") == V{"gpu08", "gpu09", "gpu10", "gpu11"});
  CHECK(expand_slurm_hostlist("gpu[098-101]") == V{"gpu098", "gpu099", "gpu100", "gpu101"});
  CHECK(expand_slurm_hostlist("n[1-2,5],login1") == V{"n1", "n2", "n5", "login1"});
  CHECK(expand_slurm_hostlist("n[1-02]") == V{"n1", "n2"});
  CHECK(expand_slurm_hostlist("n[9-10]") == V{"n9", "n10"});
  CHECK(expand_slurm_hostlist("n[01-3]") == V{"n01", "n02", "n03"});
  CHECK(expand_slurm_hostlist("rack[1-2]-n[01-02]") == V{"rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"});
  CHECK(expand_slurm_hostlist("n[7]") == V{"n7"});
  CHECK(expand_slurm_hostlist("n[0-1]") == V{"n0", "n1"});
  CHECK(expand_slurm_hostlist("10.0.0.[1-2]") == V{"10.0.0.1", "10.0.0.2"});
}

TEST_CASE("malformed Slurm host lists name the problem and position", "[slurm]") {
  for (const char* bad : {"", "n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[1-]", "n[]", "n[1,,2]", "n1,,n2", "n1,",
                          "n[1-[2]]", "n 1", "a[1-2]-ib", "a[1-2]b,c1"}) {
    INFO(bad);
    CHECK_THROWS_AS(expand_slurm_hostlist(bad), ConfigError);
  }
  try {
    expand_slurm_hostlist("gpu[04-02]");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("'gpu[04-02]'") != std::string::npos);
    CHECK(std::string(e.what()).find("runs backwards") != std::string::npos);
  }
  CHECK_THROWS_AS(expand_slurm_hostlist("n[1-99999999]"), ConfigError);
}

namespace {
struct Env {
  std::vector<std::string> names;
  void set(const char* n, const char* v) {
    ::setenv(n, v, 1);
    names.push_back(n);
  }
  ~Env() {
    for (auto& n : names) ::unsetenv(n.c_str());
  }
};
}  // namespace

TEST_CASE("a Slurm step's variables give rank, size, local rank, master and port", "[slurm]") {
  for (const char* n : {"TRIAX_MASTER_PORT", "MASTER_PORT", "SLURM_STEP_RESV_PORTS", "TRIAX_MASTER_ADDR"}) ::unsetenv(n);
  Env e;
  CHECK_FALSE(in_slurm_step());
  e.set("SLURM_PROCID", "5");
  CHECK_FALSE(in_slurm_step());  // a batch script's shell: no step id
  e.set("SLURM_STEP_ID", "3");
  CHECK(in_slurm_step());
  e.set("SLURM_NTASKS", "8");
  e.set("SLURM_LOCALID", "1");
  e.set("SLURM_STEP_NODELIST", "gpu[07-10]");
  e.set("SLURM_JOB_ID", "4242");
  SlurmStep s = read_slurm_step();
  CHECK(s.procid == 5);
  CHECK(s.ntasks == 8);
  CHECK(s.localid == 1);
  CHECK(s.nodes == V{"gpu07", "gpu08", "gpu09", "gpu10"});
  CHECK(s.master_addr == "gpu07");
  CHECK(s.master_port == 20000 + (4242 * 97 + 3) % 30000);
  e.set("SLURM_STEP_ID", "4");  // the next step of the job rendezvouses elsewhere
  CHECK(read_slurm_step().master_port != s.master_port);
  e.set("SLURM_STEP_RESV_PORTS", "12000-12003");
  CHECK(read_slurm_step().master_port == 12000);
  e.set("TRIAX_MASTER_PORT", "29555");
  CHECK(read_slurm_step().master_port == 29555);
  e.set("SLURM_PROCID", "8");
  CHECK_THROWS_AS(read_slurm_step(), ConfigError);
  e.set("SLURM_PROCID", "x");
  try {
    read_slurm_step();
    FAIL("a bad SLURM_PROCID was accepted");
  } catch (const ConfigError& err) {
    CHECK(std::string(err.what()).find("SLURM_PROCID='x'") != std::string::npos);
  }
  e.set("SLURM_PROCID", "0");
  ::unsetenv("SLURM_LOCALID");
  CHECK_THROWS_AS(read_slurm_step(), ConfigError);
}
