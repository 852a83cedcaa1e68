// ASCII time lines and Chrome-trace JSON from timed events (simulated or measured).
#include "triax/pipeline/schedule_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "triax/core/error.h"

namespace triax {

namespace {
std::string kind_of(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "F";
    case PipeOp::backward: return "BW";
    case PipeOp::backward_input: return "B";
    case PipeOp::backward_weight: return "W";
    default: return "P2P";
  }
}

char glyph(const TimedEvent& e) {
  char g = '#';
  if (e.kind == "F") g = 'F';
  else if (e.kind == "B" || e.kind == "BW") g = 'B';
  else if (e.kind == "W") g = 'W';
  if (g != '#' && e.chunk >= 0 && e.chunk % 2 == 1) g = static_cast<char>(std::tolower(g));
  return g;
}

void check_event(const TimedEvent& e, int ranks) {
  if (e.rank < 0 || e.rank >= ranks)
    TRIAX_THROW(ConfigError, "timed event '{}' is on rank {}, expected 0 <= rank < {}", e.name, e.rank, ranks);
  if (!(e.duration >= 0) || !std::isfinite(e.start))
    TRIAX_THROW(ConfigError, "timed event '{}' on rank {} has start {} and duration {}, expected a finite start and a "
                "duration >= 0", e.name, e.rank, e.start, e.duration);
}
}  // namespace

std::vector<TimedEvent> timeline_events(const Schedule& s, const SimResult& r) {
  std::vector<TimedEvent> out;
  for (int st = 0; st < static_cast<int>(r.timeline.size()); ++st)
    for (const auto& t : r.timeline[st])
      out.push_back({st, short_name(t.instr, s.chunks), kind_of(t.instr.op), t.start, t.end - t.start, t.instr.mb,
                     t.instr.chunk, true});
  return out;
}

BubbleStats bubble_stats(const std::vector<TimedEvent>& events, int ranks) {
  if (ranks < 1) TRIAX_THROW(ConfigError, "bubble_stats needs at least one rank, got {}", ranks);
  BubbleStats b;
  b.busy.assign(static_cast<size_t>(ranks), 0.0);
  double t0 = std::numeric_limits<double>::infinity(), t1 = -std::numeric_limits<double>::infinity();
  for (const auto& e : events) {
    check_event(e, ranks);
    t0 = std::min(t0, e.start);
    t1 = std::max(t1, e.start + e.duration);
    if (e.compute) b.busy[static_cast<size_t>(e.rank)] += e.duration;
  }
  b.makespan = events.empty() ? 0.0 : t1 - t0;
  for (double busy : b.busy) b.idle.push_back(b.makespan - busy);
  return b;
}

std::string ascii_timeline(const std::vector<TimedEvent>& events, int ranks, const AsciiOptions& opts) {
  if (ranks < 1) TRIAX_THROW(ConfigError, "ascii_timeline needs at least one rank, got {}", ranks);
  if (opts.max_width < 1) TRIAX_THROW(ConfigError, "ascii_timeline: max_width must be >= 1, got {}", opts.max_width);
  if (events.empty()) return "(no events)\n";
  double t0 = std::numeric_limits<double>::infinity(), t1 = -t0, shortest = t0;
  for (const auto& e : events) {
    check_event(e, ranks);
    t0 = std::min(t0, e.start);
    t1 = std::max(t1, e.start + e.duration);
    if (e.duration > 0) shortest = std::min(shortest, e.duration);
  }
  const double span = t1 - t0;
  double unit = opts.unit > 0 ? opts.unit : (std::isfinite(shortest) ? shortest : 1.0);
  if (span / unit > opts.max_width) unit = span / opts.max_width;
  const int width = std::max(1, static_cast<int>(std::ceil(span / unit - 1e-9)));
  std::vector<std::string> rows(static_cast<size_t>(ranks), std::string(static_cast<size_t>(width), '.'));
  std::vector<std::string> mbs(static_cast<size_t>(ranks), std::string(static_cast<size_t>(width), ' '));
  for (const auto& e : events) {
    // Cell k covers [t0 + k*unit, t0 + (k+1)*unit); it shows the event covering its midpoint.
    const auto cell = [&](double t) { return static_cast<int>(std::ceil((t - t0) / unit - 0.5 - 1e-9)); };
    const int k0 = std::max(0, cell(e.start)), k1 = std::min(width, cell(e.start + e.duration));
    for (int k = k0; k < k1; ++k) {
      rows[e.rank][static_cast<size_t>(k)] = glyph(e);
      mbs[e.rank][static_cast<size_t>(k)] = e.mb >= 0 ? static_cast<char>('0' + e.mb % 10) : ' ';
    }
  }
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    out += fmt::format("stage {:>2} |{}|\n", r, rows[r]);
    if (opts.show_mb) out += fmt::format("   mb    |{}|\n", mbs[r]);
  }
  out += fmt::format("one character = {:g} time units; F forward, B backward (full or input-gradient), W weight "
                     "gradient, lower case odd chunks, # other, . idle\n", unit);
  return out;
}

std::string chrome_trace_json(const std::vector<TimedEvent>& events, double us_per_unit) {
  if (!(us_per_unit > 0)) TRIAX_THROW(ConfigError, "chrome trace: microseconds per unit must be > 0, got {}", us_per_unit);
  using nlohmann::json;
  json trace = json::array();
  trace.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "triax pipeline"}}}});
  int max_rank = -1;
  for (const auto& e : events) {
    if (e.rank < 0)
      TRIAX_THROW(ConfigError, "timed event '{}' is on rank {}, expected >= 0", e.name, e.rank);
    max_rank = std::max(max_rank, e.rank);
  }
  for (int r = 0; r <= max_rank; ++r) {
    trace.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                     {"args", {{"name", fmt::format("stage {}", r)}}}});
    trace.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", r}, {"args", {{"sort_index", r}}}});
  }
  for (const auto& e : events) {
    check_event(e, max_rank + 1);
    json ev = {{"name", e.name}, {"cat", e.kind}, {"ph", "X"}, {"pid", 0}, {"tid", e.rank},
               {"ts", e.start * us_per_unit}, {"dur", e.duration * us_per_unit}};
    json args = json::object();
    if (e.mb >= 0) args["mb"] = e.mb;
    if (e.chunk >= 0) args["chunk"] = e.chunk;
    args["compute"] = e.compute;
    ev["args"] = std::move(args);
    trace.push_back(std::move(ev));
  }
  json doc = {{"traceEvents", std::move(trace)}, {"displayTimeUnit", "ms"}};
  return doc.dump();
}

void write_chrome_trace(const std::string& path, const std::vector<TimedEvent>& events, double us_per_unit) {
  const std::string text = chrome_trace_json(events, us_per_unit);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) TRIAX_THROW(IoError, "cannot open '{}' for writing the Chrome trace", path);
  f << text << '\n';
  f.close();
  if (!f) TRIAX_THROW(IoError, "writing the Chrome trace to '{}' failed", path);
}

}  // namespace triax
