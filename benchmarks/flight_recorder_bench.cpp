// flight_recorder_bench: the flight recorder's cost per communicator call (enqueue, first wait,
// completion) against the same loop with recording off, alternating in rounds in one run.
// Multiplied by a job's calls per iteration (benchmarks/fault_overhead.sh counts them from an
// exit dump) it bounds the recorder's share of an iteration.
//   flight_recorder_bench [--calls N] [--rounds R]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/distributed/failure/flight_recorder.h"

int main(int argc, char** argv) {
  CLI::App app{"flight recorder cost per call"};
  int64_t calls = 1'000'000;
  int rounds = 7;
  app.add_option("--calls", calls, "calls per round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds (off/on alternate)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  using Clock = std::chrono::steady_clock;
  auto time_loop = [&](size_t capacity) {
    triax::FlightRecorder fr("dp", 0, 0, {0, 1, 2, 3}, capacity);
    triax::CallInfo info{0, "all_reduce", "float32 x 4096, sum", -1};
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < calls; ++i) {
      info.seq = static_cast<uint64_t>(i);
      fr.enqueued(info, triax::DType::f32, 4096);
      fr.started(info.seq);
      fr.ended(info.seq, triax::FrState::completed);
    }
    const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(calls);
    if (capacity && fr.entries().back().seq != static_cast<uint64_t>(calls - 1)) std::abort();  // the work happened
    return ns;
  };
  std::vector<double> diffs;
  fmt::print("round  off_ns/call  on_ns/call  recorder_ns/call\n");
  for (int r = 1; r <= rounds; ++r) {
    const double off = time_loop(0), on = time_loop(2048);
    diffs.push_back(on - off);
    fmt::print("{:5d}  {:11.1f}  {:10.1f}  {:16.1f}\n", r, off, on, on - off);
  }
  std::sort(diffs.begin(), diffs.end());
  fmt::print("median recorder cost: {:.1f} ns per call\n", diffs[diffs.size() / 2]);
  return 0;
}
