// How Work::wait polls a call that has not finished: spin while this thread keeps its core,
// else sleep between polls, so that a waiting rank hands its core to the rank it waits for when
// runnable processes outnumber cores (oversubscribed CPU runs, a shared machine).
#pragma once

#include <chrono>

namespace triax {

struct WaitPolicy {
  // Poll back to back for this long, whatever the load: short calls finish here.
  std::chrono::microseconds spin{50};
  // Then keep spinning up to this long (from the start of the wait) while the waiting thread is
  // not preempted (its involuntary context switches, checked every kPreemptCheckEvery): the
  // scheduler preempts a spinner only when another thread of similar priority wants the core.
  // Once preempted within kRarePreemption of spinning (summed over waits) since its previous
  // preemption, the thread spins only `spin` in its waits of the next kContendedFor, then
  // tries again; rarer preemptions (a niced build taking its small share) are ignored. Spinning on a free core costs nobody; a wake-up from a sleep costs tens of
  // microseconds per wait, which pipeline P2P pays many times per step.
  std::chrono::microseconds spin_idle{1'000'000};
  // After the spin: sleep between polls for 1/8 of the time waited so far (a late wake-up
  // costs at most ~1/8 of the wait), at least kMinWaitSleep, at most sleep_max. The cap is short
  // because an oversubscribed job pays every late wake-up, and a hung peer still costs only a
  // sliver of a core (measurements: benchmarks/results/comm_wait_cpu.md).
  std::chrono::microseconds sleep_max{100};
};

inline constexpr std::chrono::microseconds kMinWaitSleep{10};
inline constexpr std::chrono::microseconds kPreemptCheckEvery{20};
inline constexpr std::chrono::milliseconds kContendedFor{100};
inline constexpr std::chrono::milliseconds kRarePreemption{10};

// The pause before the next poll once the spin is over, after `waited` without completion.
std::chrono::microseconds wait_pause(const WaitPolicy& p, std::chrono::nanoseconds waited);

// Involuntary context switches of the calling thread so far (getrusage RUSAGE_THREAD).
long thread_preemptions();

// The defaults above, overridden by TRIAX_COMM_SPIN_US, TRIAX_COMM_SPIN_IDLE_US and
// TRIAX_COMM_SLEEP_MAX_US (whole microseconds; ConfigError naming the variable otherwise).
// TRIAX_COMM_SPIN_US=1000000 is the former behaviour (spin a full second, then sleep);
// TRIAX_COMM_SPIN_IDLE_US=0 spins only TRIAX_COMM_SPIN_US whatever the load.
WaitPolicy wait_policy_from_env();

}  // namespace triax
