// MetricsExporter: the per-rank times are all-gathered, rank 0 keeps the snapshot under a mutex
// and a cpp-httplib server thread renders it per scrape; the textfile goes through AtomicFile so
// node exporter never reads a half-written file. Built without cpp-httplib (TRIAX_WITH_HTTP=OFF or
// not found, CMakeLists.txt), an endpoint (--metrics-port) is a ConfigError; the textfile works.
#include "triax/train/metrics_exporter.h"

#if defined(TRIAX_HAVE_HTTP)
#include <httplib.h>
#endif
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/io/atomic_file.h"

namespace triax {

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

namespace {
#if defined(TRIAX_HAVE_HTTP)
// A bind address that does not resolve is a bad value (exit 2), said with the resolver's reason:
// httplib would fail with whatever errno an earlier call left behind.
void check_bind_address(const std::string& bind) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(bind.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  if (rc != 0)
    TRIAX_THROW(ConfigError, "--metrics-bind '{}': the address cannot be resolved ({}); expected a host name or an IP "
                "address of this host, e.g. 0.0.0.0 or 127.0.0.1", bind, ::gai_strerror(rc));
}
#endif

prom::Family gauge(std::string name, std::string help, double v) {
  return {std::move(name), std::move(help), "gauge", {{{}, v}}};
}
prom::Family counter(std::string name, std::string help, double v) {
  return {std::move(name), std::move(help), "counter", {{{}, v}}};
}
}  // namespace

std::vector<prom::Family> MetricsSnapshot::families() const {
  std::vector<prom::Family> f;
  f.push_back({"triax_parallel_info", "Layout of the job (value 1)", "gauge",
               {{{{"tp", std::to_string(tp)}, {"pp", std::to_string(pp)}, {"dp", std::to_string(dp)},
                  {"world", std::to_string(world)}},
                 1.0}}});
  f.push_back(gauge("triax_start_timestamp_seconds", "Unix time the exporter started", start_unix_s));
  // Elastic jobs (docs/FAULTS.md): the world now and the most it may grow to; an alert compares
  // them with the free nodes (clusters/prometheus/triax_alerts.yml, TrainingBelowMaxWorldSize).
  f.push_back(gauge("triax_world_size", "Ranks in the job now", static_cast<double>(world)));
  f.push_back(gauge("triax_world_size_max", "Ranks the job may grow to (torchrun's --nnodes maximum x ranks per node, "
                    "TRIAX_MAX_WORLD_SIZE; the world size when not elastic)", static_cast<double>(world_max)));
  f.push_back(gauge("triax_local_world_size", "Ranks per node (one node's worth of growth)",
                    static_cast<double>(local_world)));
  if (attempt > 0)
    f.push_back(gauge("triax_elastic_attempt", "Starts of the workers in this elastic run (1: never restarted)",
                      static_cast<double>(attempt)));
  if (checkpoint_interval_s > 0)
    f.push_back(gauge("triax_checkpoint_interval_seconds", "Configured interval between checkpoints",
                      checkpoint_interval_s));
  if (last_checkpoint_unix_s > 0)
    f.push_back(gauge("triax_checkpoint_last_timestamp_seconds", "Unix time of the last checkpoint written",
                      last_checkpoint_unix_s));
  if (have_eval) {
    f.push_back(gauge("triax_validation_loss", "LM loss of the last validation pass (--valid-data)", eval.loss));
    f.push_back(gauge("triax_validation_ppl", "Perplexity of the last validation pass", eval.ppl));
    f.push_back(gauge("triax_validation_iteration", "Training iteration of the last validation pass",
                      static_cast<double>(eval.iteration)));
  }
  if (!have_iteration) return f;
  f.push_back(gauge("triax_iteration", "Iterations completed", static_cast<double>(it.iteration)));
  f.push_back(gauge("triax_train_iterations", "Iterations the run is configured for", static_cast<double>(it.train_iters)));
  f.push_back(counter("triax_consumed_samples_total", "Samples consumed so far", static_cast<double>(it.consumed_samples)));
  f.push_back(gauge("triax_loss", "LM loss of the last iteration, mean over the global batch", it.loss));
  if (it.moe) f.push_back(gauge("triax_moe_aux_loss", "Load-balancing loss of the last iteration", it.moe_aux_loss));
  f.push_back(gauge("triax_grad_norm", "Global gradient norm of the last iteration (before clipping)", it.grad_norm));
  f.push_back(gauge("triax_learning_rate", "Learning rate of the last iteration", it.lr));
  f.push_back(gauge("triax_global_batch_size", "Samples per iteration", static_cast<double>(it.global_batch)));
  f.push_back(gauge("triax_tokens_per_second", "Throughput of the last iteration", it.tokens_per_s));
  f.push_back(gauge("triax_step_seconds", "Elapsed time of the last iteration (max over ranks)", it.elapsed_ms / 1e3));
  f.push_back(gauge("triax_tflops_per_rank", "Model TFLOP/s per rank of the last iteration", it.tflops));
  f.push_back(gauge("triax_dp_exposed_seconds", "DP gradient communication not hidden behind backward (max over ranks)",
                    it.dp_exposed_ms / 1e3));
  f.push_back(gauge("triax_dp_comm_seconds", "Span of the DP collectives (max over ranks)", it.dp_comm_ms / 1e3));
  if (it.zero3) {
    f.push_back(gauge("triax_zero3_gather_exposed_seconds",
                      "ZeRO-3 unit all-gather time compute waited for in the last iteration (max over ranks)",
                      it.zero3_gather_exposed_ms / 1e3));
    f.push_back(gauge("triax_zero3_gather_seconds", "ZeRO-3 unit all-gathers' issue-to-completion time in the last "
                      "iteration (max over ranks)", it.zero3_gather_ms / 1e3));
  }
  if (it.cp) {
    f.push_back(gauge("triax_cp_exposed_seconds",
                      "Context-parallel K/V exchange time attention waited for in the last iteration (max over ranks)",
                      it.cp_exposed_ms / 1e3));
    f.push_back(gauge("triax_cp_exchange_seconds", "Context-parallel K/V exchanges' issue-to-completion time in the "
                      "last iteration (max over ranks)", it.cp_exchange_ms / 1e3));
  }
  f.push_back(gauge("triax_pipeline_wait_seconds", "Wait for pipeline sends and receives (max over ranks)",
                    it.p2p_wait_ms / 1e3));
  f.push_back(counter("triax_skipped_iterations_total", "Iterations skipped (non-finite gradients)",
                      static_cast<double>(it.skipped)));
  f.push_back(gauge("triax_last_progress_timestamp_seconds", "Unix time the last iteration completed",
                    last_progress_unix_s));
  prom::Family comp{"triax_rank_compute_seconds", "This rank's forward/backward compute time of the last iteration",
                    "gauge", {}};
  prom::Family wait{"triax_rank_pipeline_wait_seconds", "This rank's pipeline wait of the last iteration", "gauge", {}};
  prom::Family exposed{"triax_rank_dp_exposed_seconds", "This rank's exposed DP communication of the last iteration", "gauge", {}};
  for (size_t r = 0; r < ranks.size(); ++r) {
    const prom::Labels l{{"rank", std::to_string(r)}};
    comp.samples.push_back({l, ranks[r].compute_s});
    wait.samples.push_back({l, ranks[r].p2p_wait_s});
    exposed.samples.push_back({l, ranks[r].dp_exposed_s});
  }
  f.push_back(std::move(comp));
  f.push_back(std::move(wait));
  f.push_back(std::move(exposed));
  return f;
}

#if defined(TRIAX_HAVE_HTTP)
struct MetricsExporter::Server {
  httplib::Server http;
  std::thread thread;
};
#else
struct MetricsExporter::Server {};
#endif

bool MetricsExporter::http_available() {
#if defined(TRIAX_HAVE_HTTP)
  return true;
#else
  return false;
#endif
}

MetricsExporter::MetricsExporter(std::shared_ptr<Communicator> world, const MetricsExporterConfig& cfg, int tp, int pp,
                                 int dp)
    : world_(std::move(world)), cfg_(cfg) {
  snap_.tp = tp;
  snap_.pp = pp;
  snap_.dp = dp;
  snap_.world = world_->size();
  snap_.world_max = std::max(cfg.world_size_max, snap_.world);
  snap_.local_world = std::max(cfg.local_world_size, 1);
  snap_.attempt = cfg.attempt;
  snap_.start_unix_s = unix_now_s();
  snap_.checkpoint_interval_s = cfg.checkpoint_interval_s;
  snap_.ranks.resize(static_cast<size_t>(world_->size()));
  require(cfg.port >= -1 && cfg.port <= 65535, "--metrics-port {} is outside [0, 65535]", cfg.port);
  // Every rank refuses alike (the flags are the same everywhere), before any of them binds.
  if (cfg.port >= 0 && !http_available())
    TRIAX_THROW(ConfigError, "--metrics-port {} (--metrics-bind {}): this triax was built without the HTTP metrics "
                "endpoint (cpp-httplib was not found when it was configured: install libcpp-httplib-dev and "
                "configure with -DTRIAX_WITH_HTTP=ON); --metrics-textfile works without it", cfg.port, cfg.bind);
  if (world_->rank() != 0 || cfg.port < 0) return;
  start_server();
}

void MetricsExporter::start_server() {
#if defined(TRIAX_HAVE_HTTP)
  const MetricsExporterConfig& cfg = cfg_;
  server_ = std::make_unique<Server>();
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second job on the node bind the same
  // port silently and take half the scrapes; SO_REUSEADDR alone still allows a quick restart.
  server_->http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server_->http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server_->http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("triax metrics: /metrics\n", "text/plain");
  });
  check_bind_address(cfg.bind);
  errno = 0;
  port_ = cfg.port == 0 ? server_->http.bind_to_any_port(cfg.bind)
                        : (server_->http.bind_to_port(cfg.bind, cfg.port) ? cfg.port : -1);
  if (port_ < 0) {
    const int err = errno;
    server_.reset();
    throw IoError(fmt::format("metrics endpoint: cannot listen on {}:{} ({})", cfg.bind, cfg.port,
                              err ? std::strerror(err) : "the address could not be bound"));
  }
  server_->thread = std::thread([s = server_.get()] { s->http.listen_after_bind(); });
  log::info("metrics: serving Prometheus text on http://{}:{}/metrics", cfg.bind, port_);
#endif
}

MetricsExporter::~MetricsExporter() {
#if defined(TRIAX_HAVE_HTTP)
  if (server_) {
    server_->http.stop();
    if (server_->thread.joinable()) server_->thread.join();
  }
#endif
}

void MetricsExporter::observe(const IterationMetrics& m, const RankTimes& mine) {
  const size_t W = static_cast<size_t>(world_->size());
  const double in[3] = {mine.compute_s, mine.p2p_wait_s, mine.dp_exposed_s};
  std::vector<double> all(3 * W);
  world_->all_gather(std::span<const double>(in), std::span<double>(all)).wait();
  if (world_->rank() != 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap_.it = m;
    snap_.have_iteration = true;
    snap_.last_progress_unix_s = unix_now_s();
    for (size_t r = 0; r < W; ++r) snap_.ranks[r] = {all[3 * r], all[3 * r + 1], all[3 * r + 2]};
  }
  if (!cfg_.textfile.empty()) write_textfile();
}

void MetricsExporter::observe_eval(const EvalMetrics& e) {
  if (world_->rank() != 0) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap_.eval = e;
    snap_.have_eval = true;
  }
  if (!cfg_.textfile.empty()) write_textfile();
}

void MetricsExporter::checkpoint_saved(double unix_s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    snap_.last_checkpoint_unix_s = unix_s;
  }
  if (!cfg_.textfile.empty()) write_textfile();  // the last save of a run is shown too
}

void MetricsExporter::set_checkpoint_interval(double seconds) {
  require(std::isfinite(seconds) && seconds >= 0, "checkpoint interval {} s must be finite and >= 0", seconds);
  std::lock_guard<std::mutex> lock(mu_);
  snap_.checkpoint_interval_s = seconds;
}

std::string MetricsExporter::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  return snap_.render();
}

void MetricsExporter::write_textfile() const {
  // Two writers (the training loop, the checkpoint thread): rendering inside the file lock keeps
  // the newest snapshot the one left on disk.
  std::lock_guard<std::mutex> lock(file_mu_);
  const std::string text = render();
  // A temporary name of this process's own: two jobs given one textfile must not rename each
  // other's half-written file (or find it gone). A failed write is a warning: metrics never end
  // a training run.
  try {
    io::AtomicFile f(cfg_.textfile, io::unique_tmp_suffix());
    f.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
    f.commit();
  } catch (const std::exception& e) {
    ++textfile_failures_;
    const double now = unix_now_s();
    if (now - last_textfile_warning_s_ < kTextfileWarningInterval_s) return;
    log::warn("--metrics-textfile: {} ({} failed write{} so far; training goes on; the next warning at most once "
              "per {:.0f} s)", e.what(), textfile_failures_, textfile_failures_ == 1 ? "" : "s",
              kTextfileWarningInterval_s);
    last_textfile_warning_s_ = now;
    return;
  }
  if (textfile_failures_ > 0 && last_textfile_warning_s_ > 0) {
    log::info("--metrics-textfile {}: written again after {} failed write{}", cfg_.textfile, textfile_failures_,
              textfile_failures_ == 1 ? "" : "s");
    textfile_failures_ = 0;
    last_textfile_warning_s_ = 0;
  }
}

}  // namespace triax
