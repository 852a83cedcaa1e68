// The flight recorder's rings, the process-wide registry that dumps them as JSON, and the
// SIGUSR2 trigger. Recording costs one uncontended lock and a few copies per call.
#include "triax/distributed/failure/flight_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"
#include "triax/distributed/failure/job_failure.h"
#include "triax/io/atomic_file.h"

namespace triax {
namespace {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<FlightRecorder>> recorders;
  std::vector<std::shared_ptr<FlightRecorder>> kept;  // TRIAX_FR_DUMP_ON_EXIT: rings outlive their communicators
  bool keep = false;
  std::vector<std::string> reasons;
  std::string phase;
  int world_rank = -1;
  bool at_exit = false;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: dumps may run during exit
  return *r;
}

std::atomic<bool> g_sigusr2{false};
extern "C" void on_sigusr2(int) { g_sigusr2.store(true); }

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
    const std::string text = j.dump(1) + "\n";
    io::AtomicFile f(path);
    f.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
    f.commit();
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

}  // namespace triax
