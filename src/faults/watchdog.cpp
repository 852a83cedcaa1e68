// The watchdog thread: polls progress and SIGUSR2 ten times a second (or faster for short
// timeouts); a stall dumps the flight recorder once and hands the message to the handler.
#include "triax/faults/watchdog.h"

#include <fmt/format.h>

#include <fmt/ranges.h>

#include <sys/stat.h>

#include <algorithm>
#include <thread>

#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/failure/flight_recorder.h"

namespace triax {

int64_t Watchdog::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Watchdog::Watchdog(double stall_timeout_s, int world_rank, StallHandler on_stall)
    : timeout_s_(stall_timeout_s), rank_(world_rank), handler_(std::move(on_stall)), last_us_(now_us()) {
  set_flight_recorder_world_rank(world_rank);
  install_flight_recorder_signal();
  thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::set_phase(std::string phase) { set_flight_recorder_phase(std::move(phase)); }

void Watchdog::set_handler(StallHandler h) {
  std::lock_guard lock(mu_);
  handler_ = std::move(h);
}

void Watchdog::set_detail(std::function<std::string()> detail) {
  std::lock_guard lock(mu_);
  detail_ = std::move(detail);
}

// Called with mu_ held.
std::string Watchdog::phase_with_detail() {
  std::string phase = flight_recorder_phase();
  if (detail_) {
    const std::string d = detail_();
    if (!d.empty()) {
      phase += ", at " + d;
      set_flight_recorder_phase(phase);
    }
  }
  return phase;
}

void Watchdog::run() {
  const auto tick = std::chrono::milliseconds(
      timeout_s_ > 0 ? std::clamp<int64_t>(static_cast<int64_t>(timeout_s_ * 1000 / 20), 5, 100) : 100);
  std::unique_lock lock(mu_);
  bool noticed = false;
  // The checks below run once a second at most, and only after a second without progress: a
  // ring scan copies every call (milliseconds for a few full rings), and the notice is a stat
  // on a directory that may be a shared file system.
  int64_t last_check_us = 0;
  while (!cv_.wait_for(lock, tick, [this] { return stop_; })) {
    if (poll_flight_recorder_signal()) {
      phase_with_detail();
      const std::string path = dump_flight_recorder("SIGUSR2");
      if (!path.empty()) log::info("flight recorder dumped to {} (SIGUSR2)", path);
    }
    const int64_t now = now_us();
    const double idle = (now - last_us_.load(std::memory_order_relaxed)) / 1e6;
    const bool check = idle >= 1.0 && now - last_check_us >= 1'000'000;
    if (check) last_check_us = now;
    // Another rank failed by itself and this one makes no progress (it waits for that rank):
    // dump once, so that triax-fr sees where every rank was. Ending the job is the failing
    // rank's (its launcher stops this one).
    if (!noticed && check) {
      if (const auto notice = find_failure_notice()) {
        noticed = true;
        phase_with_detail();
        dump_flight_recorder("failure notice: " + *notice);
      }
    }
    if (fired_.load()) continue;
    if (timeout_s_ > 0 && idle >= timeout_s_) {
      fire(lock, fmt::format("watchdog stall: no progress for {:.1f} s", idle),
           fmt::format("no training progress for {:.1f} s (--stall-timeout {})", idle, timeout_s_));
      continue;
    }
    // Without --stall-timeout (or before it): a call this rank issued and never waited for,
    // past the collective timeout, with no iteration finished since. The ranks waiting for it
    // time out and dump; this rank, stuck outside the communicators, would otherwise leave no
    // dump and no word (docs/FAULTS.md).
    if (!check) continue;
    const auto overdue = find_overdue_call();
    if (!overdue || idle < overdue->timeout_s) continue;
    fire(lock,
         fmt::format("watchdog: {} issued {:.1f} s ago, never waited for (collective timeout {} s)", overdue->call,
                     overdue->age_s, overdue->timeout_s),
         fmt::format("{} was issued {:.1f} s ago and never waited for, and no iteration finished since (the collective "
                     "timeout is {} s: the other members time out waiting for this rank)",
                     overdue->call, overdue->age_s, overdue->timeout_s));
  }
}

// Called with mu_ held (by `lock`); releases it while the handler runs.
void Watchdog::fire(std::unique_lock<std::mutex>& lock, const std::string& reason, const std::string& what) {
  fired_.store(true);
  const std::string phase = phase_with_detail();
  const std::string path = dump_flight_recorder(reason);
  const std::string msg = fmt::format(
      "rank {} (host {}): stalled: {} in {}; flight recorder dumped to {} (read the dumps of all ranks with triax-fr)",
      rank_, host_name(), what, phase.empty() ? "an unknown phase" : phase,
      path.empty() ? "nowhere (the dump failed)" : path);
  StallHandler h = handler_;
  lock.unlock();
  if (h) h(msg);
  else log::error("{}", msg);
  lock.lock();
}

std::vector<std::string> stall_verdict(int world_size, std::chrono::system_clock::time_point since,
                                       std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::vector<std::string> present;
  std::vector<int> absent;
  for (;;) {
    present.clear();
    absent.clear();
    for (int r = 0; r < world_size; ++r) {
      const std::string p = flight_recorder_path(r);
      struct stat st {};
      const bool fresh = ::stat(p.c_str(), &st) == 0 &&
                         std::chrono::system_clock::from_time_t(st.st_mtime + 1) >= since;
      if (fresh) present.push_back(p);
      else absent.push_back(r);
    }
    if (absent.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::string> out;
  try {
    out = analyze_flight_records(present).findings;
  } catch (const std::exception& e) {
    out.push_back(fmt::format("the flight-recorder dumps could not be analysed: {}", e.what()));
  }
  if (!absent.empty()) out.push_back(fmt::format("no fresh flight-recorder dump from ranks [{}]", fmt::join(absent, ",")));
  return out;
}

}  // namespace triax

namespace triax {

void explain_failure(std::string_view program, JobFailure& f, const std::exception& e, int rank, int world_size,
                     std::chrono::system_clock::time_point since, std::chrono::milliseconds wait,
                     std::chrono::milliseconds linger) {
  if (!f.abort_job || world_size <= 1) return;
  if (rank == 0) {
    // Rank 0's own error other than a communication failure is the cause, and its message already
    // says so: the verdict would repeat it (and the job prints one message).
    if (!dynamic_cast<const CommError*>(&e)) return;
    for (const auto& line : stall_verdict(world_size, since, wait)) f.message += fmt::format("\n{}: triax-fr: {}", program, line);
    return;
  }
  if (dynamic_cast<const TimeoutError*>(&e)) std::this_thread::sleep_for(linger);
}

}  // namespace triax
