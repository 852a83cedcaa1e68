// Device classes from the environment (distributed/grid.h): TRIAX_DEVICE_CLASS, else the rank's
// host line in the hostfile named by TRIAX_HOSTFILE (`node01 slots=8  # class=h100`), else "default".
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "triax/core/error.h"
#include "triax/distributed/grid.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
std::string hostfile(const std::string& text) {
  const auto p = std::filesystem::temp_directory_path() / "triax_test_device_class_hosts";
  std::ofstream(p) << text;
  return p.string();
}
}  // namespace

TEST_CASE("device class: a hostfile's class comments map hosts to classes", "[grid][hetero]") {
  const std::string f = hostfile("# the job's hosts\nnode01 slots=8  # class=h100\nnode02 slots=8 # rack 3 class=h100\n"
                                 "node09 slots=8\nnode10 slots=8 #class=a100.80g\n");
  CHECK(device_class_in_hostfile(f, "node01") == std::optional<std::string>("h100"));
  CHECK(device_class_in_hostfile(f, "node02") == std::optional<std::string>("h100"));
  CHECK(device_class_in_hostfile(f, "node10") == std::optional<std::string>("a100.80g"));
  CHECK_FALSE(device_class_in_hostfile(f, "node09").has_value());  // no class comment
  CHECK_FALSE(device_class_in_hostfile(f, "node1").has_value());   // no such host
  CHECK_THROWS_WITH(device_class_in_hostfile(hostfile("n1 slots=2 # class=a/b\n"), "n1"),
                    Contains("line 1: class 'a/b' of host n1"));
  CHECK_THROWS_AS(device_class_in_hostfile("/nonexistent/hosts", "n1"), IoError);
}

TEST_CASE("device class: the variable wins, then the hostfile, then default", "[grid][hetero]") {
  const std::string f = hostfile("posing-host slots=2 # class=slow\n");
  ::unsetenv("TRIAX_DEVICE_CLASS");
  ::unsetenv("TRIAX_HOSTFILE");
  CHECK(device_class_from_env() == kDefaultDeviceClass);
  ::setenv("TRIAX_HOSTNAME", "posing-host", 1);
  ::setenv("TRIAX_HOSTFILE", f.c_str(), 1);
  CHECK(device_class_from_env() == "slow");
  ::setenv("TRIAX_DEVICE_CLASS", "fast", 1);
  CHECK(device_class_from_env() == "fast");
  ::setenv("TRIAX_DEVICE_CLASS", "a b", 1);
  CHECK_THROWS_WITH(device_class_from_env(), Contains("TRIAX_DEVICE_CLASS='a b'"));
  ::unsetenv("TRIAX_DEVICE_CLASS");
  ::setenv("TRIAX_HOSTNAME", "other-host", 1);
  CHECK(device_class_from_env() == kDefaultDeviceClass);  // a host without a line
  ::unsetenv("TRIAX_HOSTFILE");
  ::unsetenv("TRIAX_HOSTNAME");
}
