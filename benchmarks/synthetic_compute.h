// Calibrated synthetic compute for the communication-overlap benchmarks (grad_sync_bench,
// zero_bench): arithmetic on an L1-resident buffer, which does not compete with the collectives
// for memory bandwidth, sized in milliseconds on this rank; and the median of round timings.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace triax::bench {

using Clock = std::chrono::steady_clock;
inline double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

inline float g_compute_sink = 0;
inline void compute(int64_t units) {
  static float x[256];
  static bool init = false;
  if (!init) {
    for (int i = 0; i < 256; ++i) x[i] = 1.0f + 1e-3f * static_cast<float>(i);
    init = true;
  }
  for (int64_t u = 0; u < units; ++u)
    for (int i = 0; i < 256; ++i) x[i] = x[i] * 0.9999f + 1e-4f;
  g_compute_sink += x[0];
}

// Units of compute() per millisecond on this rank (doubling until one call takes > 50 ms).
inline double calibrate() {
  compute(2000);
  for (int64_t units = 1000;; units *= 2) {
    const auto a = Clock::now();
    compute(units);
    const double ms = secs(a, Clock::now()) * 1e3;
    if (ms > 50) return static_cast<double>(units) / ms;
  }
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace triax::bench
