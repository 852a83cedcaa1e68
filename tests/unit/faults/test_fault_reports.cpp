// Fault reports that must name the rank at fault (issue 24): a later dump keeps the groups of an
// earlier one after their communicators are gone; a call issued and never waited for past the
// collective timeout is found, and the watchdog reports it without --stall-timeout; triax-fr
// names a rank that failed by itself, and says when dumps report a failure it cannot explain.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "triax/distributed/comm/self_comm.h"
#include "triax/distributed/failure/flight_recorder.h"
#include "triax/faults/watchdog.h"

using namespace triax;
using Catch::Matchers::Contains;
using namespace std::chrono_literals;

namespace {

// TRIAX_FR_DIR pointing at a fresh directory for the duration of a test.
struct FrDir {
  std::string dir;
  explicit FrDir(const char* name) : dir((std::filesystem::temp_directory_path() / name).string()) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    setenv("TRIAX_FR_DIR", dir.c_str(), 1);
  }
  ~FrDir() {
    unsetenv("TRIAX_FR_DIR");
    std::filesystem::remove_all(dir);
  }
  nlohmann::json dump(int rank) const {
    std::ifstream in(flight_recorder_path(rank));
    return nlohmann::json::parse(in);
  }
};

std::vector<std::string> group_names(const nlohmann::json& j) {
  std::vector<std::string> out;
  for (const auto& g : j.at("groups")) out.push_back(g.at("name").get<std::string>());
  return out;
}

std::string write_dump(const std::string& dir, int rank, const std::string& reasons, const std::string& state) {
  const std::string p = dir + "/triax_fr_rank" + std::to_string(rank) + ".json";
  std::ofstream(p) << "{\"rank\":" << rank << ",\"host\":\"h" << rank << "\",\"phase\":\"iteration 3\",\"reasons\":["
                   << reasons << "],\"groups\":[{\"name\":\"dp\",\"group_rank\":" << rank
                   << ",\"world_ranks\":[0,1,2,3],\"calls\":[{\"seq\":6,\"op\":\"all_reduce\",\"detail\":\"float32 x 8, "
                      "sum\",\"state\":\"completed\"}"
                   << (state.empty() ? "" : ",{\"seq\":7,\"op\":\"all_reduce\",\"detail\":\"float32 x 8, sum\",\"state\":\"" +
                                                state + "\"}")
                   << "]}]}";
  return p;
}

}  // namespace

// First in this file: before any dump in the process, only the unwinding keeps the ring.
TEST_CASE("a group destroyed while an error unwinds is still in the dump written where it is caught", "[faults]") {
  FrDir d("triax_fr_unwound");
  set_flight_recorder_world_rank(1);
  try {
    auto tp = make_self_communicator("unwound_tp", 1);
    std::vector<int32_t> x = {7, -3};
    tp->all_gather(std::span<const int32_t>(x), std::span<int32_t>(x)).wait();
    throw std::runtime_error("the rank's own error, before any dump");
  } catch (const std::exception& e) {
    REQUIRE_FALSE(dump_flight_recorder(std::string("error: ") + e.what()).empty());
  }
  const auto names = group_names(d.dump(1));
  CHECK(std::count(names.begin(), names.end(), "unwound_tp") == 1);
}

TEST_CASE("a later dump keeps the groups of an earlier one after their communicators are gone", "[faults]") {
  FrDir d("triax_fr_keep_groups");
  set_flight_recorder_world_rank(0);
  auto world = make_self_communicator("keep_world");
  auto dp = make_self_communicator("keep_dp");
  std::vector<float> x = {1.5f, -2.0f, 3.25f};
  world->all_reduce(std::span<float>(x)).wait();
  dp->all_reduce(std::span<float>(x)).wait();
  dp->all_reduce(std::span<float>(x)).wait();
  REQUIRE_FALSE(dump_flight_recorder("keep: the timeout").empty());
  auto first = group_names(d.dump(0));
  CHECK(std::count(first.begin(), first.end(), "keep_dp") == 1);
  // The trainer (and its dp group) is destroyed while the error unwinds; main dumps again.
  dp.reset();
  REQUIRE_FALSE(dump_flight_recorder("error: keep: the error in main").empty());
  const auto second = d.dump(0);
  const auto names = group_names(second);
  CHECK(std::count(names.begin(), names.end(), "keep_dp") == 1);
  CHECK(std::count(names.begin(), names.end(), "keep_world") == 1);
  for (const auto& g : second.at("groups"))
    if (g.at("name") == "keep_dp") CHECK(g.at("calls").size() == 2);
  const auto reasons = second.at("reasons").get<std::vector<std::string>>();
  CHECK(std::find(reasons.begin(), reasons.end(), "keep: the timeout") != reasons.end());
}

TEST_CASE("a call issued and never waited for past the collective timeout is overdue", "[faults]") {
  auto fr = std::make_shared<FlightRecorder>("ovd", 1, 2, std::vector<int>{0, 2}, 16);
  fr->set_timeout(60ms);
  register_flight_recorder(fr);
  fr->enqueued(CallInfo{0, "all_reduce", "float32 x 8, avg", -1}, DType::f32, 8);
  CHECK_FALSE(find_overdue_call());  // not yet past the timeout
  std::this_thread::sleep_for(120ms);
  auto o = find_overdue_call();
  REQUIRE(o);
  CHECK(o->call == "all_reduce #0 (float32 x 8, avg) on group 'ovd' (world ranks [0,2])");
  CHECK(o->age_s >= 0.1);
  CHECK(o->timeout_s == Approx(0.06));
  // A rank waiting in a call times out by itself: nothing for the watchdog to report.
  fr->started(0);
  CHECK_FALSE(find_overdue_call());
  fr->ended(0, FrState::completed);
  fr->enqueued(CallInfo{1, "all_gather", "float32 x 4", -1}, DType::f32, 4);
  std::this_thread::sleep_for(120ms);
  o = find_overdue_call();
  REQUIRE(o);
  CHECK_THAT(o->call, Contains("all_gather #1"));
  // Nor once a call has timed out: this process is already handling the failure.
  CHECK_FALSE(flight_recorder_saw_failure());
  fr->enqueued(CallInfo{2, "all_gather", "float32 x 4", -1}, DType::f32, 4);
  fr->ended(2, FrState::timed_out);
  CHECK_FALSE(find_overdue_call());
  CHECK(flight_recorder_saw_failure());
  // Leave nothing for the next test: rings are kept once a dump was written, so the timed-out
  // call must leave this one (16 completed calls push it out).
  fr->ended(1, FrState::completed);
  for (uint64_t s = 3; s < 19; ++s) {
    fr->enqueued(CallInfo{s, "barrier", "int32 x 0", -1}, DType::i32, 0);
    fr->ended(s, FrState::completed);
  }
  CHECK_FALSE(find_overdue_call());
}

TEST_CASE("without --stall-timeout the watchdog reports a call never waited for", "[faults]") {
  FrDir d("triax_fr_watchdog_overdue");
  auto fr = std::make_shared<FlightRecorder>("wd", 0, 3, std::vector<int>{3, 5}, 16);
  fr->set_timeout(200ms);
  register_flight_recorder(fr);
  std::atomic<bool> called{false};
  std::string msg;
  {
    Watchdog w(0, 3, [&](const std::string& m) {
      msg = m;
      called = true;
    });
    w.set_phase("iteration 3: optimizer step");
    fr->enqueued(CallInfo{4, "all_reduce", "float32 x 8, avg", -1}, DType::f32, 8);
    for (int i = 0; i < 50 && !called; ++i) std::this_thread::sleep_for(100ms);
    REQUIRE(called);
    CHECK(w.stalled());
  }
  CHECK_THAT(msg, Contains("rank 3 (host ") && Contains("stalled: all_reduce #4 (float32 x 8, avg) on group 'wd'") &&
                      Contains("never waited for") && Contains("in iteration 3: optimizer step"));
  const auto j = d.dump(3);
  CHECK_THAT(j.at("reasons").back().get<std::string>(), Contains("watchdog: all_reduce #4"));
  fr->ended(4, FrState::completed);
}

TEST_CASE("a failure notice posted by one rank is found by the others, not by itself", "[faults]") {
  FrDir d("triax_fr_notice");
  set_flight_recorder_world_rank(2);
  CHECK_FALSE(find_failure_notice());
  post_failure_notice("injected fault (TRIAX_FAULT) on rank 2");
  CHECK_FALSE(find_failure_notice());  // its own
  set_flight_recorder_world_rank(0);
  const auto n = find_failure_notice();
  REQUIRE(n);
  CHECK(*n == "rank 2: injected fault (TRIAX_FAULT) on rank 2");
}

TEST_CASE("a rank that makes no progress dumps when another rank posts a failure", "[faults]") {
  FrDir d("triax_fr_notice_watchdog");
  auto fr = make_flight_recorder("nt", 0, 1, std::vector<int>{0, 1}, 16);
  fr->enqueued(CallInfo{0, "all_reduce", "float32 x 8, sum", -1}, DType::f32, 8);
  fr->started(0);  // waiting for rank 0, which failed by itself
  Watchdog w(0, 1);
  set_flight_recorder_world_rank(0);
  post_failure_notice("the error of rank 0");
  set_flight_recorder_world_rank(1);
  std::filesystem::remove(flight_recorder_path(1));
  for (int i = 0; i < 40 && !std::filesystem::exists(flight_recorder_path(1)); ++i) std::this_thread::sleep_for(100ms);
  REQUIRE(std::filesystem::exists(flight_recorder_path(1)));
  const auto j = d.dump(1);
  CHECK(j.at("reasons").back().get<std::string>() == "failure notice: rank 0: the error of rank 0");
  CHECK_FALSE(w.stalled());  // a dump only: ending the job is the failing rank's
  fr->ended(0, FrState::completed);
}

TEST_CASE("triax-fr names a rank that failed by itself; a failure it cannot explain is no all-clear", "[faults]") {
  const auto dir = (std::filesystem::temp_directory_path() / "triax_fr_own_failure").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  // Rank 2 threw before its next all-reduce; the others wait in it (their SIGTERM dumps).
  std::vector<std::string> paths;
  for (int r : {0, 1, 3}) paths.push_back(write_dump(dir, r, "\"SIGTERM\"", "started"));
  paths.push_back(write_dump(dir, 2, "\"error: injected fault (TRIAX_FAULT) on rank 2\"", ""));
  auto v = analyze_flight_records(paths);
  REQUIRE(v.findings.size() == 2);
  CHECK_THAT(v.findings[0], Contains("rank 2 (host h2) failed outside the communicators, while in iteration 3: "
                                     "injected fault (TRIAX_FAULT) on rank 2"));
  CHECK_THAT(v.findings[1], Contains("rank 2 never reached all_reduce #7"));
  CHECK(v.failed_ranks == std::vector<int>{0, 1, 2, 3});
  // Every rank timed out in the same call (a broken network, or the rank at fault holds no ring
  // of it): no rank is behind, but this is not "nothing wrong".
  paths.clear();
  for (int r : {0, 1, 2, 3})
    paths.push_back(write_dump(dir, r, "\"all_reduce #7 timed out on group 'dp'\", \"error: all_reduce #7 timed out\"",
                               "timed_out"));
  v = analyze_flight_records(paths);
  CHECK(v.findings.empty());
  CHECK(v.failed_ranks == std::vector<int>{0, 1, 2, 3});
  // SIGUSR2 and exit dumps of a healthy job report nothing.
  paths.clear();
  for (int r : {0, 1}) paths.push_back(write_dump(dir, r, "\"SIGUSR2\", \"exit\"", ""));
  v = analyze_flight_records(paths);
  CHECK(v.findings.empty());
  CHECK(v.failed_ranks.empty());
  std::filesystem::remove_all(dir);
}
