// Work::wait's polling rhythm (wait_policy.h): the pause schedule, the preemption count that
// decides whether to keep spinning, and the environment knobs.
#include "triax/distributed/comm/wait_policy.h"

#include <sys/resource.h>

#include "triax/core/env.h"

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
// A whole number of microseconds in [min, one hour].
std::chrono::microseconds env_us(const char* name, std::chrono::microseconds fallback, int64_t min) {
  return std::chrono::microseconds(env_int(name, min, 3'600'000'000LL, fallback.count()));
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
