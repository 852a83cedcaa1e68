// The resource score: median normalisation (latency inverted), weights, straggler threshold,
// hostfile order, and errors for bad measurements and weights. Values worked out by hand.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "triax/core/error.h"
#include "triax/probe/score.h"
#include "unit/io_test_util.h"

using namespace triax;
using namespace triax::probe;
using Catch::Detail::Approx;

namespace {
// Four nodes: c is the slow one (half the compute, twice the latency).
std::vector<NodeMeasure> fixture() {
  return {
      {"a", 0, 100e9, 20e9, 10e-6, 1000, 2},
      {"b", 1, 120e9, 22e9, 8e-6, 1200, 2},
      {"c", 2, 50e9, 18e9, 20e-6, 800, 2},
      {"d", 3, 110e9, 21e9, 9e-6, 1100, 2},
  };
}
}  // namespace

TEST_CASE("median of odd and even counts", "[probe]") {
  CHECK(median({3, 1, 2}) == 2);
  CHECK(median({4, 1, 3, 2}) == 2.5);
  CHECK(median({7}) == 7);
  CHECK_THROWS_AS(median({}), ConfigError);
}

TEST_CASE("score = 0.4 compute + 0.3 memory + 0.2 latency + 0.1 iops against the medians", "[probe]") {
  const auto s = score_nodes(fixture());
  REQUIRE(s.size() == 4);
  // Medians: compute 105e9, memory 20.5e9, latency 9.5e-6, iops 1050.
  const double ca = 100.0 / 105, ma = 20.0 / 20.5, la = 9.5 / 10, ia = 1000.0 / 1050;
  CHECK(s[0].compute == Approx(ca).epsilon(1e-14));
  CHECK(s[0].latency == Approx(la).epsilon(1e-14));
  CHECK(s[0].score == Approx(0.4 * ca + 0.3 * ma + 0.2 * la + 0.1 * ia).epsilon(1e-14));
  const double sc = 0.4 * 50 / 105 + 0.3 * 18 / 20.5 + 0.2 * 9.5 / 20 + 0.1 * 800.0 / 1050;
  CHECK(s[2].score == Approx(sc).epsilon(1e-14));
  CHECK(sc < 0.8);
  CHECK(s[2].straggler);
  CHECK_FALSE(s[0].straggler);
  CHECK_FALSE(s[1].straggler);
  CHECK(s[1].score > s[3].score);
  CHECK(s[3].score > s[0].score);
}

TEST_CASE("weights are configurable and normalised by their sum", "[probe]") {
  const auto only_compute = score_nodes(fixture(), {1, 0, 0, 0});
  CHECK(only_compute[1].score == Approx(120.0 / 105).epsilon(1e-14));
  const auto doubled = score_nodes(fixture(), {0.8, 0.6, 0.4, 0.2});
  const auto base = score_nodes(fixture());
  for (size_t i = 0; i < base.size(); ++i) CHECK(doubled[i].score == Approx(base[i].score).epsilon(1e-14));
  // With latency weighted alone, c's doubled latency halves its term: 9.5 / 20.
  CHECK(score_nodes(fixture(), {0, 0, 1, 0}, 0.5)[2].score == Approx(0.475).epsilon(1e-14));
  CHECK(score_nodes(fixture(), {0, 0, 1, 0}, 0.5)[2].straggler);
  CHECK_THROWS_AS(score_nodes(fixture(), {-0.1, 0.5, 0.5, 0.1}), ConfigError);
  CHECK_THROWS_AS(score_nodes(fixture(), {0, 0, 0, 0}), ConfigError);
}

TEST_CASE("bad measurements are refused with the host and field", "[probe]") {
  auto f = fixture();
  f[1].read_iops = 0;
  try {
    score_nodes(f);
    FAIL("a zero IOPS measurement was accepted");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("node b") != std::string::npos);
    CHECK(std::string(e.what()).find("read_iops") != std::string::npos);
  }
  CHECK_THROWS_AS(score_nodes({}), ConfigError);
}

TEST_CASE("hostfile lists best hosts first, stragglers last or commented out", "[probe]") {
  const auto s = score_nodes(fixture());
  const std::string h = render_hostfile(s, false);
  const auto pb = h.find("\nb slots=2"), pd = h.find("\nd slots=2"), pa = h.find("\na slots=2"), pc = h.find("\nc slots=2");
  REQUIRE(pb != std::string::npos);
  REQUIRE(pc != std::string::npos);
  CHECK(pb < pd);
  CHECK(pd < pa);
  CHECK(pa < pc);
  CHECK(render_hostfile(s, true).find("\n# c slots=2") != std::string::npos);
  // Two ranks on one host: one line, slots added, the worse rank's score.
  auto two = fixture();
  two[3].host = "a";
  const std::string h2 = render_hostfile(score_nodes(two), false);
  CHECK(h2.find("\na slots=4") != std::string::npos);
}

TEST_CASE("JSON and Prometheus renderings carry the scores", "[probe]") {
  const auto s = score_nodes(fixture());
  const auto j = nlohmann::json::parse(render_json(s, {}, 0.8));
  CHECK(j["nodes"].size() == 4);
  CHECK(j["nodes"][2]["straggler"] == true);
  CHECK(j["nodes"][2]["score"].get<double>() == s[2].score);
  CHECK(j["weights"]["compute"] == 0.4);
  const std::string p = render_prometheus(s);
  CHECK(p.find("triax_probe_straggler{host=\"c\",rank=\"2\"} 1\n") != std::string::npos);
  CHECK(p.find("triax_probe_gemm_flops{host=\"b\",rank=\"1\"} 120000000000\n") != std::string::npos);
  CHECK(p.find("# TYPE triax_probe_score gauge") != std::string::npos);
}

namespace {
// The position of "\n<host> slots=" in a hostfile (npos when absent).
size_t line_of(const std::string& hostfile, const std::string& host) { return hostfile.find("\n" + host + " slots="); }

std::string message_of_read(const std::string& path) {
  try {
    read_forecast(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("read_forecast accepted " << path);
  return {};
}
}  // namespace

TEST_CASE("a forecast discounts the score: placement = score x (1 - predicted)", "[probe][forecast]") {
  auto s = score_nodes(fixture());
  // Without a forecast the placement is the score and b leads.
  for (const auto& x : s) CHECK(x.placement == x.score);
  CHECK(std::isnan(s[1].predicted));
  const std::string before = render_hostfile(s, false);
  REQUIRE(line_of(before, "b") < line_of(before, "d"));
  // b scores best but is predicted 90% busy; d scores below it (0.92x) with 10% predicted.
  REQUIRE(s[3].score < s[1].score);
  REQUIRE(s[3].score > 0.9 * s[1].score);
  apply_forecast(s, {{"a", 0.1}, {"b", 0.9}, {"c", 0.0}, {"d", 0.1}});
  CHECK(s[1].predicted == 0.9);
  CHECK(s[1].placement == Approx(s[1].score * 0.1).epsilon(1e-14));
  CHECK(s[3].placement == Approx(s[3].score * 0.9).epsilon(1e-14));
  CHECK(s[2].placement == s[2].score);
  const std::string after = render_hostfile(s, false);
  const size_t pd = line_of(after, "d"), pa = line_of(after, "a"), pb = line_of(after, "b"), pc = line_of(after, "c");
  REQUIRE(pc != std::string::npos);
  CHECK(pd < pa);
  CHECK(pa < pb);  // a: 0.96 x 0.9 beats b: 1.13 x 0.1
  CHECK(pb < pc);  // c is a straggler (by score): still last, though idle
  CHECK(after.find("predicted 0.900") != std::string::npos);
  CHECK(render_hostfile(s, true).find("\n# c slots=2") != std::string::npos);
}

TEST_CASE("renderings show predicted and placement only with a forecast", "[probe][forecast]") {
  auto s = score_nodes(fixture());
  CHECK(render_table(s).find("place") == std::string::npos);
  CHECK(nlohmann::json::parse(render_json(s, {}, 0.8))["nodes"][0].count("placement") == 0);
  CHECK(render_prometheus(s).find("triax_probe_placement") == std::string::npos);
  apply_forecast(s, {{"a", 0.5}, {"b", 0.25}, {"c", 0}, {"d", 1}});
  const std::string t = render_table(s);
  CHECK(t.find("pred") != std::string::npos);
  CHECK(t.find("place") != std::string::npos);
  const auto j = nlohmann::json::parse(render_json(s, {}, 0.8));
  CHECK(j["nodes"][0]["predicted_utilisation"] == 0.5);
  CHECK(j["nodes"][0]["placement"].get<double>() == s[0].placement);
  CHECK(j["nodes"][3]["placement"] == 0.0);
  CHECK(render_prometheus(s).find("triax_probe_placement{host=\"d\",rank=\"3\"} 0\n") != std::string::npos);
}

TEST_CASE("apply_forecast names every probed host the forecast lacks, ignores extra hosts", "[probe][forecast]") {
  auto s = score_nodes(fixture());
  try {
    apply_forecast(s, {{"a", 0.1}, {"c", 0.2}, {"zz", 0.3}});
    FAIL("a forecast without b and d was accepted");
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    CHECK(m.find("b, d") != std::string::npos);
    CHECK(m.find("re-run triax-forecast predict") != std::string::npos);
    CHECK(m.find("zz") == std::string::npos);
  }
  apply_forecast(s, {{"a", 0.1}, {"b", 0.2}, {"c", 0.3}, {"d", 0.4}, {"zz", 0.5}});
  CHECK(s[3].predicted == 0.4);
}

TEST_CASE("read_forecast parses triax-forecast predict --json and names bad files", "[probe][forecast]") {
  triax::test::TempDir dir;
  const std::string ok = dir.file("ok.json");
  triax::test::write_bytes(ok, R"({"model": "m.safetensors", "for_timestamp": 1, "nodes": [
      {"node": "n01", "predicted_utilisation": 0.73, "model_output": 0.4, "last_utilisation": 0.7},
      {"node": "n02", "predicted_utilisation": 0, "model_output": -2, "last_utilisation": 0.1},
      {"node": "n03", "predicted_utilisation": 1}]})");
  const Forecast f = read_forecast(ok);
  REQUIRE(f.size() == 3);
  CHECK(f.at("n01") == 0.73);
  CHECK(f.at("n02") == 0);
  CHECK(f.at("n03") == 1);
  const std::pair<const char*, const char*> bad[] = {
      {"{\"nodes\": [", "not JSON"},
      {"{\"nodes\": {}}", "no \"nodes\" array"},
      {"[1, 2]", "no \"nodes\" array"},
      {R"({"nodes": [{"predicted_utilisation": 0.5}]})", "nodes[0] has no \"node\""},
      {R"({"nodes": [{"node": "n01"}]})", "n01 has no number"},
      {R"({"nodes": [{"node": "n01", "predicted_utilisation": null}]})", "n01 has no number"},
      {R"({"nodes": [{"node": "n01", "predicted_utilisation": "0.5"}]})", "n01 has no number"},
      {R"({"nodes": [{"node": "n01", "predicted_utilisation": 1.5}]})", "1.5 is not in [0, 1]"},
      {R"({"nodes": [{"node": "n01", "predicted_utilisation": -0.1}]})", "-0.1 is not in [0, 1]"},
      {R"({"nodes": [{"node": "n01", "predicted_utilisation": 0.1}, {"node": "n01", "predicted_utilisation": 0.2}]})",
       "node n01 twice"},
  };
  for (const auto& [text, want] : bad) {
    const std::string path = dir.file("bad.json");
    triax::test::write_bytes(path, text);
    const std::string m = message_of_read(path);
    INFO(text << " -> " << m);
    CHECK(m.find(path) != std::string::npos);
    CHECK(m.find(want) != std::string::npos);
  }
  CHECK_THROWS_AS(read_forecast(dir.file("none.json")), IoError);
}
