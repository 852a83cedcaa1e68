// The timeline recorder behind --profile-steps: spans (start, duration) on a few lanes per rank,
// written as Chrome-trace / Perfetto JSON (docs/OBSERVE.md, "Timeline"). Off by default; while off a
// span costs one test of a global flag. Times are microseconds on the steady clock since the
// origin set by start(); the caller picks a common origin (the trainer starts every rank right
// after a barrier). Spans are recorded from any thread (a mutex, paid only while on).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace triax::trace {

// One lane is one row (thread) of the rank's track. Spans of one lane that overlap without
// nesting (DP buckets in flight together) are spread over extra rows when written.
enum class Lane : int { compute = 0, p2p = 1, tp = 2, dp = 3, optimizer = 4, step = 5 };
inline constexpr int kLanes = 6;
const char* lane_name(Lane lane);

struct Event {
  Lane lane = Lane::compute;
  std::string name;  // "forward", "wait recv activation", "tp all-reduce", ...
  double ts_us = 0, dur_us = 0;
  int mb = -1, chunk = -1;  // -1: not tied to a micro-batch / chunk
  int64_t bytes = -1;       // message or bucket size, -1: none
  int64_t step = -1;        // the iteration it belongs to (set_step), -1: none
};

namespace detail {
extern bool g_on;
}
inline bool on() { return detail::g_on; }

// Clears the events and starts recording with origin = now, or with the origin at origin_s
// (seconds since the steady clock's epoch: another process's origin on the same host).
void start();
void start_at(double origin_s);
// Now on the steady clock, seconds since its epoch (what start_at takes).
double steady_now_s();
// The iteration that the following events belong to (their "step" argument).
void set_step(int64_t step);
// Stops recording (the events stay until the next start()).
void stop();
// Microseconds since the origin.
double now_us();
void record(Lane lane, std::string name, double ts_us, double end_us, int mb = -1, int chunk = -1,
            int64_t bytes = -1);
std::vector<Event> events();

// Records [construction, destruction) on a lane while recording is on; nothing otherwise.
class Span {
 public:
  Span(Lane lane, const char* name, int mb = -1, int chunk = -1, int64_t bytes = -1) {
    if (on()) {
      active_ = true;
      lane_ = lane;
      name_ = name;
      mb_ = mb;
      chunk_ = chunk;
      bytes_ = bytes;
      t0_ = now_us();
    }
  }
  ~Span() {
    if (active_) record(lane_, name_, t0_, now_us(), mb_, chunk_, bytes_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool active_ = false;
  Lane lane_ = Lane::compute;
  const char* name_ = nullptr;
  int mb_ = -1, chunk_ = -1;
  int64_t bytes_ = -1;
  double t0_ = 0;
};

// {"traceEvents": [...]} of these events: complete events ("ph":"X", ts/dur in us) with pid = pid,
// tid = lane*16 + row, args {mb, chunk, bytes, step} where set, and metadata naming the process
// (process_name) and each row (thread_name "compute", "p2p", "tp", "dp", "optimizer", "step", "dp 2", ...).
std::string to_json(const std::vector<Event>& events, int pid, const std::string& process_name);
// Writes text to path (via a temporary file and a rename); IoError naming the path otherwise.
void write_file(const std::string& path, const std::string& text);
// Merges per-rank files (each a to_json document) into one {"traceEvents": [...]} document, with
// "otherData" = other (a JSON object as text, "" for none); IoError/ConfigError naming a file
// that is missing or does not parse.
std::string merge_files(const std::vector<std::string>& paths, const std::string& other_json);

}  // namespace triax::trace
