// Work::wait's polling rhythm (wait_policy.h): the pause schedule, the preemption count that
// decides whether to keep spinning, and the environment knobs.
#include "triax/distributed/comm/wait_policy.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>

#include "triax/core/error.h"

namespace triax {

std::chrono::microseconds wait_pause(const WaitPolicy& p, std::chrono::nanoseconds waited) {
  const auto eighth = std::chrono::duration_cast<std::chrono::microseconds>(waited / 8);
  if (eighth < kMinWaitSleep) return kMinWaitSleep;
  return eighth < p.sleep_max ? eighth : p.sleep_max;
}

long thread_preemptions() {
  rusage u{};
  if (getrusage(RUSAGE_THREAD, &u) != 0) return 0;
  return u.ru_nivcsw;
}

namespace {
std::chrono::microseconds env_us(const char* name, std::chrono::microseconds fallback, long long min) {
  const char* s = std::getenv(name);
  if (!s) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE || v < min || v > 3'600'000'000LL)
    TRIAX_THROW(ConfigError, "{}='{}' is not a whole number of microseconds in [{}, 3600000000]", name, s, min);
  return std::chrono::microseconds(v);
}
}  // namespace

WaitPolicy wait_policy_from_env() {
  WaitPolicy p;
  p.spin = env_us("TRIAX_COMM_SPIN_US", p.spin, 0);
  p.spin_idle = env_us("TRIAX_COMM_SPIN_IDLE_US", p.spin_idle, 0);
  p.sleep_max = env_us("TRIAX_COMM_SLEEP_MAX_US", p.sleep_max, kMinWaitSleep.count());
  return p;
}

}  // namespace triax
