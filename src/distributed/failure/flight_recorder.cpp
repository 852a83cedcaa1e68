// The flight recorder's rings, the process-wide registry that dumps them as JSON, and the
// SIGUSR2 trigger. Recording costs one uncontended lock and a few copies per call.
#include "triax/distributed/failure/flight_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <exception>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"
#include "triax/distributed/failure/job_failure.h"

namespace triax {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
  // Rings that outlive their communicators: with TRIAX_FR_DUMP_ON_EXIT, and every ring once a
  // dump was written (a later dump must not lose the groups an earlier one had).
  std::vector<std::shared_ptr<FlightRecorder>> kept;
  bool keep = false;
  std::vector<std::string> reasons;
  std::string phase;
  int world_rank = -1;
  bool at_exit = false;
  int64_t started_us = 0;  // the first communicator's registration: failure notices before it are an earlier job's
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: dumps may run during exit
  return *r;
}

std::atomic<bool> g_sigusr2{false};
std::atomic<bool> g_saw_failure{false};
extern "C" void on_sigusr2(int) { g_sigusr2.store(true); }

// Writes PATH.<pid>.tmp and renames it over PATH: a reader never sees half a dump. No fsync
// (unlike io::AtomicFile): a dump is written while the job fails, often moments before the
// launcher kills the process, an fsync on a busy disk can take seconds, and the pages written
// survive the process anyway (only a host crash loses them).
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) TRIAX_THROW(IoError, "{}: cannot create: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      TRIAX_THROW(IoError, "{}: write failed: {}", tmp, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TRIAX_THROW(IoError, "{}: cannot replace it with {}: {}", path, tmp, std::strerror(err));
  }
}

}  // namespace

std::string_view fr_state_name(FrState s) {
  switch (s) {
    case FrState::enqueued: return "enqueued";
    case FrState::started: return "started";
    case FrState::completed: return "completed";
    case FrState::failed: return "failed";
    case FrState::timed_out: return "timed_out";
  }
  return "?";
}

FlightRecorder::FlightRecorder(std::string group, int group_rank, int world_rank, std::vector<int> world_ranks,
                               size_t capacity)
    : group_(std::move(group)), group_rank_(group_rank), world_rank_(world_rank),
      world_ranks_(std::move(world_ranks)), ring_(capacity) {}

void FlightRecorder::enqueued(const CallInfo& info, DType dt, uint64_t count) {
  if (ring_.empty()) return;
  std::lock_guard lock(mu_);
  FrEntry& e = ring_[next_++ % ring_.size()];
  e.seq = info.seq;
  e.op = info.op;
  e.detail = info.detail;
  e.dtype = dt;
  e.count = count;
  e.peer = info.peer;
  e.enqueue_us = now_us();
  e.start_us = e.end_us = 0;
  e.state = FrState::enqueued;
}

FrEntry* FlightRecorder::find(uint64_t seq) {
  if (ring_.empty() || next_ == 0) return nullptr;
  // Calls are numbered in issue order, so seq's slot is known if it is still in the ring.
  const uint64_t last = ring_[(next_ - 1) % ring_.size()].seq;
  if (seq > last || last - seq >= std::min<uint64_t>(next_, ring_.size())) return nullptr;
  FrEntry& e = ring_[(next_ - 1 - (last - seq)) % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

void FlightRecorder::started(uint64_t seq) {
  if (ring_.empty()) return;
  std::lock_guard lock(mu_);
  if (FrEntry* e = find(seq); e && e->state == FrState::enqueued) {
    e->start_us = now_us();
    e->state = FrState::started;
  }
}

void FlightRecorder::ended(uint64_t seq, FrState state) {
  if (state == FrState::failed || state == FrState::timed_out) g_saw_failure.store(true);  // even with no ring
  if (ring_.empty()) return;
  std::lock_guard lock(mu_);
  if (FrEntry* e = find(seq)) {
    e->end_us = now_us();
    if (e->start_us == 0) e->start_us = e->end_us;
    e->state = state;
  }
}

std::vector<FrEntry> FlightRecorder::entries() const {
  std::lock_guard lock(mu_);
  std::vector<FrEntry> out;
  const uint64_t n = std::min<uint64_t>(next_, ring_.size());
  out.reserve(n);
  for (uint64_t i = next_ - n; i < next_; ++i) out.push_back(ring_[i % ring_.size()]);
  return out;
}

size_t flight_recorder_capacity() {
  static const size_t cap = static_cast<size_t>(env_int("TRIAX_FR_SIZE", 0, 1 << 24, 2048));
  return cap;
}

void register_flight_recorder(const std::shared_ptr<FlightRecorder>& fr) {
  if (!fr || !fr->enabled()) return;
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::erase_if(r.recorders, [](const auto& w) { return w.expired(); });
  r.recorders.push_back(fr);
  if (r.started_us == 0) r.started_us = now_us();
  if (!r.at_exit) {
    const bool dump_on_exit = env_flag("TRIAX_FR_DUMP_ON_EXIT", false);  // a bad value throws before at_exit is set
    r.at_exit = true;
    if (dump_on_exit) {
      r.keep = true;
      std::atexit([] { dump_flight_recorder("exit"); });
    }
  }
  if (r.keep) r.kept.push_back(fr);
}

std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, int group_rank, int world_rank,
                                                     std::vector<int> world_ranks, size_t capacity) {
  // The deleter runs when the communicator lets go; during unwinding it hands the ring to the
  // registry under a new owner (the old weak entry has expired) instead of freeing it.
  std::shared_ptr<FlightRecorder> fr(
      new FlightRecorder(std::move(group), group_rank, world_rank, std::move(world_ranks), capacity),
      [](FlightRecorder* p) {
        if (std::uncaught_exceptions() == 0 || !p->enabled()) {
          delete p;
          return;
        }
        std::shared_ptr<FlightRecorder> kept(p);
        auto& r = registry();
        std::lock_guard lock(r.mu);
        r.recorders.push_back(kept);
        r.kept.push_back(std::move(kept));
      });
  register_flight_recorder(fr);
  return fr;
}

bool flight_recorder_saw_failure() { return g_saw_failure.load(); }

std::optional<FrOverdue> find_overdue_call() {
  std::vector<std::shared_ptr<FlightRecorder>> recs;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    for (auto& w : r.recorders)
      if (auto p = w.lock()) recs.push_back(std::move(p));
  }
  const int64_t now = now_us();
  std::optional<FrOverdue> oldest;
  int64_t oldest_us = 0;
  for (const auto& fr : recs) {
    const int64_t timeout_us = fr->timeout().count() * 1000;
    for (const FrEntry& e : fr->entries()) {
      // Waiting, failed or timed out: the waiter reports it (or already did); nothing overdue here.
      if (e.state != FrState::enqueued && e.state != FrState::completed) return std::nullopt;
      if (e.state != FrState::enqueued || timeout_us <= 0 || now - e.enqueue_us <= timeout_us) continue;
      if (oldest && e.enqueue_us >= oldest_us) continue;
      oldest_us = e.enqueue_us;
      oldest = FrOverdue{fmt::format("{} #{} ({}) on group '{}' (world ranks [{}])", e.op, e.seq, e.detail, fr->group(),
                                     fmt::join(fr->world_ranks(), ",")),
                         static_cast<double>(now - e.enqueue_us) / 1e6, static_cast<double>(timeout_us) / 1e6};
    }
  }
  return oldest;
}

void set_flight_recorder_world_rank(int rank) {
  std::lock_guard lock(registry().mu);
  registry().world_rank = rank;
}

void set_flight_recorder_phase(std::string phase) {
  std::lock_guard lock(registry().mu);
  registry().phase = std::move(phase);
}

std::string flight_recorder_phase() {
  std::lock_guard lock(registry().mu);
  return registry().phase;
}

std::string flight_recorder_path(int world_rank) {
  std::string d = env_string("TRIAX_FR_DIR", ".");
  if (d.back() != '/') d += '/';
  return fmt::format("{}triax_fr_rank{}.json", d, world_rank);
}

std::string dump_flight_recorder(std::string_view reason) noexcept {
  try {
    auto& r = registry();
    std::vector<std::shared_ptr<FlightRecorder>> recs;
    nlohmann::json j;
    int rank = 0;
    {
      std::lock_guard lock(r.mu);
      r.reasons.emplace_back(reason);
      for (auto& w : r.recorders)
        if (auto p = w.lock()) recs.push_back(std::move(p));
      // From now on no ring is dropped: the next dump keeps every group this one has.
      for (const auto& p : recs)
        if (std::find(r.kept.begin(), r.kept.end(), p) == r.kept.end()) r.kept.push_back(p);
      r.keep = true;
      rank = r.world_rank >= 0 ? r.world_rank : launcher_rank();
      j["reasons"] = r.reasons;
      j["phase"] = r.phase;
    }
    j["format"] = "triax-flight-recorder-1";
    j["rank"] = rank;
    j["host"] = host_name();
    j["pid"] = static_cast<int64_t>(::getpid());
    j["time_us"] = now_us();
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& fr : recs) {
      nlohmann::json g;
      g["name"] = fr->group();
      g["group_rank"] = fr->group_rank();
      g["world_ranks"] = fr->world_ranks();
      nlohmann::json calls = nlohmann::json::array();
      for (const FrEntry& e : fr->entries())
        calls.push_back({{"seq", e.seq}, {"op", e.op}, {"detail", e.detail}, {"dtype", dtype_name(e.dtype)},
                         {"count", e.count}, {"peer", e.peer}, {"state", fr_state_name(e.state)},
                         {"enqueue_us", e.enqueue_us}, {"start_us", e.start_us}, {"end_us", e.end_us}});
      g["calls"] = std::move(calls);
      groups.push_back(std::move(g));
    }
    j["groups"] = std::move(groups);
    const std::string path = flight_recorder_path(rank);
    replace_file(path, j.dump(1) + "\n");
    return path;
  } catch (const std::exception& e) {
    try {
      log::error("flight recorder: the dump ({}) could not be written: {}", reason, e.what());
    } catch (...) {
    }
  } catch (...) {
  }
  return {};
}

void install_flight_recorder_signal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = on_sigusr2;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, nullptr);
  });
}

bool poll_flight_recorder_signal() { return g_sigusr2.exchange(false); }

namespace {
std::string failure_notice_path() {
  std::string p = flight_recorder_path(0);  // $TRIAX_FR_DIR/triax_fr_rank0.json
  return p.substr(0, p.rfind('/') + 1) + "triax_fr_failure";
}
}  // namespace

void post_failure_notice(std::string_view what) noexcept {
  try {
    int rank = 0;
    {
      std::lock_guard lock(registry().mu);
      rank = registry().world_rank >= 0 ? registry().world_rank : launcher_rank();
    }
    replace_file(failure_notice_path(), fmt::format("{}\n{}\n", rank, what));
  } catch (const std::exception& e) {
    try {
      log::error("flight recorder: the failure notice could not be written: {}", e.what());
    } catch (...) {
    }
  } catch (...) {
  }
}

std::optional<std::string> find_failure_notice() {
  auto& r = registry();
  const std::string path = failure_notice_path();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const int64_t mtime_us = int64_t{st.st_mtim.tv_sec} * 1'000'000 + st.st_mtim.tv_nsec / 1000;
  int me = 0;
  {
    std::lock_guard lock(r.mu);
    if (mtime_us < r.started_us) return std::nullopt;
    me = r.world_rank >= 0 ? r.world_rank : launcher_rank();
  }
  std::ifstream in(path);
  int rank = -1;
  std::string what;
  if (!(in >> rank) || rank == me) return std::nullopt;
  in.ignore(1);
  std::getline(in, what);
  return fmt::format("rank {}: {}", rank, what);
}

}  // namespace triax
