// The timeline recorder (include/triax/core/trace.h): events in memory while on, Chrome-trace
// JSON out, and the merge of the per-rank files into one.
#include "triax/core/trace.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "triax/core/error.h"

namespace triax::trace {
namespace detail {
bool g_on = false;
}
namespace {
using Clock = std::chrono::steady_clock;
std::mutex g_mu;
std::vector<Event> g_events;
Clock::time_point g_origin = Clock::now();
int64_t g_step = -1;
constexpr int kRowsPerLane = 16;
}  // namespace

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::compute: return "compute";
    case Lane::p2p: return "p2p";
    case Lane::tp: return "tp";
    case Lane::dp: return "dp";
    case Lane::optimizer: return "optimizer";
    case Lane::step: return "step";
  }
  return "?";
}

void start() {
  std::lock_guard lk(g_mu);
  g_events.clear();
  g_origin = Clock::now();
  detail::g_on = true;
}

void start_at(double origin_s) {
  std::lock_guard lk(g_mu);
  g_events.clear();
  g_origin = Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(origin_s)));
  detail::g_on = true;
}

double steady_now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

void set_step(int64_t step) {
  std::lock_guard lk(g_mu);
  g_step = step;
}

void stop() { detail::g_on = false; }

double now_us() { return std::chrono::duration<double, std::micro>(Clock::now() - g_origin).count(); }

void record(Lane lane, std::string name, double ts_us, double end_us, int mb, int chunk, int64_t bytes) {
  std::lock_guard lk(g_mu);
  g_events.push_back({lane, std::move(name), ts_us, std::max(0.0, end_us - ts_us), mb, chunk, bytes, g_step});
}

std::vector<Event> events() {
  std::lock_guard lk(g_mu);
  return g_events;
}

std::string to_json(const std::vector<Event>& events, int pid, const std::string& process_name) {
  using nlohmann::json;
  std::vector<const Event*> sorted;
  for (const auto& e : events) sorted.push_back(&e);
  // By start, the longer first: a span that contains another comes before it (nesting is kept).
  std::stable_sort(sorted.begin(), sorted.end(), [](const Event* a, const Event* b) {
    return a->ts_us != b->ts_us ? a->ts_us < b->ts_us : a->dur_us > b->dur_us;
  });
  // Per lane, rows of open spans: an event goes on the first row where it nests inside (or
  // follows) the spans still open, so no row holds two spans that overlap without nesting.
  std::vector<std::vector<std::vector<double>>> open(kLanes);  // lane -> row -> stack of end times
  json evs = json::array();
  std::vector<int> rows_used(kLanes, 0);
  for (const Event* e : sorted) {
    const int l = static_cast<int>(e->lane);
    auto& rows = open[static_cast<size_t>(l)];
    const double end = e->ts_us + e->dur_us;
    size_t row = 0;
    for (; row < rows.size(); ++row) {
      auto& st = rows[row];
      while (!st.empty() && st.back() <= e->ts_us) st.pop_back();
      if (st.empty() || end <= st.back()) break;
    }
    if (row == rows.size()) rows.emplace_back();
    if (row >= static_cast<size_t>(kRowsPerLane)) row = kRowsPerLane - 1;  // never in practice
    rows[row].push_back(end);
    rows_used[static_cast<size_t>(l)] = std::max(rows_used[static_cast<size_t>(l)], static_cast<int>(row) + 1);
    json args = json::object();
    if (e->mb >= 0) args["mb"] = e->mb;
    if (e->chunk >= 0) args["chunk"] = e->chunk;
    if (e->bytes >= 0) args["bytes"] = e->bytes;
    if (e->step >= 0) args["step"] = e->step;
    evs.push_back({{"name", e->name}, {"cat", lane_name(e->lane)}, {"ph", "X"}, {"ts", e->ts_us},
                   {"dur", e->dur_us}, {"pid", pid}, {"tid", l * kRowsPerLane + static_cast<int>(row)},
                   {"args", args}});
  }
  evs.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", process_name}}}});
  evs.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
  for (int l = 0; l < kLanes; ++l)
    for (int r = 0; r < std::max(rows_used[static_cast<size_t>(l)], l == 0 ? 1 : 0); ++r) {
      std::string n = lane_name(static_cast<Lane>(l));
      if (r > 0) n += " " + std::to_string(r + 1);
      const int tid = l * kRowsPerLane + r;
      evs.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", n}}}});
      evs.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", pid}, {"tid", tid},
                     {"args", {{"sort_index", tid}}}});
    }
  return json{{"traceEvents", evs}, {"displayTimeUnit", "ms"}}.dump();
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) TRIAX_THROW(IoError, "timeline {}: cannot open for writing", tmp);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) TRIAX_THROW(IoError, "timeline {}: writing failed (disk full?)", tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) TRIAX_THROW(IoError, "timeline {}: cannot rename {} to it", path, tmp);
}

std::string merge_files(const std::vector<std::string>& paths, const std::string& other_json) {
  using nlohmann::json;
  json all = json::array();
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    if (!in) TRIAX_THROW(IoError, "timeline merge: {} is missing or unreadable (did that rank reach the profiled steps?)", p);
    std::stringstream ss;
    ss << in.rdbuf();
    json doc = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
      TRIAX_THROW(ConfigError, "timeline merge: {} is not a Chrome trace (no traceEvents array)", p);
    for (auto& e : doc["traceEvents"]) all.push_back(std::move(e));
  }
  json out{{"traceEvents", all}, {"displayTimeUnit", "ms"}};
  if (!other_json.empty()) out["otherData"] = json::parse(other_json);
  return out.dump();
}

}  // namespace triax::trace
