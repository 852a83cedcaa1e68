// Flight recorder: every communicator keeps a ring of its last N calls (sequence number, op,
// dtype, count, peer, group, enqueue/start/end times, state). The rings of all communicators
// of a process are dumped together as one JSON file per rank (triax_fr_rank<R>.json in
// TRIAX_FR_DIR or the working directory) on a timeout, an error, a watchdog stall, SIGUSR2,
// and at exit when TRIAX_FR_DUMP_ON_EXIT=1. analyze_flight_records reads the dumps of all ranks.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "triax/core/dtype.h"

namespace triax {

struct CallInfo;

enum class FrState : uint8_t { enqueued, started, completed, failed, timed_out };
std::string_view fr_state_name(FrState s);

struct FrEntry {
  uint64_t seq = 0;
  std::string op;
  std::string detail;  // "float32 x 4096, sum"
  DType dtype = DType::f32;
  uint64_t count = 0;
  int peer = -1;  // group rank for point-to-point calls
  int64_t enqueue_us = 0, start_us = 0, end_us = 0;  // microseconds since the Unix epoch; 0: not yet
  FrState state = FrState::enqueued;
};

// One communicator's ring. Written by the thread that issues calls, read by dumps from any thread.
class FlightRecorder {
 public:
  // capacity 0 records nothing.
  FlightRecorder(std::string group, int group_rank, int world_rank, std::vector<int> world_ranks, size_t capacity);
  void enqueued(const CallInfo& info, DType dt, uint64_t count);
  void started(uint64_t seq);
  void ended(uint64_t seq, FrState state);
  // The entries oldest first.
  std::vector<FrEntry> entries() const;
  const std::string& group() const { return group_; }
  int group_rank() const { return group_rank_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  bool enabled() const { return !ring_.empty(); }
  // The communicator's collective timeout, for find_overdue_call (0: unknown, never overdue).
  void set_timeout(std::chrono::milliseconds t) { timeout_ms_.store(t.count(), std::memory_order_relaxed); }
  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms_.load(std::memory_order_relaxed)); }

 private:
  FrEntry* find(uint64_t seq);
  std::string group_;
  int group_rank_, world_rank_;
  std::vector<int> world_ranks_;
  mutable std::mutex mu_;
  std::vector<FrEntry> ring_;
  uint64_t next_ = 0;  // entries written so far
  std::atomic<int64_t> timeout_ms_{0};
};

// Ring size of new communicators: TRIAX_FR_SIZE (0 turns the recorder off), default 2048.
size_t flight_recorder_capacity();
// Registers a recorder so dumps include it. Weakly until the first dump: a communicator destroyed
// before anything went wrong drops out. From the first dump on, every ring is kept, so that a
// later dump (the error reaching main after the trainer and its groups were destroyed) still
// holds the groups the first one had instead of replacing it with less.
void register_flight_recorder(const std::shared_ptr<FlightRecorder>& fr);
// A registered ring for a communicator. Released while an exception unwinds (a rank whose own
// error destroys the trainer and its groups on the way to main, before any dump was written), it
// is kept instead of freed, so the dump written where the error is caught still holds the group.
std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, int group_rank, int world_rank,
                                                     std::vector<int> world_ranks, size_t capacity);

// Facts a dump carries besides the rings: why it was written, and what the rank was doing.
void set_flight_recorder_world_rank(int rank);
void set_flight_recorder_phase(std::string phase);  // "iteration 3: optimizer step (DP gradient sync)"
std::string flight_recorder_phase();
// Path of this rank's dump: $TRIAX_FR_DIR/triax_fr_rank<R>.json (or ./ without TRIAX_FR_DIR).
std::string flight_recorder_path(int world_rank);
// Writes this process's dump (all registered rings) and returns its path; "" when it could not be
// written (the reason goes to the log: a dump never throws, it runs while handling other errors).
// Several triggers may fire; each dump replaces the previous one, with every reason so far.
std::string dump_flight_recorder(std::string_view reason) noexcept;
// A call this rank issued but never waited for, past its communicator's timeout: the sign of a
// rank stuck outside the communicators (the `hang` fault, a stuck kernel, a deadlock in user
// code) while the others wait for it and will time out. Only when no call of this process is
// being waited for (a waiting rank times out by itself) and none has failed or timed out yet
// (this process is not already handling a failure). The oldest such call, or nothing.
struct FrOverdue {
  std::string call;  // "all_reduce #2 (float32 x 8, avg) on group 'dp' (world ranks [0,1,2,3])"
  double age_s = 0;  // since it was issued
  double timeout_s = 0;
};
std::optional<FrOverdue> find_overdue_call();
// Whether a call of this process has failed or timed out (FlightRecorder::ended): the rank is on
// its way to report that failure, so a peer leaving meanwhile is no news to report.
bool flight_recorder_saw_failure();
// SIGUSR2 sets a flag that poll_flight_recorder_signal() (the watchdog thread) turns into a dump.
void install_flight_recorder_signal();
bool poll_flight_recorder_signal();

// The failure notice, so that every rank dumps when one fails by itself (a thrown error): the
// ranks waiting for it are blocked in a collective and would learn nothing until their own
// timeout, and mpirun's SIGKILL follows its SIGTERM within milliseconds. post_failure_notice
// writes TRIAX_FR_DIR/triax_fr_failure (this rank and `what`; the directory the dumps share);
// find_failure_notice returns "rank R: what" when another rank posted it after this process
// registered its first communicator (a notice of an earlier job is older), else nothing. The
// watchdog of a rank that makes no progress looks for it and dumps.
void post_failure_notice(std::string_view what) noexcept;
std::optional<std::string> find_failure_notice();

// The verdict of triax-fr over the dumps of a job's ranks: lines naming the rank that did not
// reach a sequence number of a group, and ranks whose calls differ at the same number.
struct FrVerdict {
  std::vector<std::string> findings;  // one sentence each; empty: nothing wrong found
  std::vector<std::string> notes;     // what each dump said (rank, reason, phase)
  // Some dump reports a failure (an error, a timed-out or failed call, a stall): with no finding,
  // the dumps do not show its cause, which is not the same as nothing wrong (triax-fr exits 1).
  std::vector<int> failed_ranks;
};
// Reads the JSON dump files; IoError naming a file that cannot be read or parsed.
FrVerdict analyze_flight_records(const std::vector<std::string>& paths);

}  // namespace triax
