// triax-forecast: forecasts each node's next-hour compute utilisation from its last 24 hours of
// four features (compute, memory bandwidth, network latency, storage IOPS) with an LSTM(64) ->
// Dense(1) trained on the triax backend; history from Prometheus' HTTP API or a CSV.
//   triax-forecast train    --prometheus http://prom:9090 --model node-load.safetensors
//   triax-forecast predict  --prometheus http://prom:9090 --model node-load.safetensors \
//                           --textfile /var/lib/node_exporter/textfile/triax_forecast.prom --json forecast.json
//   triax-forecast evaluate --csv history.csv --model node-load.safetensors
// docs/CLUSTER.md "Predictive scheduling"; triax-probe --forecast forecast.json ranks nodes with it.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <set>

#include <triax/core/error.h>
#include <triax/distributed/failure/job_failure.h>
#include <triax/forecast/history.h>
#include <triax/core/env.h>
#include <triax/forecast/lstm.h>
#include <omp.h>
#include <triax/io/atomic_file.h>
#include <triax/io/prometheus_text.h>

namespace fc = triax::forecast;

namespace {

struct Options {
  std::string csv, prometheus, node_label = "host", end_text, json, model, textfile;
  std::vector<std::string> queries;
  double http_timeout = 10;
  int days = 7;
  fc::TrainOptions train;
  bool quiet = false;
};

int64_t parse_time(const std::string& s) { return fc::parse_utc_time(s, "--end"); }

// Rows of a CSV history up to --end (all when not given).
void cut_after(fc::History& h, int64_t end) {
  for (auto& n : h.nodes) {
    const int64_t keep = std::clamp<int64_t>((end - n.start) / fc::kHour + 1, 0, static_cast<int64_t>(n.rows.size()));
    n.rows.resize(static_cast<size_t>(keep));
  }
  std::erase_if(h.nodes, [](const fc::NodeSeries& n) { return n.rows.empty(); });
  if (h.nodes.empty()) throw triax::ConfigError(fmt::format("{}: no rows at or before --end", h.source));
}

// The history of `hours` hours ending at --end (Prometheus), or the CSV's rows up to --end.
fc::History load_history(const Options& o, int hours) {
  if (o.csv.empty() == o.prometheus.empty())
    throw triax::ConfigError("give exactly one history source: --csv FILE or --prometheus URL");
  if (!o.csv.empty()) {
    if (!o.queries.empty()) throw triax::ConfigError("--query applies to --prometheus, not to --csv");
    auto h = fc::read_csv(o.csv);
    if (!o.end_text.empty()) cut_after(h, parse_time(o.end_text));
    return h;
  }
  auto src = fc::default_prometheus_source(o.prometheus);
  for (const auto& q : o.queries) fc::set_query(src, q);
  src.node_label = o.node_label;
  src.timeout_s = o.http_timeout;
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  const int64_t end = o.end_text.empty() ? now / fc::kHour * fc::kHour : parse_time(o.end_text);
  if (end % fc::kHour != 0) throw triax::ConfigError(fmt::format("--end {}: not on the hour", o.end_text));
  return fc::query_prometheus(src, end - (hours - 1) * fc::kHour, end);
}

void write_out(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return;
  }
  triax::io::AtomicFile f(path);
  f.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  f.commit();
}

struct Holdout {
  int64_t start = 0, n = 0, nodes = 0;
  fc::ErrorStats lstm, persistence, seasonal, mean;
};

Holdout score_holdout(fc::LstmRegressor& m, const fc::Scaler& s, const fc::Windows& w, int64_t start) {
  Holdout r;
  r.start = start;
  r.n = w.count;
  r.nodes = static_cast<int64_t>(std::set<std::string>(w.node.begin(), w.node.end()).size());
  const auto pred = fc::predict_utilisation(m, s, w);
  r.lstm = fc::error_stats(pred, w.target);
  r.persistence = fc::error_stats(w.persistence, w.target);
  r.seasonal = fc::error_stats(w.seasonal, w.target);
  // The climatological forecast: the training hours' mean utilisation, whatever the window says.
  // On a history with nothing to learn this is the one to beat, not persistence.
  r.mean = fc::error_stats(std::vector<double>(w.target.size(), s.mean[fc::kTargetFeature]), w.target);
  return r;
}

nlohmann::json holdout_json(const Holdout& h) {
  auto e = [](const fc::ErrorStats& s) { return nlohmann::json{{"mae", s.mae}, {"rmse", s.rmse}}; };
  return {{"start", fc::utc_hour_string(h.start)}, {"n", h.n}, {"nodes", h.nodes}, {"lstm", e(h.lstm)},
          {"persistence", e(h.persistence)}, {"seasonal_naive", e(h.seasonal)}, {"training_mean", e(h.mean)}};
}

void print_holdout(const Holdout& h) {
  std::printf("held-out day from %s: %lld windows over %lld node(s)\n", fc::utc_hour_string(h.start).c_str(),
              static_cast<long long>(h.n), static_cast<long long>(h.nodes));
  std::printf("  %-15s %10s %10s\n", "model", "MAE", "RMSE");
  auto row = [](const char* name, const fc::ErrorStats& s) { std::printf("  %-15s %10.5f %10.5f\n", name, s.mae, s.rmse); };
  row("lstm", h.lstm);
  row("persistence", h.persistence);
  row("seasonal_naive", h.seasonal);
  row("training_mean", h.mean);
  const double bm = std::min(h.persistence.mae, h.seasonal.mae), br = std::min(h.persistence.rmse, h.seasonal.rmse);
  std::printf("  lstm vs the better of persistence and seasonal naive: MAE %+.1f%%, RMSE %+.1f%%\n",
              100 * (h.lstm.mae / bm - 1), 100 * (h.lstm.rmse / br - 1));
  std::printf("  lstm vs the training mean: MAE %+.1f%%, RMSE %+.1f%%\n", 100 * (h.lstm.mae / h.mean.mae - 1),
              100 * (h.lstm.rmse / h.mean.rmse - 1));
}

int train(const Options& o) {
  auto h = load_history(o, o.days * 24);
  fc::require_hours(h, 2 * fc::kWindowHours + 1, "train (a 24-hour window, an hour to learn from, and the held-out final day)");
  const int64_t split = fc::holdout_start(h);
  // The scaler as the model file will keep it, so that evaluate on the saved model repeats the
  // held-out numbers exactly.
  const auto scaler = fc::as_stored(fc::Scaler::fit(h, split));
  const auto w = fc::make_windows(h, scaler, split);
  auto be = triax::make_cpu_backend(triax::DType::f32);
  fc::LstmRegressor m(*be);
  std::printf("training on %lld windows of %zu node(s) from %s; holding out %lld\n",
              static_cast<long long>(w.train.count), h.nodes.size(), h.source.c_str(),
              static_cast<long long>(w.holdout.count));
  const auto r = fc::train_lstm(m, w.train, w.holdout, o.train, [&](const fc::EpochStats& s) {
    if (!o.quiet && (s.epoch % 10 == 0 || s.epoch == 1))
      std::printf("epoch %4d: train mse %.5f, held-out mse %.5f\n", s.epoch, s.train_mse, s.holdout_mse);
  });
  std::printf("%s after %d epoch(s); keeping epoch %d (held-out mse %.5f)\n",
              r.epochs_run < o.train.max_epochs ? "stopped early" : "finished", r.epochs_run, r.best_epoch,
              r.best_holdout_mse);
  const auto hold = score_holdout(m, scaler, w.holdout, split);
  print_holdout(hold);
  fc::save_model(o.model, m, scaler,
                 {{"source", h.source}, {"holdout_start", fc::utc_hour_string(split)},
                  {"holdout_mae", fmt::format("{}", hold.lstm.mae)}, {"holdout_rmse", fmt::format("{}", hold.lstm.rmse)},
                  {"epochs", std::to_string(r.epochs_run)}, {"best_epoch", std::to_string(r.best_epoch)},
                  {"seed", std::to_string(o.train.seed)}});
  std::printf("wrote %s\n", o.model.c_str());
  write_out(o.json, nlohmann::json{{"model", o.model}, {"source", h.source}, {"epochs_run", r.epochs_run},
                                   {"best_epoch", r.best_epoch}, {"train_windows", w.train.count},
                                   {"holdout_windows", w.holdout.count}, {"holdout", holdout_json(hold)}}
                        .dump(2) + "\n");
  return 0;
}

int evaluate(const Options& o) {
  auto be = triax::make_cpu_backend(triax::DType::f32);
  auto loaded = fc::load_model(o.model, *be);
  auto h = load_history(o, o.days * 24);
  fc::require_hours(h, fc::kWindowHours + 1, "evaluate (a 24-hour window and the hour after it)");
  const int64_t split = fc::holdout_start(h);
  const auto w = fc::make_windows(h, loaded.scaler, split);
  const auto hold = score_holdout(*loaded.model, loaded.scaler, w.holdout, split);
  print_holdout(hold);
  write_out(o.json, nlohmann::json{{"model", o.model}, {"source", h.source}, {"holdout", holdout_json(hold)}}.dump(2) + "\n");
  return 0;
}

std::string textfile(const Options& o, const fc::Windows& w, const std::vector<double>& pred) {
  triax::prom::Family p{"triax_node_predicted_utilisation",
                        "Forecast compute utilisation of the node for the hour after its last sample (triax-forecast)",
                        "gauge", {}};
  triax::prom::Family t{"triax_node_forecast_for_timestamp_seconds",
                        "Unix time of the hour triax_node_predicted_utilisation forecasts", "gauge", {}};
  for (int64_t i = 0; i < w.count; ++i) {
    p.samples.push_back({{{o.node_label, w.node[i]}}, std::clamp(pred[i], 0.0, 1.0)});
    t.samples.push_back({{{o.node_label, w.node[i]}}, static_cast<double>(w.target_time[i])});
  }
  return triax::prom::render({p, t});
}

int predict(const Options& o) {
  auto be = triax::make_cpu_backend(triax::DType::f32);
  auto loaded = fc::load_model(o.model, *be);
  const auto h = load_history(o, fc::kWindowHours);
  const auto w = fc::latest_windows(h, loaded.scaler);  // refuses a node with fewer than 24 hours
  const auto z = fc::predict_standardised(*loaded.model, w);
  std::vector<double> pred(z.size());
  for (size_t i = 0; i < z.size(); ++i) pred[i] = loaded.scaler.target_from_standard(z[i]);
  nlohmann::json nodes = nlohmann::json::array();
  int64_t for_ts = 0;
  std::printf("%-24s %-22s %8s %10s\n", "node", "forecast for", "last", "predicted");
  for (int64_t i = 0; i < w.count; ++i) {
    const double last = w.persistence[i];  // the window's last hour
    for_ts = std::max(for_ts, w.target_time[i]);
    std::printf("%-24s %-22s %8.3f %10.3f\n", w.node[i].c_str(), fc::utc_hour_string(w.target_time[i]).c_str(), last,
                std::clamp(pred[i], 0.0, 1.0));
    nodes.push_back({{"node", w.node[i]}, {"predicted_utilisation", std::clamp(pred[i], 0.0, 1.0)},
                     {"model_output", z[i]}, {"last_utilisation", last}, {"for_timestamp", w.target_time[i]}});
  }
  write_out(o.textfile, textfile(o, w, pred));
  write_out(o.json, nlohmann::json{{"model", o.model}, {"source", h.source}, {"for_time", fc::utc_hour_string(for_ts)},
                                   {"for_timestamp", for_ts}, {"nodes", nodes}}.dump(2) + "\n");
  return 0;
}

void add_source(CLI::App* c, Options& o) {
  c->add_option("--csv", o.csv, "history CSV: timestamp,node,compute,memory_bw,latency,iops (hourly rows)");
  c->add_option("--prometheus", o.prometheus, "Prometheus base URL, e.g. http://127.0.0.1:9090");
  c->add_option("--query", o.queries, "replace a feature's PromQL: NAME=PROMQL (compute|memory_bw|latency|iops)");
  c->add_option("--node-label", o.node_label, "label that names the node in the query results")->capture_default_str();
  c->add_option("--http-timeout", o.http_timeout, "seconds per Prometheus request")->capture_default_str();
  c->add_option("--end", o.end_text, "last hour of history (unix seconds or 2026-11-25T13:00:00Z; default: now)");
  c->add_option("--json", o.json, "write the result as JSON ('-': stdout)");
  c->add_option("--model", o.model, "the model file (safetensors)")->required();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"triax-forecast: next-hour node utilisation from Prometheus history (LSTM on the triax backend)"};
  app.require_subcommand(1);
  Options o;
  auto* tr = app.add_subcommand("train", "train the LSTM on the history; hold out the final day");
  auto* pr = app.add_subcommand("predict", "forecast each node's next hour from its last 24 hours");
  auto* ev = app.add_subcommand("evaluate", "MAE and RMSE on the final day beside persistence and seasonal naive");
  for (auto* c : {tr, pr, ev}) add_source(c, o);
  for (auto* c : {tr, ev}) c->add_option("--days", o.days, "days of history to read from Prometheus")->capture_default_str();
  tr->add_option("--epochs", o.train.max_epochs, "most epochs")->capture_default_str();
  tr->add_option("--batch", o.train.batch, "windows per mini-batch")->capture_default_str();
  tr->add_option("--lr", o.train.lr, "Adam learning rate")->capture_default_str();
  tr->add_option("--patience", o.train.patience, "epochs without a better held-out loss before stopping")->capture_default_str();
  tr->add_option("--seed", o.train.seed, "initialisation and batch order")->capture_default_str();
  tr->add_flag("--quiet", o.quiet, "no per-epoch progress");
  pr->add_option("--textfile", o.textfile, "write triax_node_predicted_utilisation gauges (node-exporter textfile)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The LSTM's ops are small (batch x 256 per step): threads cost more than they save, and
  // spinning pools starve on a shared machine. One thread unless OMP_NUM_THREADS says otherwise.
  if (!triax::omp_threads_chosen_by_user()) omp_set_num_threads(1);
  try {
    if (o.days <= 1) throw triax::ConfigError(fmt::format("--days {} must be at least 2", o.days));
    if (tr->parsed()) return train(o);
    if (pr->parsed()) return predict(o);
    return evaluate(o);
  } catch (const std::exception& e) {
    // docs/ERRORS.md: 2 bad flags, data or model (ConfigError), 3 a file or Prometheus that cannot
    // be read or reached (IoError), 1 anything else.
    const int code = triax::exit_code_for(e);
    std::fprintf(stderr, "triax-forecast: %s: %s\n", std::string(triax::exit_code_name(code)).c_str(), e.what());
    return code;
  }
}
