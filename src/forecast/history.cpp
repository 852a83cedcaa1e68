// The forecaster's history (include/triax/forecast/history.h): a small CSV reader that checks every
// field, Prometheus' query_range through cpp-httplib (where triax was built with it) parsed with
// nlohmann::json, and the windows, scaler and baselines the LSTM is trained and judged with.
#include "triax/forecast/history.h"

#if defined(TRIAX_HAVE_HTTP)
#include <httplib.h>
#endif
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include <fmt/ranges.h>

#include "triax/core/error.h"
#include "triax/plan/csv_table.h"

namespace triax::forecast {

namespace {

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// The whole text as one integer, or false.
template <class T>
bool whole_int(std::string_view s, T& v) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// The whole text as one double (a leading '+' allowed, as Prometheus writes "+Inf"), or false.
bool whole_double(std::string_view s, double& v) {
  if (s.size() > 1 && s.front() == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

// "YYYY-MM-DDTHH:MM:SSZ" as unix seconds, or false (a date that does not exist included).
bool iso_utc(std::string_view s, int64_t& t) {
  if (s.size() != 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != 'Z')
    return false;
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  if (!whole_int(s.substr(0, 4), y) || !whole_int(s.substr(5, 2), mo) || !whole_int(s.substr(8, 2), d) ||
      !whole_int(s.substr(11, 2), h) || !whole_int(s.substr(14, 2), mi) || !whole_int(s.substr(17, 2), sec))
    return false;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  t = static_cast<int64_t>(::timegm(&tm));
  // timegm normalises 2026-02-30 to March: such a date is refused, not moved.
  return tm.tm_year == y - 1900 && tm.tm_mon == mo - 1 && tm.tm_mday == d && tm.tm_hour == h && tm.tm_min == mi &&
         tm.tm_sec == sec;
}

// A CSV cell's time: the same two forms as parse_utc_time, refused as malformed data (IoError).
int64_t csv_time(std::string_view s, const std::string& where) {
  int64_t t = 0;
  if (whole_int(s, t) || iso_utc(s, t)) return t;
  TRIAX_THROW(IoError, "{}: timestamp '{}' is neither unix seconds nor ISO 8601 UTC (2026-11-25T13:00:00Z)", where, s);
}

double csv_value(std::string_view s, int feature, const std::string& where) {
  double v = 0;
  if (!whole_double(s, v))
    TRIAX_THROW(IoError, "{}: {} '{}' is not a number", where, kFeatureNames[feature], s);
  if (std::isnan(v)) TRIAX_THROW(IoError, "{}: {} is NaN", where, kFeatureNames[feature]);
  if (!std::isfinite(v)) TRIAX_THROW(IoError, "{}: {} '{}' is infinite", where, kFeatureNames[feature], s);
  return v;
}

struct CsvCell {
  Row row;
  int line;
};
using CsvNodes = std::map<std::string, std::map<int64_t, CsvCell>>;

void add_csv_row(CsvNodes& nodes, const std::vector<std::string>& f, const std::string& path, int lineno) {
  const std::string where = fmt::format("{}:{}", path, lineno);
  const int64_t t = csv_time(f[0], where);
  if (t % kHour != 0)
    TRIAX_THROW(IoError, "{}: timestamp '{}' ({}) is not on the hour", where, f[0], utc_hour_string(t));
  if (f[1].empty()) TRIAX_THROW(IoError, "{}: empty node name", where);
  Row row{};
  for (int i = 0; i < kFeatures; ++i) row[i] = csv_value(f[2 + i], i, where);
  auto [it, fresh] = nodes[std::string(f[1])].try_emplace(t, CsvCell{row, lineno});
  if (!fresh)
    TRIAX_THROW(IoError, "{}: node '{}' hour {} repeats line {}", where, f[1], utc_hour_string(t),
                it->second.line);
}

NodeSeries csv_series(const std::string& name, const std::map<int64_t, CsvCell>& hours, const std::string& path) {
  NodeSeries s{name, hours.begin()->first, {}};
  int64_t expect = s.start;
  for (const auto& [t, cell] : hours) {
    if (t != expect)
      TRIAX_THROW(IoError, "{}:{}: node '{}' has a gap: {} hour(s) missing from {} to {}", path, cell.line,
                  name, (t - expect) / kHour, utc_hour_string(expect), utc_hour_string(t - kHour));
    s.rows.push_back(cell.row);
    expect = t + kHour;
  }
  return s;
}

}  // namespace

int64_t parse_utc_time(std::string_view text, std::string_view what) {
  int64_t t = 0;
  if (whole_int(text, t) || iso_utc(text, t)) return t;
  TRIAX_THROW(ConfigError, "{} '{}' is neither unix seconds nor ISO 8601 UTC (2026-11-25T13:00:00Z)", what, text);
}

History read_csv(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) TRIAX_THROW(IoError, "cannot read {}: it is a directory", path);
  // The project's one CSV reader: the header, trimmed cells, the number of fields, '#' comments and
  // blank lines, file:line in every message.
  static const std::vector<std::string> kColumns{"timestamp", "node", "compute", "memory_bw", "latency", "iops"};
  CsvNodes nodes;
  plan::read_csv_table(path, kColumns, "the history CSV",
                       [&](const std::vector<std::string>& cells, int line) { add_csv_row(nodes, cells, path, line); });
  History h{{}, path};
  for (const auto& [name, hours] : nodes) h.nodes.push_back(csv_series(name, hours, path));
  return h;
}

// ---- Prometheus ----

PrometheusSource default_prometheus_source(std::string url) {
  PrometheusSource s;
  s.url = std::move(url);
  s.queries = {"avg by (host) (avg_over_time(triax_node_compute_utilisation[1h]))",
               "avg by (host) (avg_over_time(triax_node_memory_bw_utilisation[1h]))",
               "avg by (host) (avg_over_time(triax_probe_latency_seconds[1h]))",
               "avg by (host) (avg_over_time(triax_probe_read_iops[1h]))"};
  return s;
}

void set_query(PrometheusSource& src, std::string_view name_eq_promql) {
  const size_t eq = name_eq_promql.find('=');
  const std::string_view name = trim(name_eq_promql.substr(0, eq));
  const std::string_view promql = eq == std::string_view::npos ? std::string_view{} : trim(name_eq_promql.substr(eq + 1));
  const auto it = std::find(kFeatureNames.begin(), kFeatureNames.end(), name);
  if (eq == std::string_view::npos || it == kFeatureNames.end() || promql.empty())
    TRIAX_THROW(ConfigError, "query '{}': expected NAME=PROMQL with NAME one of {} and a non-empty PROMQL",
                name_eq_promql, fmt::join(kFeatureNames, ", "));
  src.queries[static_cast<size_t>(it - kFeatureNames.begin())] = std::string(promql);
}

namespace {

struct PromUrl {
  std::string host_port;  // "http://HOST:PORT" for the client
  std::string prefix;     // "" or "/path" without a trailing '/'
};

PromUrl parse_prometheus_url(const std::string& url) {
  constexpr std::string_view scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    TRIAX_THROW(ConfigError, "Prometheus URL '{}': https is not supported; use http://HOST:PORT (e.g. through a "
                "local proxy)", url);
  if (url.rfind(scheme, 0) != 0)
    TRIAX_THROW(ConfigError, "Prometheus URL '{}': expected http://HOST:PORT[/PREFIX]", url);
  const std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  PromUrl u{std::string(scheme) + rest.substr(0, slash), slash == std::string::npos ? "" : rest.substr(slash)};
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  const std::string hp = rest.substr(0, slash);
  const size_t bracket = hp.rfind(']');
  const size_t colon = hp.find(':', bracket == std::string::npos ? 0 : bracket);
  uint16_t port = 80;
  if (hp.empty() || colon == 0 || (colon != std::string::npos && (!whole_int(std::string_view(hp).substr(colon + 1), port) || port == 0)))
    TRIAX_THROW(ConfigError, "Prometheus URL '{}': expected http://HOST:PORT[/PREFIX] with a port in 1..65535", url);
  return u;
}

// One feature's series by node: the value per hour of [start, end] (NaN where missing).
struct FeatureSeries {
  std::map<std::string, std::vector<double>> by_node;
  std::map<std::string, std::vector<bool>> seen;
};

struct FeatureQuery {
  const PrometheusSource& src;
  int feature;
  int64_t start;
  int64_t end;
  std::string what() const {
    return fmt::format("feature '{}' (query '{}')", kFeatureNames[feature], src.queries[feature]);
  }
  int64_t hours() const { return (end - start) / kHour + 1; }
};

double sample_value(const nlohmann::json& v, const FeatureQuery& q, const std::string& node, int64_t t) {
  double x = 0;
  if (!v.is_string() || !whole_double(v.get<std::string>(), x))
    TRIAX_THROW(IoError, "Prometheus at {}: {} node '{}' at {}: sample {} is not a number", q.src.url, q.what(),
                node, utc_hour_string(t), v.dump());
  if (!std::isfinite(x))
    TRIAX_THROW(IoError, "Prometheus at {}: {} node '{}' at {}: the sample is {}", q.src.url, q.what(), node,
                utc_hour_string(t), std::isnan(x) ? "NaN" : "infinite");
  return x;
}

void add_series(FeatureSeries& fs, const nlohmann::json& series, const FeatureQuery& q) {
  const auto& metric = series.value("metric", nlohmann::json::object());
  if (!metric.contains(q.src.node_label) || !metric[q.src.node_label].is_string())
    TRIAX_THROW(IoError, "Prometheus at {}: {} returned a series without the node label '{}': {} (aggregate it "
                "by {})", q.src.url, q.what(), q.src.node_label, metric.dump(), q.src.node_label);
  const std::string node = metric[q.src.node_label].get<std::string>();
  if (fs.by_node.count(node))
    TRIAX_THROW(IoError, "Prometheus at {}: {} returned more than one series for node '{}' (aggregate it by {})",
                q.src.url, q.what(), node, q.src.node_label);
  auto& vals = fs.by_node[node];
  auto& seen = fs.seen[node];
  vals.assign(static_cast<size_t>(q.hours()), 0.0);
  seen.assign(static_cast<size_t>(q.hours()), false);
  for (const auto& pair : series.value("values", nlohmann::json::array())) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number())
      TRIAX_THROW(IoError, "Prometheus at {}: {} node '{}': malformed sample {}", q.src.url, q.what(), node,
                  pair.dump());
    const auto t = static_cast<int64_t>(std::llround(pair[0].get<double>()));
    if (t < q.start || t > q.end || (t - q.start) % kHour != 0)
      TRIAX_THROW(IoError, "Prometheus at {}: {} node '{}': sample at {} is not an hour of {} .. {}", q.src.url,
                  q.what(), node, t, utc_hour_string(q.start), utc_hour_string(q.end));
    const auto k = static_cast<size_t>((t - q.start) / kHour);
    vals[k] = sample_value(pair[1], q, node, t);
    seen[k] = true;
  }
}

void check_complete(const FeatureSeries& fs, const FeatureQuery& q) {
  if (fs.by_node.empty())
    TRIAX_THROW(IoError, "Prometheus at {}: {} returned no series for {} .. {}", q.src.url, q.what(),
                utc_hour_string(q.start), utc_hour_string(q.end));
  for (const auto& [node, seen] : fs.seen) {
    const auto have = std::count(seen.begin(), seen.end(), true);
    if (have == q.hours()) continue;
    const auto first = std::find(seen.begin(), seen.end(), false) - seen.begin();
    TRIAX_THROW(IoError, "Prometheus at {}: node '{}' has {} of {} hours of {} in {} .. {}; the first missing is {}",
                q.src.url, node, have, q.hours(), q.what(), utc_hour_string(q.start), utc_hour_string(q.end),
                utc_hour_string(q.start + first * kHour));
  }
}

// (Unused where triax is built without cpp-httplib.)
[[maybe_unused]] FeatureSeries parse_query_range(const std::string& body, const FeatureQuery& q) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_object())
    TRIAX_THROW(IoError, "Prometheus at {}: {}: the answer is not a query_range JSON object: {:.200}", q.src.url,
                q.what(), body);
  const auto& data = j["data"];
  const std::string type = data.contains("resultType") ? data["resultType"].dump() : "(none)";
  if (type != "\"matrix\"")
    TRIAX_THROW(IoError, "Prometheus at {}: {}: resultType {}, expected \"matrix\"", q.src.url, q.what(), type);
  FeatureSeries fs;
  try {  // a field of the wrong JSON type (a result that is no array, a series no object) throws here
    for (const auto& series : data.value("result", nlohmann::json::array())) add_series(fs, series, q);
  } catch (const nlohmann::json::exception& e) {
    TRIAX_THROW(IoError, "Prometheus at {}: {}: malformed query_range answer ({}): {:.200}", q.src.url, q.what(),
                e.what(), body);
  }
  check_complete(fs, q);
  return fs;
}

#if defined(TRIAX_HAVE_HTTP)
std::string prometheus_error_text(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_string())
    return j["error"].get<std::string>();
  return fmt::format("{:.200}", body);
}

// httplib's error names ("Connection", "Read") said in words, with the timeout that applied.
std::string transport_error(httplib::Error e, const PrometheusSource& src) {
  switch (e) {
    case httplib::Error::Connection:
      return "the connection failed (nothing listens there, or the host is unreachable)";
    case httplib::Error::ConnectionTimeout:
      return fmt::format("no connection within --http-timeout {} s", src.timeout_s);
    case httplib::Error::Read:
      return fmt::format("no answer within --http-timeout {} s (or the connection was closed)", src.timeout_s);
    case httplib::Error::Write: return "the request could not be sent (the connection was closed)";
    default: return fmt::format("{} (httplib)", httplib::to_string(e));
  }
}

std::string fetch_query_range(httplib::Client& cli, const PromUrl& u, const FeatureQuery& q) {
  const httplib::Params params{{"query", q.src.queries[q.feature]},
                               {"start", std::to_string(q.start)},
                               {"end", std::to_string(q.end)},
                               {"step", std::to_string(kHour)}};
  auto res = cli.Get(u.prefix + "/api/v1/query_range", params, httplib::Headers{});
  if (!res) TRIAX_THROW(IoError, "cannot reach Prometheus at {}: {}", q.src.url, transport_error(res.error(), q.src));
  // 400 and 422 are Prometheus refusing the query (bad PromQL, a range it will not evaluate): the
  // user's input, exit 2 like other bad input; anything else is the server's trouble.
  if (res->status == 400 || res->status == 422)
    TRIAX_THROW(ConfigError, "Prometheus at {} refused {} (HTTP {}): {}", q.src.url, q.what(), res->status,
                prometheus_error_text(res->body));
  if (res->status != 200)
    TRIAX_THROW(IoError, "Prometheus at {} answered HTTP {} for {}: {}", q.src.url, res->status, q.what(),
                prometheus_error_text(res->body));
  return res->body;
}
#endif

std::vector<FeatureSeries> fetch_features(const PrometheusSource& src, int64_t start, int64_t end) {
  const PromUrl u = parse_prometheus_url(src.url);
#if defined(TRIAX_HAVE_HTTP)
  httplib::Client cli(u.host_port);
  const auto us = static_cast<int64_t>(std::llround(src.timeout_s * 1e6));
  cli.set_connection_timeout(us / 1000000, us % 1000000);
  cli.set_read_timeout(us / 1000000, us % 1000000);
  cli.set_write_timeout(us / 1000000, us % 1000000);
  std::vector<FeatureSeries> out;
  for (int f = 0; f < kFeatures; ++f) {
    const FeatureQuery q{src, f, start, end};
    out.push_back(parse_query_range(fetch_query_range(cli, u, q), q));
  }
  return out;
#else
  (void)u;
  TRIAX_THROW(ConfigError, "cannot query Prometheus at {}: triax was built without cpp-httplib "
              "(libcpp-httplib-dev); read the history from a CSV instead", src.url);
#endif
}

void check_same_nodes(const std::vector<FeatureSeries>& fs, const std::string& url) {
  for (int f = 1; f < kFeatures; ++f)
    for (int g : {0, f})
      for (const auto& [node, v] : fs[g].by_node)
        if (!fs[g == 0 ? f : 0].by_node.count(node))
          TRIAX_THROW(IoError, "Prometheus at {}: the nodes differ between the features: '{}' has {} but not {}",
                      url, node, kFeatureNames[g], kFeatureNames[g == 0 ? f : 0]);
}

}  // namespace

History query_prometheus(const PrometheusSource& src, int64_t start, int64_t end) {
  if (start % kHour != 0 || end % kHour != 0 || start > end)
    TRIAX_THROW(ConfigError, "Prometheus range {} .. {}: start and end must be whole hours with start <= end", start,
                end);
  if (!(src.timeout_s > 0) || !std::isfinite(src.timeout_s))
    TRIAX_THROW(ConfigError, "Prometheus HTTP timeout {} s: expected a positive number of seconds", src.timeout_s);
  const auto fs = fetch_features(src, start, end);
  check_same_nodes(fs, src.url);
  History h{{}, src.url};
  for (const auto& [node, compute] : fs[0].by_node) {  // std::map: sorted by node name
    NodeSeries s{node, start, std::vector<Row>(compute.size())};
    for (size_t k = 0; k < compute.size(); ++k)
      for (int f = 0; f < kFeatures; ++f) s.rows[k][f] = fs[f].by_node.at(node)[k];
    h.nodes.push_back(std::move(s));
  }
  return h;
}

// ---- windows, scaler, baselines ----

void require_hours(const History& h, int hours, std::string_view purpose) {
  std::string few;
  for (const auto& n : h.nodes)
    if (static_cast<int64_t>(n.rows.size()) < hours)
      few += fmt::format("{}'{}' ({} hours)", few.empty() ? "" : ", ", n.node, n.rows.size());
  if (h.nodes.empty()) TRIAX_THROW(IoError, "{}: {} has no nodes", purpose, h.source);
  if (!few.empty())
    TRIAX_THROW(IoError, "{} needs at least {} hours of history per node; {} has too few for {}", purpose, hours,
                h.source, few);
}

Scaler Scaler::fit(const History& h, int64_t before) {
  Scaler s;
  int64_t n = 0;
  for (const auto& node : h.nodes)
    for (size_t k = 0; k < node.rows.size() && node.start + static_cast<int64_t>(k) * kHour < before; ++k, ++n)
      for (int f = 0; f < kFeatures; ++f) s.mean[f] += node.rows[k][f];
  if (n == 0)
    TRIAX_THROW(IoError, "no hour of {} is before {}: nothing to fit the feature scaler on", h.source,
                utc_hour_string(before));
  for (auto& m : s.mean) m /= static_cast<double>(n);
  for (const auto& node : h.nodes)
    for (size_t k = 0; k < node.rows.size() && node.start + static_cast<int64_t>(k) * kHour < before; ++k)
      for (int f = 0; f < kFeatures; ++f) s.std[f] += (node.rows[k][f] - s.mean[f]) * (node.rows[k][f] - s.mean[f]);
  for (auto& sd : s.std) {
    sd = std::sqrt(sd / static_cast<double>(n));
    if (sd < 1e-12) sd = 1;
  }
  return s;
}

namespace {

// The window of node rows [k - 24, k) predicting hour k (rows[k] when known, else NaN and y 0).
void append_window(Windows& w, const NodeSeries& n, size_t k, const Scaler& s) {
  for (size_t j = k - kWindowHours; j < k; ++j)
    for (int f = 0; f < kFeatures; ++f) w.x.push_back(static_cast<float>(s.standardise(n.rows[j][f], f)));
  const bool known = k < n.rows.size();
  const double target = known ? n.rows[k][kTargetFeature] : std::numeric_limits<double>::quiet_NaN();
  w.y.push_back(known ? static_cast<float>(s.standardise(target, kTargetFeature)) : 0.0f);
  w.target.push_back(target);
  w.persistence.push_back(n.rows[k - 1][kTargetFeature]);
  w.seasonal.push_back(n.rows[k - kWindowHours][kTargetFeature]);
  w.node.push_back(n.node);
  w.target_time.push_back(n.start + static_cast<int64_t>(k) * kHour);
  ++w.count;
}

}  // namespace

WindowSplit make_windows(const History& h, const Scaler& s, int64_t split) {
  WindowSplit out;
  for (const auto& n : h.nodes)
    for (size_t k = kWindowHours; k < n.rows.size(); ++k)
      append_window(n.start + static_cast<int64_t>(k) * kHour < split ? out.train : out.holdout, n, k, s);
  return out;
}

int64_t holdout_start(const History& h) {
  if (h.nodes.empty()) TRIAX_THROW(IoError, "{} has no nodes: no held-out day", h.source);
  int64_t last = std::numeric_limits<int64_t>::min();
  for (const auto& n : h.nodes) last = std::max(last, n.end());
  return last - kWindowHours * kHour;
}

Windows latest_windows(const History& h, const Scaler& s) {
  require_hours(h, kWindowHours, "a forecast");
  Windows w;
  for (const auto& n : h.nodes) append_window(w, n, n.rows.size(), s);
  return w;
}

ErrorStats error_stats(std::span<const double> predicted, std::span<const double> truth) {
  if (predicted.size() != truth.size() || truth.empty())
    TRIAX_THROW(ConfigError, "error statistics need as many predictions as true values, at least one: {} and {}",
                predicted.size(), truth.size());
  ErrorStats e;
  for (size_t i = 0; i < truth.size(); ++i) {
    const double d = predicted[i] - truth[i];
    e.mae += std::abs(d);
    e.rmse += d * d;
  }
  e.n = static_cast<int64_t>(truth.size());
  e.mae /= static_cast<double>(e.n);
  e.rmse = std::sqrt(e.rmse / static_cast<double>(e.n));
  return e;
}

std::string utc_hour_string(int64_t unix_seconds) {
  const auto t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  if (!::gmtime_r(&t, &tm)) return std::to_string(unix_seconds);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace triax::forecast
