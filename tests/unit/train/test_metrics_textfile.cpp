// The metrics textfile never ends a run (issue 24, item 8): two exporters rewriting one file race
// without a shared temporary name and without an exception, a write into a missing directory is a
// warning, and the file is whole after the race. A bind address that does not resolve says so.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "unit/io_test_util.h"
#include "triax/core/error.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/atomic_file.h"
#include "triax/train/metrics_exporter.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
IterationMetrics at(int64_t i) {
  IterationMetrics m;
  m.iteration = i;
  m.train_iters = 1000;
  m.loss = 3.5;
  return m;
}
}  // namespace

TEST_CASE("two exporters on one textfile: no shared temporary, no failure, a whole file", "[prometheus]") {
  test::TempDir dir;
  MetricsExporterConfig cfg;
  cfg.textfile = dir.file("job.prom");
  std::shared_ptr<Communicator> a = make_self_communicator(), b = make_self_communicator();
  MetricsExporter ea(a, cfg, 1, 1, 1), eb(b, cfg, 1, 1, 1);
  // The two jobs of the probe, as two threads of one process (the same pid: the suffix must still
  // differ between writers).
  // Catch2's assertions are not thread-safe: each thread keeps its first error for the main thread.
  std::string error_a, error_b;
  auto run = [&](MetricsExporter& e, std::string& error) {
    try {
      for (int i = 1; i <= 300; ++i) e.observe(at(i), {});
    } catch (const std::exception& x) {
      error = x.what();
    }
  };
  std::thread ta([&] { run(ea, error_a); });
  std::thread tb([&] { run(eb, error_b); });
  ta.join();
  tb.join();
  CHECK(error_a == "");
  CHECK(error_b == "");
  const std::string text = test::read_bytes(cfg.textfile);
  CHECK_THAT(text, Contains("triax_iteration 300\n"));
  size_t leftovers = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir.path())) leftovers += f.path().filename() != "job.prom";
  CHECK(leftovers == 0);
}

TEST_CASE("unique temporary suffixes differ between calls and carry the pid", "[prometheus]") {
  const std::string s1 = io::unique_tmp_suffix(), s2 = io::unique_tmp_suffix();
  CHECK(s1 != s2);
  CHECK_THAT(s1, Contains(".tmp." + std::to_string(::getpid()) + "."));
}

TEST_CASE("a textfile that cannot be written is a warning, and training metrics go on", "[prometheus]") {
  test::TempDir dir;
  MetricsExporterConfig cfg;
  cfg.textfile = dir.file("gone/job.prom");  // a directory that does not exist
  MetricsExporter e(make_self_communicator(), cfg, 1, 1, 1);
  for (int i = 1; i <= 5; ++i) REQUIRE_NOTHROW(e.observe(at(i), {}));
  REQUIRE_NOTHROW(e.checkpoint_saved(1700000000));
  CHECK_THAT(e.render(), Contains("triax_iteration 5\n"));
  // The directory appears mid-run: the next write lands.
  std::filesystem::create_directory(dir.file("gone"));
  e.observe(at(6), {});
  CHECK_THAT(test::read_bytes(cfg.textfile), Contains("triax_iteration 6\n"));
}

#if defined(TRIAX_HAVE_HTTP)
constexpr bool kBuiltWithHttp = true;
#else
constexpr bool kBuiltWithHttp = false;
#endif

TEST_CASE("--metrics-bind that does not resolve names the host, not a stale errno", "[prometheus]") {
  REQUIRE(MetricsExporter::http_available() == kBuiltWithHttp);  // the library and tests/CMakeLists.txt agree
  if (!kBuiltWithHttp) return;  // the next test case checks the refusal
  MetricsExporterConfig cfg;
  cfg.port = 0;
  cfg.bind = "not a host";
  try {
    MetricsExporter e(make_self_communicator(), cfg, 1, 1, 1);
    FAIL("bound to 'not a host'");
  } catch (const ConfigError& err) {
    const std::string what = err.what();
    CHECK_THAT(what, Contains("--metrics-bind 'not a host': the address cannot be resolved"));
    CHECK(what.find("No such file or directory") == std::string::npos);
  }
}

TEST_CASE("built without cpp-httplib, an endpoint is refused by name and the textfile still works", "[prometheus]") {
  if (kBuiltWithHttp) return;  // the endpoint itself: test_train_prometheus
  test::TempDir dir;
  MetricsExporterConfig cfg;
  cfg.port = 9400;
  cfg.bind = "127.0.0.1";
  try {
    MetricsExporter e(make_self_communicator(), cfg, 1, 1, 1);
    FAIL("an endpoint was accepted without cpp-httplib");
  } catch (const ConfigError& err) {
    const std::string what = err.what();
    CHECK_THAT(what, Contains("--metrics-port 9400 (--metrics-bind 127.0.0.1)"));
    CHECK_THAT(what, Contains("built without the HTTP metrics endpoint"));
    CHECK_THAT(what, Contains("-DTRIAX_WITH_HTTP=ON"));
  }
  cfg.port = -1;
  cfg.textfile = dir.file("job.prom");
  MetricsExporter e(make_self_communicator(), cfg, 1, 1, 1);
  CHECK(e.port() == -1);
  e.observe(at(2), {});
  CHECK_THAT(test::read_bytes(cfg.textfile), Contains("triax_iteration 2\n"));
}
