// Training metrics for Prometheus: every rank hands its iteration metrics to observe()
// (collective: the per-rank times are gathered); rank 0 keeps the latest snapshot, serves it on
// /metrics (cpp-httplib) and/or writes it atomically to a textfile for node exporter.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/io/prometheus_text.h"
#include "triax/train/trainer.h"

namespace triax {

struct MetricsExporterConfig {
  int port = -1;                  // -1: no HTTP endpoint; 0: any free port (see port())
  std::string bind = "0.0.0.0";   // address to listen on
  std::string textfile;           // "" : none; else rewritten atomically after each iteration (a failed
                                  // write is a rate-limited warning, never an error)
  double checkpoint_interval_s = 0;  // > 0: exported, so an alert can compare the checkpoint age
  int world_size_max = 0;            // the most ranks an elastic job may grow to (below the world: the world)
  int local_world_size = 1;          // ranks per node
  int attempt = 0;                   // the elastic attempt (0: not elastic; not exported)
};

// One rank's own times of an iteration (IterationMetrics hold the maximum over ranks).
struct RankTimes {
  double compute_s = 0;
  double p2p_wait_s = 0;
  double dp_exposed_s = 0;
};

// What rank 0 exports; render() turns it into the text format.
struct MetricsSnapshot {
  IterationMetrics it;
  bool have_iteration = false;
  EvalMetrics eval;        // the last validation pass
  bool have_eval = false;
  double last_progress_unix_s = 0;   // wall clock of the last completed iteration
  double start_unix_s = 0;
  double last_checkpoint_unix_s = 0;  // 0: none yet
  double checkpoint_interval_s = 0;
  int tp = 1, pp = 1, dp = 1, world = 1;
  int world_max = 1, local_world = 1, attempt = 0;
  std::vector<RankTimes> ranks;  // indexed by world rank
  std::vector<prom::Family> families() const;
  std::string render() const { return prom::render(families()); }
};

class MetricsExporter {
 public:
  // Collective over world (every rank constructs it). Rank 0 binds the port (IoError naming the
  // address when it cannot) and starts the server thread; ConfigError for a port in a build
  // without the HTTP endpoint (http_available()).
  MetricsExporter(std::shared_ptr<Communicator> world, const MetricsExporterConfig& cfg, int tp, int pp, int dp);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // Collective: call on every rank after each iteration with this rank's own times.
  void observe(const IterationMetrics& m, const RankTimes& mine);
  // A checkpoint was written at unix time t (rank 0's view is exported).
  void checkpoint_saved(double unix_s);  // thread-safe
  // A validation pass finished (not collective; rank 0's values are exported).
  void observe_eval(const EvalMetrics& e);
  // The expected time between checkpoints (0: not exported); train_gpt sets it to --save-interval
  // times the mean iteration time as it measures them.
  void set_checkpoint_interval(double seconds);
  // The port rank 0 listens on (-1 elsewhere or without an endpoint).
  int port() const { return port_; }
  std::string render() const;
  // Whether this build has the HTTP endpoint (cpp-httplib, TRIAX_WITH_HTTP); without it a
  // config with port >= 0 is a ConfigError.
  static bool http_available();

 private:
  void start_server();  // rank 0, port >= 0: binds and starts the server thread
  void write_textfile() const;
  std::shared_ptr<Communicator> world_;
  MetricsExporterConfig cfg_;
  mutable std::mutex mu_;
  mutable std::mutex file_mu_;
  // Failed textfile writes (under file_mu_): counted, warned about at most once per interval.
  static constexpr double kTextfileWarningInterval_s = 60;
  mutable int64_t textfile_failures_ = 0;
  mutable double last_textfile_warning_s_ = 0;
  MetricsSnapshot snap_;
  int port_ = -1;
  struct Server;
  std::unique_ptr<Server> server_;
};

double unix_now_s();

}  // namespace triax
