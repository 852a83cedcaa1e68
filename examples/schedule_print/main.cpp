// Prints a pipeline schedule: each stage's instruction list, the checker's report, the simulated
// time line (ASCII) and the bubble next to its closed form; optionally a Chrome trace.
//   schedule_print --schedule 1f1b --pp 4 --micro-batches 8
//   schedule_print --schedule interleaved --pp 4 --vpp 2 --micro-batches 8 --trace il.json
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <triax/core/error.h>
#include <triax/pipeline/schedule.h>
#include <triax/pipeline/schedule_check.h>
#include <triax/pipeline/schedule_sim.h>
#include <triax/pipeline/schedule_trace.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  CLI::App app{"triax schedule_print: a pipeline schedule's instruction lists, check, simulated time line and bubble"};
  std::string kind_name = "1f1b", trace;
  int pp = 4, vpp = 1, m = 8;
  triax::SimCosts costs;
  bool no_lists = false;
  app.add_option("--schedule", kind_name, "gpipe, 1f1b, interleaved or zb-h1")->capture_default_str();
  app.add_option("--pp", pp, "pipeline stages")->capture_default_str();
  app.add_option("--vpp", vpp, "model chunks per stage (interleaved; gpipe too)")->capture_default_str();
  app.add_option("--micro-batches", m, "micro-batches per step")->capture_default_str();
  app.add_option("--t-f", costs.forward, "simulated cost of one forward (per chunk)")->capture_default_str();
  app.add_option("--t-b", costs.backward_input, "cost of an input-gradient pass B (zb-h1)")->capture_default_str();
  app.add_option("--t-w", costs.backward_weight, "cost of a weight-gradient pass W (zb-h1)")->capture_default_str();
  app.add_option("--t-bw", costs.backward, "cost of a full backward (gpipe, 1f1b, interleaved)")->capture_default_str();
  app.add_option("--t-comm", costs.comm, "latency of one message")->capture_default_str();
  app.add_option("--trace", trace, "write a Chrome trace (chrome://tracing, Perfetto) of the simulated time line");
  app.add_flag("--no-lists", no_lists, "do not print the instruction lists");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto kind = triax::parse_schedule_kind(kind_name);
    const auto s = triax::make_schedule(kind, pp, vpp, m);
    const auto report = triax::check_schedule(s);
    if (!no_lists) std::printf("%s\n", triax::format_lists(s).c_str());
    std::printf("%s\n\n", report.summary(s).c_str());
    const auto sim = triax::simulate_schedule(s, costs);
    const auto events = triax::timeline_events(s, sim);
    std::printf("%s\n", triax::ascii_timeline(events, pp).c_str());
    const auto& b = sim.bubble;
    std::printf("makespan %.4g; bubble = idle / compute per stage:", b.makespan);
    for (int st = 0; st < pp; ++st) std::printf(" %.4f", b.ratio(st));
    std::printf("\nbubble overall: idle/compute %.4f, idle/makespan %.4f", b.ratio(), b.of_makespan());
    try {
      std::printf("; theory (zero comm) idle/compute %.4f\n", triax::theoretical_bubble(kind, pp, vpp, m, costs));
    } catch (const triax::ConfigError& e) {
      std::printf("; theory: n/a (%s)\n", e.what());
    }
    if (!trace.empty()) {
      triax::write_chrome_trace(trace, events, 1000.0);  // one cost unit drawn as 1 ms
      std::printf("wrote %s\n", trace.c_str());
    }
    return 0;
  } catch (const triax::Error& e) {
    std::fprintf(stderr, "schedule_print: %s\n", e.what());
    return 1;
  }
}
