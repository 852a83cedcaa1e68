// Available memory: the /proc/meminfo and cgroup parsers on the kernel's own spellings, the
// TRIAX_MEMORY_LIMIT_MIB override (and its refusal of a bad value), and a live measurement that
// is positive and no larger than the host's total.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "triax/core/error.h"
#include "triax/core/memory_limit.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
// Sets an environment variable for one scope, restoring the previous value.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) {
    if (const char* o = std::getenv(name.c_str())) old = o;
    if (value) ::setenv(name.c_str(), value, 1);
    else ::unsetenv(name.c_str());
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};
}  // namespace

TEST_CASE("meminfo and cgroup limit files parse as the kernel writes them", "[core]") {
  const std::string meminfo =
      "MemTotal:       24683652 kB\nMemFree:         1234567 kB\nMemAvailable:   23675024 kB\nBuffers: 1 kB\n";
  CHECK(parse_mem_available(meminfo) == uint64_t{23675024} * 1024);
  CHECK_FALSE(parse_mem_available("MemTotal: 5 kB\nMemFree: 3 kB\n"));
  CHECK_FALSE(parse_mem_available("MemAvailableX: 5 kB\n"));
  CHECK(parse_cgroup_limit("1073741824\n") == uint64_t{1} << 30);
  CHECK_FALSE(parse_cgroup_limit("max\n"));                   // v2: no limit
  CHECK_FALSE(parse_cgroup_limit("9223372036854771712\n"));   // v1: 2^63 rounded down to a page
  CHECK_FALSE(parse_cgroup_limit(""));
}

TEST_CASE("TRIAX_MEMORY_LIMIT_MIB replaces the measurement; a bad value is refused", "[core]") {
  {
    ScopedEnv e("TRIAX_MEMORY_LIMIT_MIB", "300");
    const MemoryLimit m = available_memory();
    REQUIRE(m.bytes);
    CHECK(*m.bytes == uint64_t{300} << 20);
    CHECK(m.source == "TRIAX_MEMORY_LIMIT_MIB");
  }
  for (const char* bad : {"0", "-5", "12MB", "lots", "99999999999999999999"}) {
    ScopedEnv e("TRIAX_MEMORY_LIMIT_MIB", bad);
    try {
      (void)available_memory();
      FAIL("accepted TRIAX_MEMORY_LIMIT_MIB=" << bad);
    } catch (const ConfigError& err) {
      CHECK_THAT(std::string(err.what()), Contains("TRIAX_MEMORY_LIMIT_MIB='" + std::string(bad) + "'"));
    }
  }
}

TEST_CASE("the live host measurement is positive and at most MemTotal", "[core]") {
  ScopedEnv e("TRIAX_MEMORY_LIMIT_MIB", nullptr);
  const MemoryLimit m = available_memory(Device::cpu());
  std::ifstream f("/proc/meminfo");
  if (!f) {
    WARN("no /proc/meminfo: nothing to compare with");
    return;
  }
  std::string line;
  uint64_t total_kib = 0;
  while (std::getline(f, line))
    if (line.rfind("MemTotal:", 0) == 0) total_kib = std::stoull(line.substr(9));
  REQUIRE(m.bytes);
  CHECK(*m.bytes > 0);
  CHECK(*m.bytes <= total_kib * 1024);
  CHECK_FALSE(m.source.empty());
}
