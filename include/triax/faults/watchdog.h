// Watchdog: a thread per rank that watches training progress. When no iteration finishes within
// the stall timeout (--stall-timeout, separate from the collective timeout), or, without one, when
// a call this rank issued and never waited for is older than the collective timeout (the rank is
// stuck outside the communicators while the others time out waiting for it), it dumps the flight
// recorder with the current phase of the step and calls the stall handler with a message naming
// this rank; it also turns SIGUSR2 into a flight-recorder dump. Ending the job is the handler's.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "triax/distributed/failure/job_failure.h"

namespace triax {

class Watchdog {
 public:
  using StallHandler = std::function<void(const std::string& message)>;
  // stall_timeout_s <= 0: no stall detection (SIGUSR2 dumps still work).
  Watchdog(double stall_timeout_s, int world_rank, StallHandler on_stall = {});
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Progress: resets the stall clock (the trainer calls it at every iteration boundary).
  void progress() { last_us_.store(now_us(), std::memory_order_relaxed); }
  // The phase of the step, recorded with the dump ("iteration 3: pipeline schedule").
  void set_phase(std::string phase);
  void set_handler(StallHandler h);
  // Finer position inside the phase, asked for at dump time from the watchdog thread (the
  // pipeline executor's current instruction and micro-batch); "" adds nothing.
  void set_detail(std::function<std::string()> detail);
  bool stalled() const { return fired_.load(); }
  double stall_timeout_s() const { return timeout_s_; }

 private:
  static int64_t now_us();
  void run();
  std::string phase_with_detail();
  void fire(std::unique_lock<std::mutex>& lock, const std::string& reason, const std::string& what);
  double timeout_s_;
  int rank_;
  StallHandler handler_;
  std::function<std::string()> detail_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> last_us_;
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// For a stall handler on one rank: waits up to `wait` for the flight-recorder dumps of all
// world_size ranks written since `since` (flight_recorder_path), then returns triax-fr's findings
// over those present, and a line naming the ranks whose dump did not appear.
std::vector<std::string> stall_verdict(int world_size, std::chrono::system_clock::time_point since,
                                       std::chrono::milliseconds wait);

// For a failure that not every rank shares (JobFailure::abort_job, from settle_failure), so that
// the job's one message names the rank at fault as the watchdog's does: rank 0 adds the
// stall_verdict lines, when its own error is a communication failure (a symptom; any other
// error of rank 0 is itself the cause and already named), (over the dumps written since `since`, waiting up to `wait` for them) to its
// message. Another rank whose error is a collective timeout (a symptom: the cause is on another
// rank, and rank 0 soon times out or stalls too) first waits `linger` without a word, during
// which rank 0's report normally ends the job; only then does it report for itself.
void explain_failure(std::string_view program, JobFailure& f, const std::exception& e, int rank, int world_size,
                     std::chrono::system_clock::time_point since,
                     std::chrono::milliseconds wait = std::chrono::seconds(3),
                     std::chrono::milliseconds linger = std::chrono::seconds(15));

}  // namespace triax
