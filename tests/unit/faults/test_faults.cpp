// TRIAX_FAULT parsing, the loss spike and straggler detectors, the flight recorder's ring and the
// triax-fr analysis of hand-made dumps (a rank behind, a dead rank, a mismatch).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "triax/distributed/comm/comm.h"
#include "triax/distributed/failure/flight_recorder.h"
#include "triax/faults/fault_checks.h"
#include "triax/faults/fault_injection.h"

using namespace triax;
using Catch::Matchers::Contains;

TEST_CASE("TRIAX_FAULT entries parse; bad ones are named", "[faults]") {
  const auto f = parse_faults("2:3:kill,0:1:slow:300,1:2:nan");
  REQUIRE(f.size() == 3);
  CHECK(f[0].rank == 2);
  CHECK(f[0].iteration == 3);
  CHECK(f[0].kind == FaultKind::kill);
  CHECK(f[1].kind == FaultKind::slow);
  CHECK(f[1].ms == 300);
  CHECK(f[2].kind == FaultKind::nan);
  CHECK(parse_faults("").empty());
  CHECK_THROWS_WITH(parse_faults("2:3:explode"), Contains("'2:3:explode': unknown kind 'explode'"));
  CHECK_THROWS_WITH(parse_faults("2:3"), Contains("expected RANK:ITERATION:KIND"));
  CHECK_THROWS_WITH(parse_faults("2:0:kill"), Contains("iteration='0' is out of range; expected an integer in [1,"));
  CHECK_THROWS_WITH(parse_faults("x:1:kill"), Contains("rank='x' is not an integer"));
  CHECK_THROWS_WITH(parse_faults("1:1:slow"), Contains("slow needs milliseconds"));
  CHECK_THROWS_WITH(parse_faults("1:1:kill:5"), Contains("kill takes no argument"));
  const FaultInjector mine(parse_faults("1:2:nan,3:2:nan"), 1);
  CHECK(mine.nan_due(2));
  CHECK_FALSE(mine.nan_due(3));
  CHECK_FALSE(FaultInjector(parse_faults("3:2:nan"), 1).nan_due(2));
  CHECK_THROWS_WITH(FaultInjector(parse_faults("1:2:throw"), 1).at_step_start(2), Contains("rank 1 at iteration 2"));
  CHECK_NOTHROW(FaultInjector(parse_faults("1:2:throw"), 1).at_step_start(3));
}

TEST_CASE("loss spike detector: z-score over the window", "[faults]") {
  LossSpikeDetector d(4.0, 32, 8);
  for (int i = 0; i < 8; ++i) CHECK(std::isnan(d.update(2.0 + 0.01 * (i % 2))));
  const double z_normal = d.update(2.005);
  CHECK(std::abs(z_normal) < 1.0);
  CHECK_FALSE(d.spike(z_normal));
  const double z = d.update(3.0);
  CHECK(z > 50);
  CHECK(d.spike(z));
  CHECK_FALSE(LossSpikeDetector(0.0).spike(100.0));  // 0: off
}

TEST_CASE("straggler detector: persistent factor over the median", "[faults]") {
  StragglerDetector s(1.2, 3);
  const double times[4] = {0.10, 0.11, 0.10, 0.40};
  CHECK(s.update(times).empty());
  CHECK(s.update(times).empty());
  const auto fresh = s.update(times);
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0] == 3);
  CHECK(s.stragglers() == std::vector<int>{3});
  CHECK(s.update(times).empty());  // reported once
  const double even[4] = {0.10, 0.11, 0.10, 0.105};
  s.update(even);
  CHECK(s.stragglers().empty());
  const double blip[4] = {0.10, 0.11, 0.10, 0.40};  // one slow iteration is no straggler
  CHECK(s.update(blip).empty());
  StragglerDetector tiny(1.2, 1);  // 1.5x of a 10 ms step is timer noise, not a straggler
  const double small[4] = {0.010, 0.010, 0.010, 0.015};
  CHECK(tiny.update(small).empty());
}

TEST_CASE("slow device class: the stragglers are exactly one class's ranks", "[faults]") {
  const std::vector<std::string> cls{"fast", "fast", "slow", "slow"};
  const double busy[4] = {0.10, 0.12, 0.30, 0.26};
  const std::vector<int> both{2, 3};
  const auto s = slow_device_class(busy, both, cls);
  REQUIRE(s.has_value());
  CHECK(s->name == "slow");
  CHECK(s->ranks == both);
  CHECK(s->ratio == Approx(0.28 / 0.11));
  // One rank of the class is no class verdict (a rank, not the class, is slow) ...
  CHECK_FALSE(slow_device_class(busy, std::vector<int>{2}, cls).has_value());
  // ... nor are stragglers of two classes, or a job of one class.
  CHECK_FALSE(slow_device_class(busy, std::vector<int>{1, 2, 3}, cls).has_value());
  CHECK_FALSE(slow_device_class(busy, both, std::vector<std::string>(4, "default")).has_value());
  CHECK_FALSE(slow_device_class(busy, std::vector<int>{}, cls).has_value());
}

TEST_CASE("flight recorder ring keeps the last N calls in order", "[faults]") {
  FlightRecorder fr("dp", 0, 0, {0, 1}, 4);
  for (uint64_t s = 0; s < 6; ++s) fr.enqueued(CallInfo{s, "all_reduce", "float32 x 8, sum", -1}, DType::f32, 8);
  fr.started(4);
  fr.ended(5, FrState::completed);
  fr.ended(0, FrState::completed);  // evicted: ignored
  const auto e = fr.entries();
  REQUIRE(e.size() == 4);
  CHECK(e.front().seq == 2);
  CHECK(e.back().seq == 5);
  CHECK(e[2].state == FrState::started);
  CHECK(e[3].state == FrState::completed);
  CHECK(e[3].end_us >= e[3].enqueue_us);
}

namespace {
std::string write_dump(const std::string& dir, int rank, const std::string& calls, const std::string& phase) {
  const std::string p = dir + "/triax_fr_rank" + std::to_string(rank) + ".json";
  std::ofstream(p) << "{\"rank\":" << rank << ",\"host\":\"h\",\"phase\":\"" << phase
                   << "\",\"reasons\":[\"test\"],\"groups\":[{\"name\":\"dp\",\"group_rank\":" << rank
                   << ",\"world_ranks\":[0,1,2,3],\"calls\":[" << calls << "]}]}";
  return p;
}
std::string call(int seq, const char* state, const char* detail = "float32 x 8, sum") {
  return "{\"seq\":" + std::to_string(seq) + ",\"op\":\"all_reduce\",\"detail\":\"" + detail + "\",\"state\":\"" +
         state + "\"}";
}
}  // namespace

TEST_CASE("triax-fr analysis: the rank behind, the dead rank, the mismatch", "[faults]") {
  const auto dir = (std::filesystem::temp_directory_path() / "triax_fr_unit").string();
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<std::string> paths;
  for (int r : {0, 1, 3}) paths.push_back(write_dump(dir, r, call(6, "completed") + "," + call(7, "started"), "x"));
  paths.push_back(write_dump(dir, 2, call(6, "completed"), "iteration 3: hang"));
  auto v = analyze_flight_records(paths);
  REQUIRE(v.findings.size() == 1);
  CHECK_THAT(v.findings[0], Contains("rank 2 never reached all_reduce #7") && Contains("group 'dp'") &&
                                Contains("ranks [0,1,3] wait in it") && Contains("iteration 3: hang"));
  // Rank 2 left no dump at all.
  paths.pop_back();
  v = analyze_flight_records(paths);
  REQUIRE(v.findings.size() == 1);
  CHECK_THAT(v.findings[0], Contains("rank 2 left no dump"));
  // Different sizes at the same number.
  paths.clear();
  for (int r : {0, 1, 2, 3}) paths.push_back(write_dump(dir, r, call(3, "completed", r == 1 ? "float32 x 9, sum" : "float32 x 8, sum"), ""));
  v = analyze_flight_records(paths);
  REQUIRE(v.findings.size() == 1);
  CHECK_THAT(v.findings[0], Contains("#3: rank 0 called all_reduce (float32 x 8, sum) but rank 1 called all_reduce (float32 x 9, sum)"));
  std::ofstream(dir + "/bad.json") << "{";
  CHECK_THROWS_WITH(analyze_flight_records({dir + "/bad.json"}), Contains("bad.json: not a triax flight-recorder dump"));
  std::filesystem::remove_all(dir);
}
