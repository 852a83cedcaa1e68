// Resource score arithmetic and its renderers.
#include "triax/probe/score.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/io/prometheus_text.h"

namespace triax::probe {

void ScoreWeights::validate() const {
  const double all[4] = {compute, memory, latency, iops};
  for (double x : all)
    require(std::isfinite(x) && x >= 0, "score weights must be finite and >= 0 (compute {} memory {} latency {} iops {})",
            compute, memory, latency, iops);
  require(compute + memory + latency + iops > 0, "score weights sum to 0: nothing to score");
}

double median(std::vector<double> v) {
  require(!v.empty(), "median of no values");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<NodeScore> score_nodes(const std::vector<NodeMeasure>& nodes, const ScoreWeights& w,
                                   double straggler_threshold) {
  w.validate();
  require(!nodes.empty(), "no node measurements to score");
  std::vector<double> c, m, l, io;
  for (const auto& n : nodes) {
    const std::pair<const char*, double> fields[] = {
        {"gemm_flops", n.gemm_flops}, {"triad_bytes_s", n.triad_bytes_s}, {"latency_s", n.latency_s}, {"read_iops", n.read_iops}};
    for (const auto& [name, v] : fields)
      require(std::isfinite(v) && v > 0, "node {} (rank {}): measurement {} = {} must be > 0", n.host, n.rank, name, v);
    c.push_back(n.gemm_flops);
    m.push_back(n.triad_bytes_s);
    l.push_back(n.latency_s);
    io.push_back(n.read_iops);
  }
  const double mc = median(c), mm = median(m), ml = median(l), mio = median(io);
  const double wsum = w.compute + w.memory + w.latency + w.iops;
  std::vector<NodeScore> out;
  for (const auto& n : nodes) {
    NodeScore s;
    s.m = n;
    s.compute = n.gemm_flops / mc;
    s.memory = n.triad_bytes_s / mm;
    s.latency = ml / n.latency_s;  // inverted: half the median latency scores 2
    s.iops = n.read_iops / mio;
    s.score = (w.compute * s.compute + w.memory * s.memory + w.latency * s.latency + w.iops * s.iops) / wsum;
    s.straggler = s.score < straggler_threshold;
    s.placement = s.score;
    out.push_back(s);
  }
  return out;
}

namespace {

nlohmann::json parse_forecast_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw IoError(fmt::format("{}: cannot open the forecast", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: forecast is not JSON: {}", path, e.what()));
  }
  require(j.is_object() && j.contains("nodes") && j["nodes"].is_array(),
          "{}: forecast has no \"nodes\" array (write one with triax-forecast predict --json)", path);
  return j;
}

bool has_forecast(const std::vector<NodeScore>& s) {
  return std::any_of(s.begin(), s.end(), [](const NodeScore& x) { return !std::isnan(x.predicted); });
}

}  // namespace

Forecast read_forecast(const std::string& path) {
  const auto j = parse_forecast_file(path);
  Forecast out;
  for (size_t i = 0; i < j["nodes"].size(); ++i) {
    const auto& n = j["nodes"][i];
    require(n.is_object() && n.contains("node") && n["node"].is_string() && !n["node"].get<std::string>().empty(),
            "{}: forecast nodes[{}] has no \"node\" name", path, i);
    const auto host = n["node"].get<std::string>();
    require(n.contains("predicted_utilisation") && n["predicted_utilisation"].is_number(),
            "{}: forecast node {} has no number \"predicted_utilisation\"", path, host);
    const double p = n["predicted_utilisation"].get<double>();
    require(p >= 0 && p <= 1, "{}: forecast node {}: predicted_utilisation = {} is not in [0, 1]", path, host, p);
    require(out.emplace(host, p).second, "{}: forecast lists node {} twice", path, host);
  }
  return out;
}

void apply_forecast(std::vector<NodeScore>& scores, const Forecast& forecast) {
  std::set<std::string> missing, probed;
  for (const auto& x : scores) {
    probed.insert(x.m.host);
    if (!forecast.count(x.m.host)) missing.insert(x.m.host);
  }
  require(missing.empty(),
          "the forecast has no prediction for probed host(s) {}: re-run triax-forecast predict with history for "
          "every probed node",
          fmt::join(missing, ", "));
  std::vector<std::string> extra;
  for (const auto& [h, p] : forecast)
    if (!probed.count(h)) extra.push_back(h);
  if (!extra.empty()) log::warn("forecast host(s) not probed, ignored: {}", fmt::join(extra, ", "));
  for (auto& x : scores) {
    x.predicted = forecast.at(x.m.host);
    x.placement = x.score * (1 - x.predicted);
  }
}

std::string render_table(const std::vector<NodeScore>& s) {
  const bool fc = has_forecast(s);
  std::string t = fmt::format("{:>20} {:>5} {:>10} {:>10} {:>11} {:>10} {:>7} {:>7} {:>7} {:>7} {:>7}", "host", "rank",
                              "GFLOP/s", "triad GB/s", "latency us", "4K IOPS", "comp", "mem", "lat", "iops", "score");
  t += (fc ? fmt::format(" {:>7} {:>7}", "pred", "place") : std::string()) + "\n";
  for (const auto& x : s) {
    t += fmt::format("{:>20} {:>5} {:>10.1f} {:>10.2f} {:>11.2f} {:>10.0f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f}",
                     x.m.host, x.m.rank, x.m.gemm_flops / 1e9, x.m.triad_bytes_s / 1e9, x.m.latency_s * 1e6,
                     x.m.read_iops, x.compute, x.memory, x.latency, x.iops, x.score);
    if (fc) t += fmt::format(" {:>7.3f} {:>7.3f}", x.predicted, x.placement);
    t += fmt::format("  {}\n", x.straggler ? "STRAGGLER" : "");
  }
  return t;
}

std::string render_json(const std::vector<NodeScore>& s, const ScoreWeights& w, double threshold) {
  nlohmann::ordered_json j;
  j["weights"] = {{"compute", w.compute}, {"memory", w.memory}, {"latency", w.latency}, {"iops", w.iops}};
  j["straggler_threshold"] = threshold;
  j["nodes"] = nlohmann::ordered_json::array();
  const bool fc = has_forecast(s);
  for (const auto& x : s) {
    j["nodes"].push_back({{"host", x.m.host},
                          {"rank", x.m.rank},
                          {"gemm_flops", x.m.gemm_flops},
                          {"triad_bytes_per_second", x.m.triad_bytes_s},
                          {"latency_seconds", x.m.latency_s},
                          {"read_iops", x.m.read_iops},
                          {"terms", {{"compute", x.compute}, {"memory", x.memory}, {"latency", x.latency}, {"iops", x.iops}}},
                          {"score", x.score},
                          {"straggler", x.straggler}});
    if (fc) {
      j["nodes"].back()["predicted_utilisation"] = x.predicted;
      j["nodes"].back()["placement"] = x.placement;
    }
  }
  return j.dump(2) + "\n";
}

std::string render_prometheus(const std::vector<NodeScore>& s) {
  auto fam = [&](const char* name, const char* help, auto value) {
    prom::Family f{name, help, "gauge", {}};
    for (const auto& x : s) f.samples.push_back({{{"host", x.m.host}, {"rank", std::to_string(x.m.rank)}}, value(x)});
    return f;
  };
  std::vector<prom::Family> fams{
      fam("triax_probe_gemm_flops", "fp32 GEMM rate, FLOP/s", [](const NodeScore& x) { return x.m.gemm_flops; }),
      fam("triax_probe_triad_bytes_per_second", "STREAM triad bandwidth", [](const NodeScore& x) { return x.m.triad_bytes_s; }),
      fam("triax_probe_latency_seconds", "Mean of an 8-byte exchange with the peers and an 8-byte all-reduce",
          [](const NodeScore& x) { return x.m.latency_s; }),
      fam("triax_probe_read_iops", "Random 4 KiB reads per second", [](const NodeScore& x) { return x.m.read_iops; }),
      fam("triax_probe_score", "Resource score (1 = the cluster median)", [](const NodeScore& x) { return x.score; }),
      fam("triax_probe_straggler", "1 when the score is below the threshold",
          [](const NodeScore& x) { return x.straggler ? 1.0 : 0.0; }),
  };
  if (has_forecast(s))
    fams.push_back(fam("triax_probe_placement", "Resource score x (1 - predicted utilisation of the load forecast)",
                       [](const NodeScore& x) { return x.placement; }));
  return prom::render(fams);
}

std::string render_hostfile(const std::vector<NodeScore>& s, bool exclude_stragglers) {
  // One line per host: its worst rank's score decides (a node is as fast as its slowest part).
  // With a forecast the placement (score x (1 - predicted)) decides the order instead of the score.
  std::map<std::string, std::pair<double, int>> hosts;  // host -> (min placement, slots)
  std::map<std::string, bool> strag;
  std::map<std::string, double> pred;
  for (const auto& x : s) {
    auto [it, fresh] = hosts.try_emplace(x.m.host, x.placement, 0);
    it->second.first = std::min(it->second.first, x.placement);
    pred[x.m.host] = x.predicted;
    it->second.second += x.m.slots;
    strag[x.m.host] = strag[x.m.host] || x.straggler;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> order(hosts.begin(), hosts.end());
  std::stable_sort(order.begin(), order.end(), [&](const auto& a, const auto& b) {
    if (strag[a.first] != strag[b.first]) return !strag[a.first];
    return a.second.first > b.second.first;
  });
  const bool fc = has_forecast(s);
  std::string out = fc ? "# triax-probe: hosts by placement = score x (1 - predicted utilisation), best first\n"
                       : "# triax-probe: hosts by resource score, best first\n";
  for (const auto& [h, v] : order)
    out += fmt::format("{}{} slots={}  # {} {:.3f}{}{}\n", strag[h] && exclude_stragglers ? "# " : "", h, v.second,
                       fc ? "placement" : "score", v.first,
                       fc ? fmt::format(" predicted {:.3f}", pred[h]) : std::string(), strag[h] ? " straggler" : "");
  return out;
}

}  // namespace triax::probe
