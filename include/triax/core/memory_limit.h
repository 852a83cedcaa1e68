// How much memory a process may still allocate, so that a run the memory model says cannot fit is
// refused before it allocates (and the kernel's OOM killer never ends it without a word). CPU:
// MemAvailable from /proc/meminfo, the cgroup v2 or v1 limit minus its usage, and RLIMIT_AS
// minus the address space in use, whichever is smallest; a GPU: cudaMemGetInfo's free bytes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "triax/core/device.h"

namespace triax {

struct MemoryLimit {
  // Bytes that may still be allocated; nullopt when nothing could be measured.
  std::optional<uint64_t> bytes;
  // Where the number comes from, for messages: "MemAvailable in /proc/meminfo", "the cgroup v1
  // limit ... minus its usage", "TRIAX_MEMORY_LIMIT_MIB", "cudaMemGetInfo on cuda:0".
  std::string source;
};

// The memory still available to this process on `device`. The environment variable
// TRIAX_MEMORY_LIMIT_MIB, when set, replaces the measurement (a test, or a scheduler that knows
// better); ConfigError when it is not a positive integer. Never throws otherwise.
MemoryLimit available_memory(Device device = Device::cpu());

// The parsers behind it, exposed for tests.
// "MemAvailable:   23675024 kB" in /proc/meminfo's text, in bytes.
std::optional<uint64_t> parse_mem_available(std::string_view meminfo);
// A cgroup limit file's text ("max\n", "9223372036854771712\n", "1073741824\n"): nullopt when
// unlimited (v2 "max" or v1's page-rounded 2^63) or unreadable.
std::optional<uint64_t> parse_cgroup_limit(std::string_view text);

}  // namespace triax
