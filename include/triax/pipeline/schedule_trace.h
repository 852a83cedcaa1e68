// Printing time lines: an ASCII chart per stage and Chrome-trace JSON (chrome://tracing, Perfetto)
// from a generic list of timed events, so the same code draws a simulated schedule and the
// times measured in a real run (schedule_bench).
#pragma once
#include <string>
#include <vector>

#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_sim.h"

namespace triax {

struct TimedEvent {
  int rank = 0;          // pipeline stage (one row per rank)
  std::string name;      // "F3.1"
  std::string kind;      // "F", "BW" (full backward), "B", "W"; anything else draws as '#'
  double start = 0;      // in the caller's unit (see us_per_unit)
  double duration = 0;
  int mb = -1;           // -1: not tied to a micro-batch
  int chunk = -1;
  bool compute = true;   // counts as busy time in bubble_stats (false: waits, communication)
};

// One event per compute instruction of a simulated schedule (times in cost units).
std::vector<TimedEvent> timeline_events(const Schedule& s, const SimResult& r);

// Busy/idle per rank from measured or simulated events: makespan from the earliest start to the
// latest end over all ranks; busy sums the durations of compute events. ranks: number of rows
// (ranks with no events are all idle). ConfigError for an event whose rank is out of range or
// whose duration is negative.
BubbleStats bubble_stats(const std::vector<TimedEvent>& events, int ranks);

struct AsciiOptions {
  double unit = 0;       // time per character; 0 picks the smallest event duration, widened to fit
  int max_width = 160;   // characters of time line per row (the unit grows to fit)
  bool show_mb = true;   // a second row per rank with the micro-batch's last digit
};

// One row per rank, one character per `unit`: the kind's letter (F, B, W; a full backward is
// drawn as B) in upper case for even chunks and lower case for odd chunks, '#' for other kinds,
// '.' for idle. A cell shows the event that covers its midpoint. Ends with the scale.
std::string ascii_timeline(const std::vector<TimedEvent>& events, int ranks, const AsciiOptions& opts = {});

// {"traceEvents":[...], "displayTimeUnit":"ms"}: one complete event (ph "X") per TimedEvent with
// pid 0, tid = rank, ts/dur in microseconds (start * us_per_unit), args {mb, chunk}; plus thread
// name metadata "stage r" so each rank is one named row.
std::string chrome_trace_json(const std::vector<TimedEvent>& events, double us_per_unit);
// Writes chrome_trace_json to path; IoError naming the path if it cannot be written.
void write_chrome_trace(const std::string& path, const std::vector<TimedEvent>& events, double us_per_unit);

}  // namespace triax
