// Time-line printing: the ASCII chart of a hand-derived 1F1B step, the Chrome trace's events and
// units, bubble statistics from generic (measured) events, and every bad-input path.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_sim.h"
#include "triax/pipeline/schedule_trace.h"

using namespace triax;
using Catch::Matchers::Contains;

TEST_CASE("ASCII time line of 1F1B p=2 m=2 (F=1, BW=2)", "[schedule][trace]") {
  // Stage 0: F0 [0,1] F1 [1,2] idle BW0 [4,6] idle BW1 [7,9]; stage 1: F0 [1,2] BW0 [2,4] F1 [4,5] BW1 [5,7].
  const Schedule s = make_1f1b(2, 2);
  const auto r = simulate_schedule(s);
  const auto events = timeline_events(s, r);
  REQUIRE(events.size() == 8);
  CHECK(events[0].name == "F0");
  CHECK(events[0].kind == "F");
  CHECK(events[2].name == "BW0");
  CHECK(events[2].kind == "BW");
  CHECK(events[2].start == 4.0);
  CHECK(events[2].duration == 2.0);
  CHECK(ascii_timeline(events, 2) ==
        "stage  0 |FF..BB.BB|\n"
        "   mb    |01  00 11|\n"
        "stage  1 |.FBBFBB..|\n"
        "   mb    | 000111  |\n"
        "one character = 1 time units; F forward, B backward (full or input-gradient), W weight gradient, lower case "
        "odd chunks, # other, . idle\n");
  AsciiOptions no_mb;
  no_mb.show_mb = false;
  no_mb.unit = 0.5;
  CHECK(ascii_timeline(events, 2, no_mb).rfind("stage  0 |FFFF....BBBB..BBBB|\nstage  1 |..FFBBBBFFBBBB....|\n", 0) == 0);
}

TEST_CASE("ASCII glyphs: W, odd chunks in lower case, other kinds, widening to fit", "[schedule][trace]") {
  std::vector<TimedEvent> ev = {{0, "F3.1", "F", 0, 1, 3, 1, true},   {0, "B3.1", "B", 1, 1, 3, 1, true},
                                {0, "W3.1", "W", 2, 1, 3, 1, true},   {0, "F4.0", "F", 3, 1, 4, 0, true},
                                {1, "wait", "wait", 0, 2, -1, -1, false}, {1, "BW2.1", "BW", 2, 2, 12, 1, true}};
  AsciiOptions o;
  o.show_mb = true;
  CHECK(ascii_timeline(ev, 2, o).rfind("stage  0 |fbwF|\n   mb    |3334|\nstage  1 |##bb|\n   mb    |  22|\n", 0) == 0);
  // 1000 time units do not fit in 10 characters: the unit grows to 100.
  std::vector<TimedEvent> long_ev = {{0, "F0", "F", 0, 1, 0, 0, true}, {0, "F1", "F", 999, 1, 1, 0, true}};
  o.max_width = 10;
  o.show_mb = false;
  const auto text = ascii_timeline(long_ev, 1, o);
  CHECK(text.rfind("stage  0 |..........|\n", 0) == 0);  // 1-unit events cover no cell midpoint at 100 units
  CHECK_THAT(text, Contains("one character = 100 time units"));
  CHECK(ascii_timeline({}, 3) == "(no events)\n");
}

TEST_CASE("Chrome trace: one complete event per timed event, microseconds, one named row per rank", "[schedule][trace]") {
  const Schedule s = make_interleaved_1f1b(2, 2, 2);
  const auto events = timeline_events(s, simulate_schedule(s));
  const auto doc = nlohmann::json::parse(chrome_trace_json(events, 1000.0));
  REQUIRE(doc.contains("traceEvents"));
  CHECK(doc["displayTimeUnit"] == "ms");
  size_t complete = 0;
  std::set<int> named;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") {
      named.insert(e["tid"].get<int>());
      CHECK(e["args"]["name"] == fmt::format("stage {}", e["tid"].get<int>()));
    }
    if (e["ph"] != "X") continue;
    const auto& src = events[complete++];
    CHECK(e["name"] == src.name);
    CHECK(e["cat"] == src.kind);
    CHECK(e["pid"] == 0);
    CHECK(e["tid"] == src.rank);
    CHECK(e["ts"].get<double>() == Approx(src.start * 1000.0));
    CHECK(e["dur"].get<double>() == Approx(src.duration * 1000.0));
    CHECK(e["args"]["mb"] == src.mb);
    CHECK(e["args"]["chunk"] == src.chunk);
  }
  CHECK(complete == events.size());
  CHECK(complete == 2 * 2 * 2 * 2);  // p * m * v * (F, BW)
  CHECK(named == std::set<int>{0, 1});
  // Measured times in seconds become microseconds with us_per_unit = 1e6.
  const auto measured = nlohmann::json::parse(chrome_trace_json({{3, "F0", "F", 0.5, 0.25, 0, 0, true}}, 1e6));
  const auto& last = measured["traceEvents"].back();
  CHECK(last["ts"].get<double>() == Approx(500000.0));
  CHECK(last["dur"].get<double>() == Approx(250000.0));
  CHECK(last["tid"] == 3);
  CHECK(measured["traceEvents"].size() == 1 + 2 * 4 + 1);  // process name, 4 rows x (name, sort), the event
}

TEST_CASE("write_chrome_trace writes the file and names it when it cannot", "[schedule][trace]") {
  std::mt19937 rng(std::random_device{}());
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("triax_trace_{}", rng());
  std::filesystem::create_directories(dir);
  const auto path = (dir / "t.json").string();
  const std::vector<TimedEvent> ev = {{0, "F0", "F", 0, 1, 0, 0, true}, {1, "F0", "F", 1, 1, 0, 0, true}};
  write_chrome_trace(path, ev, 1.0);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str() == chrome_trace_json(ev, 1.0) + "\n");
  std::filesystem::remove_all(dir);
  CHECK_THROWS_AS(write_chrome_trace((dir / "missing" / "t.json").string(), ev, 1.0), IoError);
  CHECK_THROWS_WITH(write_chrome_trace((dir / "missing" / "t.json").string(), ev, 1.0), Contains("missing/t.json"));
}

TEST_CASE("bubble_stats from measured events", "[schedule][trace]") {
  // Rank 0 busy 3 of [1, 7]; rank 1 busy 4 (a 1-unit wait does not count); rank 2 has no events.
  const std::vector<TimedEvent> ev = {{0, "F0", "F", 1, 1, 0, 0, true},   {0, "BW0", "BW", 5, 2, 0, 0, true},
                                      {1, "F0", "F", 2, 2, 0, 0, true},   {1, "wait", "wait", 4, 1, -1, -1, false},
                                      {1, "BW0", "BW", 5, 2, 0, 0, true}};
  const auto b = bubble_stats(ev, 3);
  CHECK(b.makespan == 6.0);
  CHECK(b.busy == std::vector<double>{3.0, 4.0, 0.0});
  CHECK(b.idle == std::vector<double>{3.0, 2.0, 6.0});
  CHECK(b.ratio(0) == 1.0);
  CHECK(b.ratio(1) == 0.5);
  CHECK(b.ratio(2) == 0.0);  // nothing computed: reported as 0, not infinity
  CHECK(b.of_makespan(0) == 0.5);
  CHECK(b.ratio() == Approx(11.0 / 7.0));
  CHECK(b.of_makespan() == Approx(11.0 / 18.0));
  // The simulated events give the simulator's own statistics.
  const Schedule s = make_zb_h1(3, 5);
  const auto r = simulate_schedule(s);
  const auto from_events = bubble_stats(timeline_events(s, r), 3);
  CHECK(from_events.makespan == r.bubble.makespan);
  CHECK(from_events.idle == r.bubble.idle);
}

TEST_CASE("bad events and options are refused", "[schedule][trace]") {
  const std::vector<TimedEvent> bad_rank = {{5, "F0", "F", 0, 1, 0, 0, true}};
  CHECK_THROWS_WITH(bubble_stats(bad_rank, 2), Contains("timed event 'F0' is on rank 5, expected 0 <= rank < 2"));
  CHECK_THROWS_WITH(ascii_timeline(bad_rank, 2), Contains("is on rank 5"));
  const std::vector<TimedEvent> negative = {{0, "F0", "F", 0, -1, 0, 0, true}};
  CHECK_THROWS_WITH(bubble_stats(negative, 1), Contains("duration -1, expected a finite start and a duration >= 0"));
  CHECK_THROWS_WITH(chrome_trace_json(negative, 1.0), Contains("duration >= 0"));
  CHECK_THROWS_WITH(chrome_trace_json({{-1, "F0", "F", 0, 1, 0, 0, true}}, 1.0), Contains("on rank -1"));
  CHECK_THROWS_WITH(chrome_trace_json({}, 0.0), Contains("microseconds per unit must be > 0, got 0"));
  CHECK_THROWS_WITH(bubble_stats({}, 0), Contains("at least one rank, got 0"));
  CHECK_THROWS_WITH(ascii_timeline({}, 0), Contains("at least one rank, got 0"));
  AsciiOptions o;
  o.max_width = 0;
  CHECK_THROWS_WITH(ascii_timeline({}, 1, o), Contains("max_width must be >= 1, got 0"));
}
