// Work::wait's polling rhythm: the pause schedule (1/8 of the time waited, 10 us to the cap),
// the environment knobs and their errors, that a wait past its spin sleeps instead of burning
// its core while still returning soon after the call completes, and that a waiter sharing its
// core with a busy thread stops spinning (the oversubscribed case, reproduced by pinning).
#include <catch2/catch.hpp>

#include <pthread.h>
#include <sched.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "triax/distributed/comm/comm.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/distributed/comm/wait_policy.h"

using namespace triax;
using namespace std::chrono_literals;

namespace {
// Completes once `ready_at` has passed; counts its polls.
class TimedWork final : public WorkImpl {
 public:
  explicit TimedWork(std::chrono::steady_clock::time_point ready_at) : ready_at_(ready_at) {}
  bool test() override {
    ++polls;
    return std::chrono::steady_clock::now() >= ready_at_;
  }
  long polls = 0;

 private:
  std::chrono::steady_clock::time_point ready_at_;
};

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct EnvGuard {
  explicit EnvGuard(const char* n) : name(n) {}
  ~EnvGuard() { ::unsetenv(name); }
  const char* name;
};
}  // namespace

TEST_CASE("wait_pause: an eighth of the time waited within [10 us, sleep_max]") {
  const WaitPolicy p{50us, 0us, 1000us};
  CHECK(wait_pause(p, 0ns) == kMinWaitSleep);
  CHECK(wait_pause(p, 79us) == kMinWaitSleep);
  CHECK(wait_pause(p, 100us) == 12us);  // 100/8 = 12.5, rounded down
  CHECK(wait_pause(p, 4ms) == 500us);
  CHECK(wait_pause(p, 8ms) == 1000us);
  CHECK(wait_pause(p, 10s) == 1000us);
  CHECK(wait_pause(WaitPolicy{0us, 0us, 50us}, 1s) == 50us);
}

TEST_CASE("wait_policy_from_env: defaults, overrides, bad values named") {
  EnvGuard a("TRIAX_COMM_SPIN_US"), b("TRIAX_COMM_SLEEP_MAX_US"), c("TRIAX_COMM_SPIN_IDLE_US");
  ::unsetenv("TRIAX_COMM_SPIN_US");
  ::unsetenv("TRIAX_COMM_SLEEP_MAX_US");
  ::unsetenv("TRIAX_COMM_SPIN_IDLE_US");
  const WaitPolicy d = wait_policy_from_env();
  CHECK(d.spin == 50us);
  CHECK(d.spin_idle == 1s);
  CHECK(d.sleep_max == 100us);

  ::setenv("TRIAX_COMM_SPIN_US", "0", 1);
  ::setenv("TRIAX_COMM_SLEEP_MAX_US", "250", 1);
  ::setenv("TRIAX_COMM_SPIN_IDLE_US", "0", 1);
  const WaitPolicy e = wait_policy_from_env();
  CHECK(e.spin == 0us);
  CHECK(e.spin_idle == 0us);
  CHECK(e.sleep_max == 250us);
  // New communicators take the environment's policy; set_wait_policy changes one.
  auto comm = make_self_communicator();
  CHECK(comm->wait_policy().spin == 0us);
  CHECK(comm->wait_policy().sleep_max == 250us);
  comm->set_wait_policy(WaitPolicy{7us, 8us, 77us});
  CHECK(comm->wait_policy().spin == 7us);
  CHECK(comm->wait_policy().spin_idle == 8us);
  CHECK(comm->wait_policy().sleep_max == 77us);

  for (const char* bad : {"-1", "ten", "5us", "", "99999999999999"}) {
    INFO(bad);
    ::setenv("TRIAX_COMM_SPIN_US", bad, 1);
    CHECK_THROWS_WITH(wait_policy_from_env(), Catch::Contains("TRIAX_COMM_SPIN_US='" + std::string(bad) + "'"));
  }
  ::setenv("TRIAX_COMM_SPIN_US", "100", 1);
  ::setenv("TRIAX_COMM_SLEEP_MAX_US", "9", 1);  // below the 10 us floor
  CHECK_THROWS_AS(wait_policy_from_env(), ConfigError);
  CHECK_THROWS_WITH(wait_policy_from_env(), Catch::Contains("TRIAX_COMM_SLEEP_MAX_US='9'") && Catch::Contains("[10,"));
}

TEST_CASE("Work::wait past its spin sleeps, and still returns soon after completion") {
  // A call that completes 60 ms from now, waited on with the spin limited to 50 us (what a
  // loaded node gets). A spinning wait polls it millions of times on a full core; this one
  // sleeps: about 100 polls and a few ms of CPU.
  auto comm = make_self_communicator();
  comm->set_wait_policy(WaitPolicy{50us, 0us, 1000us});
  const auto start = std::chrono::steady_clock::now();
  auto impl = std::make_shared<TimedWork>(start + 60ms);
  Work w(impl, comm.get(), CallInfo{});
  const double cpu0 = thread_cpu_s();
  w.wait(10s);
  const auto done = std::chrono::steady_clock::now();
  const double cpu = thread_cpu_s() - cpu0;
  INFO("polls " << impl->polls << ", thread CPU " << cpu << " s, wall " << (done - start) / 1.0ms << " ms");
  CHECK(w.test());
  CHECK(done - start >= 60ms);
  // Sleeps are capped at 1 ms: a generous bound on the wake-up lag that a loaded CI machine
  // still meets, and that a wait sleeping far past the completion would not.
  CHECK(done - start < 60ms + 250ms);
  // Polls: the 50 us spin (at most a few thousand trivial polls) plus ~80 sleeps.
  CHECK(impl->polls < 50'000);
  // CPU: the spin plus the wake-ups; a spinning wait would use ~60 ms.
  CHECK(cpu < 0.020);
}

TEST_CASE("Work::wait spins no longer than spin_idle, free cores or not") {
  // spin_idle = 5 ms bounds the spin even on an idle node: a 60 ms wait uses well under 60 ms
  // of CPU (at most ~5 ms of spin, plus the wake-ups).
  auto comm = make_self_communicator();
  comm->set_wait_policy(WaitPolicy{0us, 5000us, 1000us});
  auto impl = std::make_shared<TimedWork>(std::chrono::steady_clock::now() + 60ms);
  Work w(impl, comm.get(), CallInfo{});
  const double cpu0 = thread_cpu_s();
  w.wait(10s);
  const double cpu = thread_cpu_s() - cpu0;
  INFO("polls " << impl->polls << ", thread CPU " << cpu << " s");
  CHECK(cpu < 0.030);
}

TEST_CASE("Work::wait with a zero spin still times out on its deadline") {
  auto c = make_self_communicator();
  c->set_wait_policy(WaitPolicy{0us, 0us, 1000us});
  std::vector<float> buf(4);
  Work w = c->recv(std::span<float>(buf), 0, 3);  // nobody sends
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(w.wait(30ms), TimeoutError);
  CHECK(std::chrono::steady_clock::now() - start >= 30ms);
}

TEST_CASE("Work::wait stops spinning when a busy thread shares its core") {
  // The oversubscribed case made deterministic: this thread and a busy thread pinned to one
  // CPU, and a 300 ms wait with the default policy (spin up to 1 s while not preempted). The
  // scheduler preempts the spinning waiter within a time slice, the wait then sleeps, and the
  // busy thread gets the core: the waiter uses a small share of it. The former 1 s spin
  // (spin = 1 s) took about half the core for the whole wait.
  cpu_set_t mine;
  REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof(mine), &mine) == 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
  REQUIRE(cpu < CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  REQUIRE(pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0);

  std::atomic<bool> stop{false};
  std::atomic<double> hog_cpu{0};
  std::thread hog([&] {
    const double c0 = thread_cpu_s();
    while (!stop.load(std::memory_order_relaxed)) {
    }
    hog_cpu = thread_cpu_s() - c0;
  });
  // The hog is created with this thread's (single-CPU) affinity; give it time to start.
  std::this_thread::sleep_for(20ms);

  // The waiter is a fresh thread (inheriting the single-CPU affinity), so its per-thread
  // preemption history starts empty whatever the other cases did on this thread.
  auto comm = make_self_communicator();
  comm->set_wait_policy(WaitPolicy{});
  auto impl = std::make_shared<TimedWork>(std::chrono::steady_clock::now() + 300ms);
  Work w(impl, comm.get(), CallInfo{});
  double waiter = 0, wall = 0;
  long preempted = 0;
  std::thread([&] {
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = thread_cpu_s();
    const long pre0 = thread_preemptions();
    w.wait(10s);
    waiter = thread_cpu_s() - cpu0;
    wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    preempted = thread_preemptions() - pre0;
  }).join();
  stop = true;
  hog.join();
  REQUIRE(pthread_setaffinity_np(pthread_self(), sizeof(mine), &mine) == 0);
  INFO("waiter CPU " << waiter << " s over " << wall << " s, preempted " << preempted << " times, polls "
                     << impl->polls << ", hog CPU " << hog_cpu.load() << " s");
  CHECK(w.test());
  CHECK(preempted >= 1);
  // A spinning waiter would hold ~50% of the shared core; one that sleeps after its first
  // preemption holds a time slice or two (a few ms) plus its wake-ups.
  CHECK(waiter < 0.25 * wall);
}

namespace {
// Never completes on the host; counts what Work asks of it.
class DeviceSideWork final : public WorkImpl {
 public:
  explicit DeviceSideWork(bool on_device) : on_device_(on_device) {}
  bool test() override {
    ++polls;
    return polls > 3;  // a host wait needs four polls
  }
  void finish() override { ++finishes; }
  bool wait_on_device() override {
    ++device_waits;
    return on_device_;
  }
  int polls = 0, finishes = 0, device_waits = 0;

 private:
  bool on_device_;
};
}  // namespace

TEST_CASE("Work::wait takes a device-side dependency when the implementation offers one") {
  auto dev = std::make_shared<DeviceSideWork>(true);
  Work w(dev, nullptr, CallInfo{});
  w.wait(1h);
  CHECK(dev->device_waits == 1);
  CHECK(dev->polls == 0);  // the host never polled
  CHECK(dev->finishes == 1);
  CHECK(w.test());  // complete for the caller from now on
  w.wait();
  CHECK(dev->finishes == 1);
  CHECK(dev->device_waits == 1);

  auto host = std::make_shared<DeviceSideWork>(false);  // the default: a host wait, polled to completion
  Work h(host, nullptr, CallInfo{});
  h.wait(1h);
  CHECK(host->device_waits == 1);
  CHECK(host->polls == 4);
  CHECK(host->finishes == 1);
}
