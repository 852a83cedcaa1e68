// The forecaster's data (triax-forecast, docs/CLUSTER.md "Predictive scheduling"): per-node hourly
// history of four features read from a CSV or from Prometheus' HTTP API, the 24-hour windows the
// LSTM reads, the feature standardisation saved with the model, and the baselines it is judged
// against. Every row is checked when read: a history that reaches the model is hourly, gap-free
// and finite.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace triax::forecast {

inline constexpr int kFeatures = 4;
inline constexpr int kWindowHours = 24;
inline constexpr int64_t kHour = 3600;
// The features in the model's order: the CSV columns after `timestamp,node`, and the names of
// the Prometheus queries (--query NAME=PROMQL).
inline constexpr std::array<std::string_view, kFeatures> kFeatureNames{"compute", "memory_bw", "latency", "iops"};
// What is forecast: the next hour's compute utilisation (feature 0, a fraction in [0, 1]).
inline constexpr int kTargetFeature = 0;

using Row = std::array<double, kFeatures>;

// One node's history: rows[k] belongs to the time start + k * kHour. In a CSV that is the row's
// timestamp (the hour it starts, by the usual convention); from Prometheus it is the evaluation
// time of the hourly query_range step, so with the default avg_over_time(...[1h]) queries the
// hour that *ends* there. Either way the forecast is for the next step's time, end().
struct NodeSeries {
  std::string node;
  int64_t start = 0;      // unix seconds, a multiple of kHour
  std::vector<Row> rows;  // consecutive hours, every value finite
  int64_t end() const { return start + static_cast<int64_t>(rows.size()) * kHour; }  // one past the last hour
};

struct History {
  std::vector<NodeSeries> nodes;  // sorted by node name, unique names
  std::string source;             // "PATH" of the CSV or the Prometheus URL (for messages and model metadata)
};

// CSV, header exactly `timestamp,node,compute,memory_bw,latency,iops`, read by the project's CSV
// reader (plan/csv_table.h: cells trimmed, '#' comments and blank lines skipped); timestamp as unix
// seconds or ISO 8601 UTC (2026-11-25T13:00:00Z); rows in any order. Malformed data is an IoError
// (exit 3, docs/ERRORS.md) naming PATH:LINE and the problem: a missing or other header, a wrong
// number of fields, an empty node name, a value that is not a number, NaN or infinite, a
// timestamp not on the hour, a repeated (node, hour), a gap in a node's hours (the node, the first
// missing hour, how many), no data rows; and a file that cannot be read.
History read_csv(const std::string& path);

// Where Prometheus is and what to ask it: one PromQL query per feature, each returning one series
// per node told apart by node_label.
struct PrometheusSource {
  std::string url;                             // http://HOST:PORT, optionally with a path prefix
  std::array<std::string, kFeatures> queries;  // in kFeatureNames order
  std::string node_label = "host";
  double timeout_s = 10;                       // per HTTP request
};
// The default queries: the hourly mean of the node gauges that clusters/prometheus/triax_forecast_rules.yml
// records (triax_node_compute_utilisation, triax_node_memory_bw_utilisation) and of triax-probe's
// (triax_probe_latency_seconds, triax_probe_read_iops), averaged by `host`.
PrometheusSource default_prometheus_source(std::string url);
// Replaces one query from "NAME=PROMQL" (NAME one of kFeatureNames); ConfigError naming the text otherwise.
void set_query(PrometheusSource& src, std::string_view name_eq_promql);

// GET /api/v1/query_range per feature with step 3600 over the hours [start, end] (both multiples
// of kHour, start <= end). Errors, each one message naming what is wrong: IoError when Prometheus
// cannot be reached (the URL and the reason) or answers with a server error (the status and
// Prometheus' own error text), and for an answer that is malformed data: a result that is not a
// matrix, a series without node_label, no series at all (the feature, its query and the range), a node missing some hours
// of the range (the node, the feature, how many of how many hours, the first missing one), a NaN
// or infinite sample (the node, the feature, the hour), nodes that differ between the features.
// ConfigError (the user's flags) when it refuses the query (HTTP 400/422: bad PromQL, with its
// error text), for a bad URL or range.
History query_prometheus(const PrometheusSource& src, int64_t start, int64_t end);

// IoError (too little data) naming every node with fewer than `hours` rows (and how many it has), for `purpose`
// ("train", "predict", ...).
void require_hours(const History& h, int hours, std::string_view purpose);

// Feature standardisation, saved with the model (scaler.mean, scaler.std): z = (v - mean) / std.
struct Scaler {
  Row mean{};
  Row std{};
  // Mean and population standard deviation over every row of every node whose hour is < before;
  // a feature whose std is below 1e-12 (constant) gets std 1. IoError when no row qualifies.
  static Scaler fit(const History& h, int64_t before);
  double standardise(double v, int feature) const { return (v - mean[feature]) / std[feature]; }
  // A standardised target back to utilisation: z * std[kTargetFeature] + mean[kTargetFeature].
  double target_from_standard(double z) const { return z * std[kTargetFeature] + mean[kTargetFeature]; }
};

// Windows of 24 hours x 4 features, each with the hour after it as the target.
struct Windows {
  int64_t count = 0;
  std::vector<float> x;              // (count, 24, 4) standardised: window, hour, feature
  std::vector<float> y;              // (count) standardised target
  std::vector<double> target;        // (count) the target hour's compute utilisation (NaN: not known yet)
  std::vector<double> persistence;   // (count) baseline: compute at the window's last hour
  std::vector<double> seasonal;      // (count) baseline: compute 24 hours before the target hour
  std::vector<std::string> node;     // (count)
  std::vector<int64_t> target_time;  // (count) unix seconds of the predicted hour
};

struct WindowSplit {
  Windows train;    // windows whose target hour is before `split`
  Windows holdout;  // the others
};
// Every window of every node (a node of R rows gives R - 24), in node then time order.
WindowSplit make_windows(const History& h, const Scaler& s, int64_t split);
// The held-out final day: the latest end() over the nodes minus 24 hours.
int64_t holdout_start(const History& h);
// One window per node, its last 24 hours, predicting the hour at end() (target NaN, y 0).
Windows latest_windows(const History& h, const Scaler& s);

struct ErrorStats {
  double mae = 0;
  double rmse = 0;
  int64_t n = 0;
};
// Mean absolute and root mean squared error; ConfigError for different lengths or none.
ErrorStats error_stats(std::span<const double> predicted, std::span<const double> truth);

// "2026-11-25T13:00:00Z"
std::string utc_hour_string(int64_t unix_seconds);
// Unix seconds from "1764072000" or "2026-11-25T13:00:00Z" (a date that does not exist refused);
// ConfigError "WHAT 'TEXT' is neither unix seconds nor ISO 8601 UTC ..." otherwise.
int64_t parse_utc_time(std::string_view text, std::string_view what);

}  // namespace triax::forecast
