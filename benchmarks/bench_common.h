// Helpers shared by the trainer benchmarks (schedule_bench, train_bench): the model and layout
// flags, medians, and an honest description of the machine (cores, ranks per core, load), since
// timings of ranks that share cores are not the timings of a real cluster.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "triax/train/trainer.h"

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>
#endif

namespace triax::bench {

// The benchmark model: the `tiny` preset widened so that compute dominates point-to-point
// latency (8 layers x 128 channels, 4 heads, 128 tokens, byte vocabulary).
struct ModelFlags {
  std::string model = "tiny";
  int layers = 8, hidden = 128, heads = 4, seq = 128, vocab = 0;

  void add(CLI::App& app) {
    app.add_option("--model", model, "preset the shape flags override")->capture_default_str();
    app.add_option("--layers", layers, "layers (0: the preset's)")->capture_default_str();
    app.add_option("--hidden", hidden, "hidden size (0: the preset's)")->capture_default_str();
    app.add_option("--heads", heads, "attention heads (0: the preset's)")->capture_default_str();
    app.add_option("--seq", seq, "tokens per sample, also the position table size (0: the preset's)")
        ->capture_default_str();
    app.add_option("--vocab", vocab, "vocabulary (0: the preset's)")->capture_default_str();
  }
  void apply(TrainConfig& c) const {
    c.model = model;
    // 0 keeps the preset's value (TrainConfig's shape fields are unset then).
    auto given = [](int v) { return v ? std::optional<int>(v) : std::nullopt; };
    c.layers = given(layers);
    c.hidden = given(hidden);
    c.heads = given(heads);
    c.vocab = given(vocab);
    c.max_seq = given(seq);
    c.seq = given(seq);
  }
};

inline double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// The 1-minute load average (other jobs on a shared machine), or -1 where unknown.
inline double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  if (f) f >> l;
  return l;
}

// "2 ranks on this host, 2 cores, load 3.1" and a warning when ranks outnumber cores: a rank that
// is descheduled mid-GEMM looks busy, and one spinning in MPI steals a core from a computing one.
inline std::string machine_line(int ranks_on_host, bool* oversubscribed = nullptr) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool over = static_cast<unsigned>(ranks_on_host) > cores;
  if (oversubscribed) *oversubscribed = over;
  std::string s = fmt::format("{} ranks on this host, {} cores, load average {:.2f}", ranks_on_host, cores,
                              load_average());
  if (over)
    s += fmt::format(" | OVERSUBSCRIBED ({:.1f} ranks per core): time slicing distorts every timing below", 
                     static_cast<double>(ranks_on_host) / cores);
  return s;
}

// A benchmark's main decides to end the job: one rank failing leaves the others waiting in
// collectives, so abort them all (the library itself never does).
[[noreturn]] inline void abort_job(int code) {
#if defined(TRIAX_HAVE_MPI)
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace triax::bench
