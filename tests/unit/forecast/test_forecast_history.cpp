// The forecaster's history (forecast/history.h): the CSV reader on a good file and on each kind
// of bad input, the 24-hour windows, the scaler and the baselines on hand-built numbers, and the
// Prometheus client against an in-process cpp-httplib server serving canned query_range answers.
#include <catch2/catch.hpp>
#if defined(TRIAX_HAVE_HTTP)
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <mutex>
#include <thread>
#endif

#include <cmath>
#include <string>
#include <vector>

#include "triax/core/error.h"
#include "triax/forecast/history.h"
#include "unit/io_test_util.h"

using namespace triax;
using namespace triax::forecast;
using Catch::Matchers::Contains;

namespace {

constexpr int64_t kT0 = 1795611600;  // 2026-11-25T13:00:00Z
const std::string kHeaderLine = "timestamp,node,compute,memory_bw,latency,iops\n";

// The message of the E that f throws; fails the test when it throws nothing (another type escapes).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("no exception thrown");
  return {};
}

std::string csv_error(const test::TempDir& dir, const std::string& text) {
  const std::string path = dir.file("h.csv");
  test::write_bytes(path, text);
  return message_of<IoError>([&] { read_csv(path); });  // malformed data: exit 3 (docs/ERRORS.md)
}

}  // namespace

TEST_CASE("read_csv reads unordered rows with both timestamp forms, nodes sorted", "[forecast][csv]") {
  test::TempDir dir;
  const std::string path = dir.file("h.csv");
  test::write_bytes(path, " timestamp , node,compute,memory_bw,latency,iops \r\n"
                          "1795615200,n02,0.25,0.5,0.001,100\n"
                          "2026-11-25T13:00:00Z, n01 ,0.5,0.75,2e-3,250\n"
                          "\n"
                          "2026-11-25T13:00:00Z,n02,0.125,0.5,0.001,90\r\n"
                          "1795615200,n01,0.625,0.7,0.003,260\n");
  const History h = read_csv(path);
  CHECK(h.source == path);
  REQUIRE(h.nodes.size() == 2);
  CHECK(h.nodes[0].node == "n01");
  CHECK(h.nodes[1].node == "n02");
  for (const auto& n : h.nodes) {
    CHECK(n.start == kT0);
    CHECK(n.rows.size() == 2);
    CHECK(n.end() == kT0 + 2 * kHour);
  }
  CHECK(h.nodes[0].rows[0] == Row{0.5, 0.75, 2e-3, 250});
  CHECK(h.nodes[0].rows[1] == Row{0.625, 0.7, 0.003, 260});
  CHECK(h.nodes[1].rows[0] == Row{0.125, 0.5, 0.001, 90});
  CHECK(h.nodes[1].rows[1] == Row{0.25, 0.5, 0.001, 100});
}

TEST_CASE("read_csv names the line and the problem of each bad input", "[forecast][csv]") {
  test::TempDir dir;
  const std::string row0 = "1795611600,n01,0.5,0.5,0.001,100\n";
  CHECK_THAT(csv_error(dir, ""), Contains("h.csv: no header line"));
  CHECK_THAT(csv_error(dir, "time,node,compute,memory_bw,latency,iops\n" + row0),
             Contains("h.csv:1: header must be 'timestamp,node,compute,memory_bw,latency,iops'"));
  CHECK_THAT(csv_error(dir, row0), Contains("h.csv:1: header must be"));
  CHECK_THAT(csv_error(dir, kHeaderLine + row0 + "1795615200,n01,0.5,0.5,0.001\n"),
             Contains("h.csv:3: expected 6 columns, got 5"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600,n01,0.5,0.5,0.001,100,7\n"),
             Contains("h.csv:2: expected 6 columns, got 7"));
  // '#' comments and blank lines are skipped, as in every CSV table of the project.
  CHECK_NOTHROW(read_csv([&] {
    const std::string path = dir.file("c.csv");
    test::write_bytes(path, "# exported by hand\n" + kHeaderLine + "\n" + row0);
    return path;
  }()));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600,n01,0.5,abc,0.001,100\n"),
             Contains("h.csv:2: memory_bw 'abc' is not a number"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600,n01,0.5,0.5,0.001,100x\n"),
             Contains("h.csv:2: iops '100x' is not a number"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600,n01,nan,0.5,0.001,100\n"), Contains("h.csv:2: compute is NaN"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600,n01,0.5,0.5,-inf,100\n"),
             Contains("h.csv:2: latency '-inf' is infinite"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795613400,n01,0.5,0.5,0.001,100\n"),
             Contains("h.csv:2: timestamp '1795613400' (2026-11-25T13:30:00Z) is not on the hour"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "2026-02-30T00:00:00Z,n01,0.5,0.5,0.001,100\n"),
             Contains("h.csv:2: timestamp '2026-02-30T00:00:00Z' is neither unix seconds nor ISO 8601"));
  CHECK_THAT(csv_error(dir, kHeaderLine + row0 + "2026-11-25T13:00:00Z,n01,0.1,0.5,0.001,100\n"),
             Contains("h.csv:3: node 'n01' hour 2026-11-25T13:00:00Z repeats line 2"));
  CHECK_THAT(csv_error(dir, kHeaderLine + row0 + "1795622400,n01,0.5,0.5,0.001,100\n"),
             Contains("h.csv:3: node 'n01' has a gap: 2 hour(s) missing from 2026-11-25T14:00:00Z to "
                      "2026-11-25T15:00:00Z"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "1795611600, ,0.5,0.5,0.001,100\n"), Contains("h.csv:2: empty node name"));
  CHECK_THAT(csv_error(dir, kHeaderLine + "\n"), Contains("h.csv: no data rows"));
  const std::string missing = dir.file("absent.csv");
  CHECK_THAT(message_of<IoError>([&] { read_csv(missing); }), Contains(missing + ": cannot open the history CSV: No such file or directory"));
  CHECK_THAT(message_of<IoError>([&] { read_csv(dir.path().string()); }), Contains("it is a directory"));
}

namespace {

// Node `name` from `start`: hour k has compute 0.01 k, memory_bw 2 k, latency 3 (constant), iops k^2.
NodeSeries ramp(std::string name, int64_t start, int rows) {
  NodeSeries n{std::move(name), start, {}};
  for (int k = 0; k < rows; ++k) n.rows.push_back(Row{0.01 * k, 2.0 * k, 3.0, 1.0 * k * k});
  return n;
}

}  // namespace

TEST_CASE("Scaler::fit: mean and population std of the rows before the split", "[forecast][scaler]") {
  History h{{ramp("a", kT0, 5), ramp("b", kT0 + kHour, 5)}, "test"};
  // Before kT0 + 3h: a's hours 0, 1, 2 and b's hours 0, 1 (k = 0, 1, 2 and 0, 1).
  const Scaler s = Scaler::fit(h, kT0 + 3 * kHour);
  const double mean_k = (0 + 1 + 2 + 0 + 1) / 5.0;
  const double var_k = ((0 - mean_k) * (0 - mean_k) * 2 + (1 - mean_k) * (1 - mean_k) * 2 + (2 - mean_k) * (2 - mean_k)) / 5;
  CHECK(s.mean[0] == Approx(0.01 * mean_k));
  CHECK(s.std[0] == Approx(0.01 * std::sqrt(var_k)));
  CHECK(s.mean[1] == Approx(2 * mean_k));
  CHECK(s.std[1] == Approx(2 * std::sqrt(var_k)));
  CHECK(s.mean[2] == 3.0);
  CHECK(s.std[2] == 1.0);  // constant
  CHECK(s.mean[3] == Approx((0 + 1 + 4 + 0 + 1) / 5.0));
  CHECK(s.standardise(0.02, 0) == Approx((0.02 - s.mean[0]) / s.std[0]));
  CHECK(s.target_from_standard(s.standardise(0.3, 0)) == Approx(0.3));
  CHECK_THAT(message_of<IoError>([&] { Scaler::fit(h, kT0); }), Contains("nothing to fit"));
}

TEST_CASE("make_windows: 24 standardised hours, the next hour's target and the baselines", "[forecast][windows]") {
  // a: 26 rows from kT0 (targets kT0+24h, kT0+25h); b: 25 rows from kT0+1h (target kT0+25h); c: too short.
  History h{{ramp("a", kT0, 26), ramp("b", kT0 + kHour, 25), ramp("c", kT0, 10)}, "test"};
  Scaler s;
  s.mean = {0.1, 1, 2, 3};
  s.std = {0.5, 2, 4, 8};
  const int64_t split = kT0 + 25 * kHour;
  CHECK(holdout_start(h) == kT0 + 26 * kHour - 24 * kHour);
  const WindowSplit w = make_windows(h, s, split);
  REQUIRE(w.train.count == 1);
  REQUIRE(w.holdout.count == 2);
  CHECK(w.train.node == std::vector<std::string>{"a"});
  CHECK(w.holdout.node == std::vector<std::string>{"a", "b"});
  CHECK(w.train.target_time == std::vector<int64_t>{kT0 + 24 * kHour});
  CHECK(w.holdout.target_time == std::vector<int64_t>{kT0 + 25 * kHour, kT0 + 25 * kHour});
  REQUIRE(w.holdout.x.size() == 2 * 24 * 4);
  REQUIRE(w.holdout.y.size() == 2);
  // holdout window 0: node a, rows 1..24 predicting row 25.
  for (int j = 0; j < 24; ++j)
    for (int f = 0; f < 4; ++f) {
      const double raw = h.nodes[0].rows[1 + j][f];
      CHECK(w.holdout.x[j * 4 + f] == Approx(static_cast<float>((raw - s.mean[f]) / s.std[f])));
    }
  CHECK(w.holdout.target[0] == Approx(0.25));
  CHECK(w.holdout.y[0] == Approx((0.25 - 0.1) / 0.5));
  CHECK(w.holdout.persistence[0] == Approx(0.24));
  CHECK(w.holdout.seasonal[0] == Approx(0.01));
  CHECK(w.train.target[0] == Approx(0.24));
  CHECK(w.train.persistence[0] == Approx(0.23));
  CHECK(w.train.seasonal[0] == Approx(0.0));
  CHECK(w.train.x[23 * 4 + 1] == Approx((2.0 * 23 - 1) / 2));  // the window's last hour, memory_bw
}

TEST_CASE("latest_windows: the last 24 hours of each node, predicting the hour at end()", "[forecast][windows]") {
  History h{{ramp("a", kT0, 30), ramp("b", kT0 + 2 * kHour, 24)}, "test"};
  Scaler s;
  s.mean = {0, 0, 0, 0};
  s.std = {1, 1, 1, 1};
  const Windows w = latest_windows(h, s);
  REQUIRE(w.count == 2);
  CHECK(w.target_time == std::vector<int64_t>{kT0 + 30 * kHour, kT0 + 26 * kHour});
  CHECK(std::isnan(w.target[0]));
  CHECK(w.y == std::vector<float>{0, 0});
  CHECK(w.persistence[0] == Approx(0.29));
  CHECK(w.seasonal[0] == Approx(0.06));
  CHECK(w.x[0 * 4 + 3] == Approx(36.0));             // a's row 6, iops 6^2
  CHECK(w.x[24 * 4 + 23 * 4 + 0] == Approx(0.23));   // b's row 23, compute
  h.nodes.push_back(ramp("c", kT0, 23));
  CHECK_THAT(message_of<IoError>([&] { latest_windows(h, s); }), Contains("'c' (23 hours)"));
}

TEST_CASE("require_hours names every short node and the purpose", "[forecast]") {
  History h{{ramp("n01", kT0, 12), ramp("n02", kT0, 48), ramp("n03", kT0, 0)}, "hist.csv"};
  const std::string msg = message_of<IoError>([&] { require_hours(h, 48, "train"); });
  CHECK_THAT(msg, Contains("train needs at least 48 hours") && Contains("'n01' (12 hours)") &&
                      Contains("'n03' (0 hours)") && Contains("hist.csv"));
  CHECK_THAT(msg, !Contains("n02"));
  CHECK_NOTHROW(require_hours(h, 0, "train"));
  CHECK_THROWS_AS(require_hours(History{{}, "x"}, 1, "predict"), IoError);
}

TEST_CASE("error_stats: MAE and RMSE, refused for different lengths or none", "[forecast]") {
  const std::vector<double> pred{1, 2, 3}, truth{2, 2, 5};
  const ErrorStats e = error_stats(pred, truth);
  CHECK(e.n == 3);
  CHECK(e.mae == Approx(1.0));
  CHECK(e.rmse == Approx(std::sqrt(5.0 / 3)));
  CHECK_THROWS_AS(error_stats(std::span(pred).first(2), truth), ConfigError);
  CHECK_THROWS_AS(error_stats({}, {}), ConfigError);
}

TEST_CASE("utc_hour_string and the queries", "[forecast]") {
  CHECK(utc_hour_string(kT0) == "2026-11-25T13:00:00Z");
  CHECK(utc_hour_string(0) == "1970-01-01T00:00:00Z");
  PrometheusSource src = default_prometheus_source("http://p:9090");
  CHECK(src.url == "http://p:9090");
  CHECK(src.queries[0] == "avg by (host) (avg_over_time(triax_node_compute_utilisation[1h]))");
  CHECK(src.queries[3] == "avg by (host) (avg_over_time(triax_probe_read_iops[1h]))");
  set_query(src, "latency = max by (host) (x{a=\"b\"})");
  CHECK(src.queries[2] == "max by (host) (x{a=\"b\"})");
  CHECK_THAT(message_of<ConfigError>([&] { set_query(src, "cpu=up"); }),
             Contains("query 'cpu=up'") && Contains("compute, memory_bw, latency, iops"));
  CHECK_THROWS_AS(set_query(src, "compute"), ConfigError);
  CHECK_THROWS_AS(set_query(src, "compute= "), ConfigError);
  for (const char* bad : {"https://p:9090", "p:9090", "http://", "http://p:0", "http://p:x"})
    CHECK_THAT(message_of<ConfigError>([&] { query_prometheus(default_prometheus_source(bad), kT0, kT0); }),
               Contains(std::string("Prometheus URL '") + bad + "'"));
  CHECK_THAT(message_of<ConfigError>([&] { query_prometheus(src, kT0 + 1, kT0 + kHour); }), Contains("whole hours"));
}

#if defined(TRIAX_HAVE_HTTP)
namespace {

// An in-process Prometheus stand-in: /prom/api/v1/query_range answered by `answer`.
class FakePrometheus {
 public:
  using Answer = std::function<void(const httplib::Request&, httplib::Response&)>;
  explicit FakePrometheus(Answer answer) : answer_(std::move(answer)) {
    svr_.Get("/prom/api/v1/query_range", [this](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(req.params);
      }
      answer_(req, res);
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
  }
  ~FakePrometheus() {
    svr_.stop();
    thread_.join();
  }
  PrometheusSource source() const {
    PrometheusSource s = default_prometheus_source("http://127.0.0.1:" + std::to_string(port_) + "/prom/");
    for (int f = 0; f < kFeatures; ++f) set_query(s, std::string(kFeatureNames[f]) + "=q" + std::to_string(f));
    s.timeout_s = 5;
    return s;
  }
  std::vector<httplib::Params> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  Answer answer_;
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mu_;
  std::vector<httplib::Params> requests_;
};

struct Series {
  std::string metric;                                     // JSON object of labels
  std::vector<std::pair<int64_t, std::string>> values;    // [time, "value"]
};

std::string matrix(const std::vector<Series>& series, const std::string& type = "matrix") {
  std::string r;
  for (const auto& s : series) {
    std::string v;
    for (const auto& [t, x] : s.values) v += fmt::format("{}[{},\"{}\"]", v.empty() ? "" : ",", t, x);
    r += fmt::format("{}{{\"metric\":{},\"values\":[{}]}}", r.empty() ? "" : ",", s.metric, v);
  }
  return fmt::format(R"({{"status":"success","data":{{"resultType":"{}","result":[{}]}}}})", type, r);
}

int feature_of(const httplib::Request& req) { return std::stoi(req.get_param_value("query").substr(1)); }

// Node n (0 or 1) at hour k of feature f: 10 f + n + 0.1 k.
std::string good_value(int f, int n, int k) { return fmt::format("{}", 10 * f + n + 0.1 * k); }

// Two nodes (answered n02 first) x 3 hours from kT0 for every feature; `edit` may spoil one answer.
FakePrometheus::Answer good_answer(std::function<void(int, std::vector<Series>&)> edit = nullptr) {
  return [edit](const httplib::Request& req, httplib::Response& res) {
    const int f = feature_of(req);
    std::vector<Series> s;
    for (int n : {1, 0}) {
      Series one{fmt::format(R"({{"host":"n0{}","job":"x"}})", n + 1), {}};
      for (int k = 0; k < 3; ++k) one.values.emplace_back(kT0 + k * kHour, good_value(f, n, k));
      s.push_back(one);
    }
    if (edit) edit(f, s);
    res.set_content(matrix(s), "application/json");
  };
}

std::string prom_config_error(FakePrometheus::Answer answer) {
  FakePrometheus p(std::move(answer));
  return message_of<IoError>([&] { query_prometheus(p.source(), kT0, kT0 + 2 * kHour); });
}

}  // namespace

TEST_CASE("query_prometheus reads a matrix per feature into sorted nodes", "[forecast][prometheus]") {
  FakePrometheus p(good_answer());
  const History h = query_prometheus(p.source(), kT0, kT0 + 2 * kHour);
  CHECK(h.source == p.source().url);
  REQUIRE(h.nodes.size() == 2);
  CHECK(h.nodes[0].node == "n01");
  CHECK(h.nodes[1].node == "n02");
  for (int n = 0; n < 2; ++n) {
    CHECK(h.nodes[n].start == kT0);
    REQUIRE(h.nodes[n].rows.size() == 3);
    for (int k = 0; k < 3; ++k)
      for (int f = 0; f < kFeatures; ++f) CHECK(h.nodes[n].rows[k][f] == Approx(10 * f + n + 0.1 * k));
  }
  const auto reqs = p.requests();
  REQUIRE(reqs.size() == 4);
  for (int f = 0; f < kFeatures; ++f) {
    const auto& q = reqs[f];
    CHECK(q.find("query")->second == "q" + std::to_string(f));
    CHECK(q.find("start")->second == std::to_string(kT0));
    CHECK(q.find("end")->second == std::to_string(kT0 + 2 * kHour));
    CHECK(q.find("step")->second == "3600");
  }
}

TEST_CASE("query_prometheus: one message per bad answer", "[forecast][prometheus]") {
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 1) s[1].values.erase(s[1].values.begin() + 1);  // n01 misses hour 1 of memory_bw
             })),
             Contains("node 'n01' has 2 of 3 hours of feature 'memory_bw' (query 'q1')") &&
                 Contains("the first missing is 2026-11-25T14:00:00Z"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 2) s[0].values[2].second = "NaN";
             })),
             Contains("feature 'latency'") && Contains("node 'n02' at 2026-11-25T15:00:00Z: the sample is NaN"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 3) s[1].values[0].second = "+Inf";
             })),
             Contains("feature 'iops'") && Contains("node 'n01' at 2026-11-25T13:00:00Z: the sample is infinite"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 0) s.clear();
             })),
             Contains("feature 'compute' (query 'q0') returned no series for 2026-11-25T13:00:00Z .. "
                      "2026-11-25T15:00:00Z"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 1) s[0].metric = R"({"instance":"n02:9100"})";
             })),
             Contains("feature 'memory_bw' (query 'q1') returned a series without the node label 'host'") &&
                 Contains("n02:9100"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 2) s.pop_back();
             })),
             Contains("the nodes differ between the features: 'n01' has compute but not latency"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 0) s[0].metric = R"({"host":"n01","gpu":"1"})";  // not aggregated by host
             })),
             Contains("returned more than one series for node 'n01' (aggregate it by host)"));
  CHECK_THAT(prom_config_error(good_answer([](int f, std::vector<Series>& s) {
               if (f == 3) s[0].values[1].first += 60;
             })),
             Contains("node 'n02': sample at 1795615260 is not an hour of 2026-11-25T13:00:00Z .. 2026-11-25T15:00:00Z"));
  CHECK_THAT(prom_config_error([](const httplib::Request&, httplib::Response& res) {
               res.set_content(matrix({}, "vector"), "application/json");
             }),
             Contains("resultType \"vector\", expected \"matrix\""));
  CHECK_THAT(prom_config_error([](const httplib::Request&, httplib::Response& res) {
               res.set_content(R"({"status":"success","data":{"resultType":"matrix","result":["x"]}})", "application/json");
             }),
             Contains("feature 'compute' (query 'q0'): malformed query_range answer"));
  CHECK_THAT(prom_config_error([](const httplib::Request&, httplib::Response& res) {
               res.set_content("<html>proxy login</html>", "text/html");
             }),
             Contains("the answer is not a query_range JSON object: <html>proxy login</html>"));
}

TEST_CASE("query_prometheus: a refused query is a ConfigError, server errors and an unreachable server IoErrors", "[forecast][prometheus]") {
  {
    FakePrometheus p([](const httplib::Request&, httplib::Response& res) {
      res.status = 400;
      res.set_content(R"({"status":"error","errorType":"bad_data","error":"parse error at char 3"})",
                      "application/json");
    });
    CHECK_THAT(message_of<ConfigError>([&] { query_prometheus(p.source(), kT0, kT0 + kHour); }),
               Contains("refused feature 'compute' (query 'q0') (HTTP 400): parse error at char 3"));
  }
  {
    FakePrometheus p([](const httplib::Request&, httplib::Response& res) {
      res.status = 503;
      res.set_content(R"({"status":"error","errorType":"unavailable","error":"TSDB not ready"})", "application/json");
    });
    CHECK_THAT(message_of<IoError>([&] { query_prometheus(p.source(), kT0, kT0 + kHour); }),
               Contains("answered HTTP 503 for feature 'compute' (query 'q0'): TSDB not ready"));
  }
  // A port nobody listens on: bound, read back, closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  PrometheusSource src = default_prometheus_source(url);
  src.timeout_s = 2;
  CHECK_THAT(message_of<IoError>([&] { query_prometheus(src, kT0, kT0 + kHour); }),
             Contains("cannot reach Prometheus at " + url + ": "));
}
#else
TEST_CASE("query_prometheus without cpp-httplib says so", "[forecast][prometheus]") {
  CHECK_THAT(message_of<ConfigError>(
                 [] { query_prometheus(default_prometheus_source("http://127.0.0.1:9090"), kT0, kT0 + kHour); }),
             Contains("triax was built without cpp-httplib"));
}
#endif
