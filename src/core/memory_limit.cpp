// Available memory (see memory_limit.h): the smallest of what the host, the cgroup and the
// address-space limit still allow, each read from the kernel's text files.
#include "triax/core/memory_limit.h"

#include <sys/resource.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "triax/core/env.h"
#include "triax/core/error.h"

#if defined(TRIAX_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace triax {
namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  uint64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p == s.data()) return std::nullopt;
  return v;
}

// "Key:   123 kB" in a /proc file's text, in bytes.
std::optional<uint64_t> proc_kib_field(std::string_view text, std::string_view key) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line = text.substr(at, end - at);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ':')
      if (auto kib = parse_u64(line.substr(key.size() + 1))) return *kib * 1024;
    at = end + 1;
  }
  return std::nullopt;
}

// The process's cgroup path for a controller (v1: "4:memory:/a/b"; v2: "0::/a/b").
std::string cgroup_path(std::string_view self_cgroup, bool v2) {
  size_t at = 0;
  while (at < self_cgroup.size()) {
    const size_t end = std::min(self_cgroup.find('\n', at), self_cgroup.size());
    const std::string_view line = self_cgroup.substr(at, end - at);
    const size_t c1 = line.find(':'), c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 != std::string_view::npos) {
      const std::string_view ctrls = line.substr(c1 + 1, c2 - c1 - 1);
      if (v2 ? ctrls.empty() : ctrls.find("memory") != std::string_view::npos) return std::string(line.substr(c2 + 1));
    }
    at = end + 1;
  }
  return "/";
}

// Limit minus usage of the first cgroup directory that has the files (the process's own cgroup
// as the host sees it, then the container's root, where that path is not mounted).
std::optional<std::pair<uint64_t, std::string>> cgroup_room(bool v2) {
  const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
  const std::string limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
  const std::string usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
  const std::string own = cgroup_path(read_text("/proc/self/cgroup").value_or(""), v2);
  for (const std::string& dir : {root + (own == "/" ? "" : own), root}) {
    const auto limit_text = read_text(dir + "/" + limit_file);
    if (!limit_text) continue;
    const auto limit = parse_cgroup_limit(*limit_text);
    if (!limit) return std::nullopt;  // unlimited
    const uint64_t used = parse_u64(read_text(dir + "/" + usage_file).value_or("")).value_or(0);
    return std::pair{*limit > used ? *limit - used : 0,
                     fmt::format("the cgroup {} limit {}/{} minus its usage", v2 ? "v2" : "v1", dir, limit_file)};
  }
  return std::nullopt;
}

// TRIAX_MEMORY_LIMIT_MIB (the one environment variable read here), through core/env.h.
std::optional<uint64_t> memory_limit_from_env() {
  const auto mib = env_int_opt("TRIAX_MEMORY_LIMIT_MIB", 1, int64_t{1} << 43);
  if (!mib) return std::nullopt;
  return static_cast<uint64_t>(*mib) << 20;
}

MemoryLimit host_memory() {
  MemoryLimit m;
  auto consider = [&](uint64_t bytes, std::string source) {
    if (!m.bytes || bytes < *m.bytes) m.bytes = bytes, m.source = std::move(source);
  };
  if (auto avail = parse_mem_available(read_text("/proc/meminfo").value_or("")))
    consider(*avail, "MemAvailable in /proc/meminfo");
  for (const bool v2 : {true, false})
    if (auto room = cgroup_room(v2)) consider(room->first, room->second);
  rlimit as{};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const uint64_t used = proc_kib_field(read_text("/proc/self/status").value_or(""), "VmSize").value_or(0);
    consider(as.rlim_cur > used ? as.rlim_cur - used : 0, "the address-space limit (ulimit -v) minus the address space in use");
  }
  return m;
}

}  // namespace

std::optional<uint64_t> parse_mem_available(std::string_view meminfo) { return proc_kib_field(meminfo, "MemAvailable"); }

std::optional<uint64_t> parse_cgroup_limit(std::string_view text) {
  const auto v = parse_u64(text);
  // v1 writes "no limit" as 2^63 rounded down to a page; anything that large is no limit.
  if (!v || *v >= (uint64_t{1} << 62)) return std::nullopt;
  return v;
}

MemoryLimit available_memory(Device device) {
  if (auto env = memory_limit_from_env()) return {env, "TRIAX_MEMORY_LIMIT_MIB"};
  if (device.is_cpu()) return host_memory();
#if defined(TRIAX_HAVE_CUDA)
  int prev = -1;
  const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
  size_t free_b = 0, total_b = 0;
  const bool ok = cudaSetDevice(device.index) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
  if (have_prev) (void)cudaSetDevice(prev);
  (void)cudaGetLastError();  // a failure here is "unknown", not an error for the next CUDA call
  if (ok) return {free_b, fmt::format("cudaMemGetInfo on {} (free of {} bytes)", device.str(), total_b)};
#endif
  return {std::nullopt, fmt::format("no measurement for {}", device.str())};
}

}  // namespace triax
