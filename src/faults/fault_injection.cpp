// TRIAX_FAULT parsing and the faults themselves: the only place in the library that ends its own
// process (kill, exit), which is what these faults are for.
#include "triax/faults/fault_injection.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "triax/core/env.h"
#include "triax/core/error.h"

namespace triax {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  return out;
}

// One number of an entry, by core/env.h's rules: "TRIAX_FAULT entry '2:0:kill': iteration='0' is out of range".
int64_t to_int(std::string_view v, std::string_view entry, const char* what, int64_t lo, int64_t hi) {
  return parse_env_int(fmt::format("TRIAX_FAULT entry '{}': {}", entry, what), v, lo, hi,
                       fmt::format("an integer in [{}, {}]", lo, hi));
}

void notice(const Fault& f, int64_t it, std::string_view what) {
  std::fprintf(stderr, "triax fault injection (TRIAX_FAULT): rank %d at iteration %lld: %s\n", f.rank,
               static_cast<long long>(it), std::string(what).c_str());
  std::fflush(stderr);
}

}  // namespace

std::string_view fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::kill: return "kill";
    case FaultKind::exit: return "exit";
    case FaultKind::throw_error: return "throw";
    case FaultKind::hang: return "hang";
    case FaultKind::slow: return "slow";
    case FaultKind::nan: return "nan";
  }
  return "?";
}

std::vector<Fault> parse_faults(std::string_view spec) {
  std::vector<Fault> out;
  if (spec.empty()) return out;
  for (std::string_view entry : split(spec, ',')) {
    const auto parts = split(entry, ':');
    if (parts.size() < 3 || parts.size() > 4)
      TRIAX_THROW(ConfigError,
                  "TRIAX_FAULT entry '{}': expected RANK:ITERATION:KIND[:ARG] with KIND one of kill, exit, throw, "
                  "hang, slow:MS, nan",
                  entry);
    Fault f;
    f.rank = static_cast<int>(to_int(parts[0], entry, "rank", 0, std::numeric_limits<int>::max()));
    f.iteration = to_int(parts[1], entry, "iteration", 1, std::numeric_limits<int64_t>::max());
    const std::string_view k = parts[2];
    if (k == "kill") f.kind = FaultKind::kill;
    else if (k == "exit") f.kind = FaultKind::exit;
    else if (k == "throw") f.kind = FaultKind::throw_error;
    else if (k == "hang") f.kind = FaultKind::hang;
    else if (k == "slow") f.kind = FaultKind::slow;
    else if (k == "nan") f.kind = FaultKind::nan;
    else
      TRIAX_THROW(ConfigError, "TRIAX_FAULT entry '{}': unknown kind '{}'; expected kill, exit, throw, hang, slow:MS or nan",
                  entry, k);
    if (f.kind == FaultKind::slow) {
      if (parts.size() != 4) TRIAX_THROW(ConfigError, "TRIAX_FAULT entry '{}': slow needs milliseconds (slow:MS)", entry);
      f.ms = to_int(parts[3], entry, "milliseconds", 1, 86'400'000);
    } else if (parts.size() == 4) {
      TRIAX_THROW(ConfigError, "TRIAX_FAULT entry '{}': {} takes no argument", entry, k);
    }
    out.push_back(f);
  }
  return out;
}

FaultInjector::FaultInjector(std::vector<Fault> faults, int world_rank) : rank_(world_rank) {
  for (const auto& f : faults)
    if (f.rank == world_rank) faults_.push_back(f);
}

FaultInjector FaultInjector::from_env(int world_rank) {
  const auto spec = env_string_opt("TRIAX_FAULT", "RANK:ITERATION:KIND[:ARG], several separated by commas");
  return FaultInjector(parse_faults(spec.value_or("")), world_rank);
}

void FaultInjector::at_step_start(int64_t it) const {
  for (const auto& f : faults_) {
    if (f.kind == FaultKind::slow && it >= f.iteration) {
      if (it == f.iteration) notice(f, it, fmt::format("slow: sleeping {} ms every iteration from now on", f.ms));
      std::this_thread::sleep_for(std::chrono::milliseconds(f.ms));
    }
    if (it != f.iteration) continue;
    switch (f.kind) {
      case FaultKind::kill:
        notice(f, it, "kill: SIGKILL to itself");
        ::kill(::getpid(), SIGKILL);
        break;
      case FaultKind::exit:
        notice(f, it, "exit: status 1 without finalising");
        std::_Exit(1);
      case FaultKind::throw_error:
        notice(f, it, "throw: an exception inside the step");
        TRIAX_THROW(Error, "injected fault (TRIAX_FAULT): an exception inside the step on rank {} at iteration {}",
                    f.rank, it);
      default: break;
    }
  }
}

void FaultInjector::maybe_hang(int64_t it) const {
  for (const auto& f : faults_)
    if (f.kind == FaultKind::hang && f.iteration == it) {
      notice(f, it, "hang: no progress from now on");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
}

bool FaultInjector::nan_due(int64_t it) const {
  for (const auto& f : faults_)
    if (f.kind == FaultKind::nan && f.iteration == it) return true;
  return false;
}

}  // namespace triax
