// The timeline recorder (core/trace.h): nothing recorded while off; spans on their lanes while on;
// overlapping spans of one lane spread over rows that each nest properly; the JSON names every
// row and the process; the merge keeps every file's events and refuses a file that is not a trace.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "triax/core/error.h"
#include "triax/core/trace.h"

using namespace triax;
using nlohmann::json;

TEST_CASE("trace spans are recorded only while on, with their step", "[core][trace]") {
  trace::stop();
  trace::start();
  trace::stop();
  { trace::Span s(trace::Lane::compute, "off"); }
  CHECK(trace::events().empty());
  trace::start();
  trace::set_step(7);
  { trace::Span s(trace::Lane::p2p, "wait recv activation", 3, 0, 2048); }
  trace::record(trace::Lane::compute, "forward mb 3", 10, 25, 3, 0);
  trace::stop();
  trace::set_step(-1);
  const auto ev = trace::events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].lane == trace::Lane::p2p);
  CHECK(ev[0].bytes == 2048);
  CHECK(ev[0].step == 7);
  CHECK(ev[0].dur_us >= 0);
  CHECK(ev[1].dur_us == 15);
}

TEST_CASE("trace JSON puts overlapping spans of one lane on rows that nest", "[core][trace]") {
  std::vector<trace::Event> ev;
  ev.push_back({trace::Lane::dp, "bucket 0", 0, 100});
  ev.push_back({trace::Lane::dp, "bucket 1", 50, 100});   // overlaps bucket 0 without nesting
  ev.push_back({trace::Lane::dp, "inner", 10, 20});       // nests inside bucket 0
  ev.push_back({trace::Lane::dp, "later", 200, 10});      // after both
  ev.push_back({trace::Lane::compute, "forward mb 0", 0, 30, 0, 0});
  const json doc = json::parse(trace::to_json(ev, 3, "rank 3 (tp 0, pp 3, dp 0)"));
  std::map<std::string, int> tid;
  std::map<int, std::string> row_name;
  std::string process;
  for (const auto& e : doc.at("traceEvents")) {
    CHECK(e.at("pid") == 3);
    if (e.at("ph") == "X") tid[e.at("name").get<std::string>()] = e.at("tid").get<int>();
    if (e.at("ph") == "M" && e.at("name") == "thread_name") row_name[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("ph") == "M" && e.at("name") == "process_name") process = e.at("args").at("name");
  }
  CHECK(process == "rank 3 (tp 0, pp 3, dp 0)");
  CHECK(tid["bucket 0"] == tid["inner"]);
  CHECK(tid["bucket 1"] != tid["bucket 0"]);
  CHECK(tid["later"] == tid["bucket 0"]);
  CHECK(row_name[tid["bucket 0"]] == "dp");
  CHECK(row_name[tid["bucket 1"]] == "dp 2");
  CHECK(row_name[tid["forward mb 0"]] == "compute");
}

TEST_CASE("trace merge keeps every rank's events and names a bad file", "[core][trace]") {
  const auto dir = std::filesystem::temp_directory_path() / ("triax_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<std::string> files;
  for (int r = 0; r < 3; ++r) {
    files.push_back((dir / ("trace_rank" + std::to_string(r) + ".json")).string());
    trace::write_file(files.back(), trace::to_json({{trace::Lane::compute, "forward mb 0", 1.0 * r, 5}}, r,
                                                   "rank " + std::to_string(r)));
  }
  const json merged = json::parse(trace::merge_files(files, R"({"pp": 3})"));
  std::map<int, int> spans;
  for (const auto& e : merged.at("traceEvents"))
    if (e.at("ph") == "X") ++spans[e.at("pid").get<int>()];
  CHECK(spans == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}});
  CHECK(merged.at("otherData").at("pp") == 3);
  trace::write_file(files[1], "not json");
  CHECK_THROWS_WITH(trace::merge_files(files, ""), Catch::Matchers::Contains("trace_rank1.json is not a Chrome trace"));
  std::filesystem::remove(files[2]);
  CHECK_THROWS_AS(trace::merge_files({files[0], files[2]}, ""), IoError);
  std::filesystem::remove_all(dir);
}
