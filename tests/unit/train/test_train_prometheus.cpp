// Prometheus text exposition and the metrics exporter: exact text for known values, escaping,
// the float spellings Prometheus parses, name validation, the /metrics endpoint over real HTTP
// (cpp-httplib client), and the atomically rewritten textfile.
#include <catch2/catch.hpp>
#if defined(TRIAX_HAVE_HTTP)
#include <httplib.h>
#endif

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "triax/core/error.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/train/metrics_exporter.h"
#include "triax/io/prometheus_text.h"

using namespace triax;

TEST_CASE("prometheus values round-trip and use Go's spellings", "[prometheus]") {
  CHECK(prom::format_value(0.1) == "0.1");
  CHECK(prom::format_value(3.0) == "3");
  CHECK(prom::format_value(-2.5e-20) == "-2.5e-20");
  CHECK(prom::format_value(std::numeric_limits<double>::quiet_NaN()) == "NaN");
  CHECK(prom::format_value(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(prom::format_value(-std::numeric_limits<double>::infinity()) == "-Inf");
  const double x = 2.718281828459045;
  CHECK(std::stod(prom::format_value(x)) == x);
}

TEST_CASE("prometheus families render with HELP, TYPE and escaped labels", "[prometheus]") {
  std::vector<prom::Family> f{
      {"triax_a", "first\nline \\ two", "gauge", {{{}, 1.5}}},
      {"triax_b_total", "a counter", "counter", {{{{"rank", "0"}, {"host", "n\"1\\x\ny"}}, 7}}},
  };
  CHECK(prom::render(f) ==
        "# HELP triax_a first\\nline \\\\ two\n# TYPE triax_a gauge\ntriax_a 1.5\n"
        "# HELP triax_b_total a counter\n# TYPE triax_b_total counter\n"
        "triax_b_total{rank=\"0\",host=\"n\\\"1\\\\x\\ny\"} 7\n");
}

TEST_CASE("prometheus rejects bad metric names, label names and types", "[prometheus]") {
  CHECK_THROWS_AS(prom::render({{"1bad", "", "gauge", {}}}), ConfigError);
  CHECK_THROWS_AS(prom::render({{"bad-name", "", "gauge", {}}}), ConfigError);
  CHECK_THROWS_AS(prom::render({{"ok", "", "histogram", {}}}), ConfigError);
  CHECK_THROWS_AS(prom::render({{"ok", "", "gauge", {{{{"__x", "v"}}, 1}}}}), ConfigError);
  CHECK_THROWS_AS(prom::render({{"ok", "", "gauge", {{{{"a:b", "v"}}, 1}}}}), ConfigError);
  try {
    prom::render({{"bad-name", "", "gauge", {}}});
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("'bad-name'") != std::string::npos);
  }
}

namespace {
IterationMetrics sample_metrics() {
  IterationMetrics m;
  m.iteration = 3;
  m.train_iters = 10;
  m.consumed_samples = 96;
  m.elapsed_ms = 250;
  m.tokens_per_s = 12345.5;
  m.tflops = 0.0125;
  m.lr = 3e-3;
  m.global_batch = 32;
  m.loss = 4.25;
  m.grad_norm = 0.75;
  m.skipped = 1;
  m.dp_exposed_ms = 2;
  m.dp_comm_ms = 5;
  m.p2p_wait_ms = 10;
  return m;
}
// The value of an unlabelled sample (or one with the exact label text) in the exposition.
double value_of(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  FAIL("no series " << series << " in:\n" << text);
  return 0;
}
}  // namespace

TEST_CASE("metrics snapshot carries every exported value", "[prometheus]") {
  MetricsSnapshot s;
  s.it = sample_metrics();
  s.have_iteration = true;
  s.last_progress_unix_s = 1700000000.5;
  s.ranks = {{0.2, 0.01, 0.002}, {0.3, 0.02, 0.001}};
  s.world = 2;
  s.dp = 2;
  s.checkpoint_interval_s = 600;
  s.last_checkpoint_unix_s = 1699999000;
  const std::string t = s.render();
  CHECK(value_of(t, "triax_iteration") == 3);
  CHECK(value_of(t, "triax_train_iterations") == 10);
  CHECK(value_of(t, "triax_consumed_samples_total") == 96);
  CHECK(value_of(t, "triax_loss") == 4.25);
  CHECK(value_of(t, "triax_grad_norm") == 0.75);
  CHECK(value_of(t, "triax_learning_rate") == 3e-3);
  CHECK(value_of(t, "triax_tokens_per_second") == 12345.5);
  CHECK(value_of(t, "triax_step_seconds") == 0.25);
  CHECK(value_of(t, "triax_tflops_per_rank") == 0.0125);
  CHECK(value_of(t, "triax_dp_exposed_seconds") == 0.002);
  CHECK(value_of(t, "triax_pipeline_wait_seconds") == 0.01);
  CHECK(value_of(t, "triax_skipped_iterations_total") == 1);
  CHECK(value_of(t, "triax_last_progress_timestamp_seconds") == 1700000000.5);
  CHECK(value_of(t, "triax_checkpoint_interval_seconds") == 600);
  CHECK(value_of(t, "triax_checkpoint_last_timestamp_seconds") == 1699999000);
  CHECK(value_of(t, "triax_rank_compute_seconds{rank=\"1\"}") == 0.3);
  CHECK(value_of(t, "triax_rank_pipeline_wait_seconds{rank=\"0\"}") == 0.01);
  CHECK(value_of(t, "triax_rank_dp_exposed_seconds{rank=\"1\"}") == 0.001);
  CHECK(value_of(t, "triax_parallel_info{tp=\"1\",pp=\"1\",dp=\"2\",world=\"2\"}") == 1);
  CHECK(t.find("triax_validation_loss") == std::string::npos);  // no validation pass yet
  // The elastic facts (docs/FAULTS.md): the world now, the most it may grow to, one node's worth;
  // the attempt only for an elastic run.
  s.world_max = 6, s.local_world = 2;
  CHECK(value_of(s.render(), "triax_world_size") == 2);
  CHECK(value_of(s.render(), "triax_world_size_max") == 6);
  CHECK(value_of(s.render(), "triax_local_world_size") == 2);
  CHECK(s.render().find("triax_elastic_attempt") == std::string::npos);
  s.attempt = 3;
  CHECK(value_of(s.render(), "triax_elastic_attempt") == 3);
  s.eval.iteration = 20;
  s.eval.loss = 2.5;
  s.eval.ppl = std::exp(2.5);
  s.have_eval = true;
  const std::string tv = s.render();
  CHECK(value_of(tv, "triax_validation_loss") == 2.5);
  CHECK(value_of(tv, "triax_validation_ppl") == Approx(std::exp(2.5)).epsilon(1e-15));
  CHECK(value_of(tv, "triax_validation_iteration") == 20);
  // A NaN loss stays visible (the alert needs it), spelled the way Prometheus parses it.
  s.it.loss = std::nan("");
  CHECK(s.render().find("\ntriax_loss NaN\n") != std::string::npos);
  // Before the first iteration only the job's facts are exported.
  MetricsSnapshot empty;
  CHECK(empty.render().find("triax_loss") == std::string::npos);
  CHECK(empty.render().find("triax_start_timestamp_seconds") != std::string::npos);
}

#if defined(TRIAX_HAVE_HTTP)  // without cpp-httplib: test_metrics_textfile checks the refusal
TEST_CASE("metrics exporter serves /metrics over HTTP and rewrites the textfile", "[prometheus]") {
  const auto dir = std::filesystem::temp_directory_path() / ("triax_prom_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  MetricsExporterConfig cfg;
  cfg.port = 0;
  cfg.bind = "127.0.0.1";
  cfg.textfile = (dir / "triax.prom").string();
  std::shared_ptr<Communicator> self = make_self_communicator();
  MetricsExporter ex(self, cfg, 1, 1, 1);
  REQUIRE(ex.port() > 0);
  httplib::Client cli("127.0.0.1", ex.port());
  auto before = cli.Get("/metrics");
  REQUIRE(before);
  CHECK(before->status == 200);
  CHECK(before->body.find("triax_iteration") == std::string::npos);
  ex.observe(sample_metrics(), {0.2, 0.01, 0.003});
  auto after = cli.Get("/metrics");
  REQUIRE(after);
  CHECK(after->get_header_value("Content-Type").find("version=0.0.4") != std::string::npos);
  CHECK(value_of(after->body, "triax_iteration") == 3);
  CHECK(value_of(after->body, "triax_rank_compute_seconds{rank=\"0\"}") == 0.2);
  std::ifstream f(cfg.textfile);
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(value_of(ss.str(), "triax_loss") == 4.25);
  CHECK_FALSE(std::filesystem::exists(cfg.textfile + ".tmp"));
  CHECK(cli.Get("/nothing")->status == 404);
  // A second exporter on the same port fails with the address in the message.
  MetricsExporterConfig same = cfg;
  same.port = ex.port();
  same.textfile.clear();
  try {
    MetricsExporter clash(self, same, 1, 1, 1);
    FAIL("binding a used port succeeded");
  } catch (const IoError& e) {
    CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(ex.port())) != std::string::npos);
  }
  std::filesystem::remove_all(dir);
}
#endif
