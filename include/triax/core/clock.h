// Elapsed time for the timing counters (step phases, MoE exchange, probes, checkpoints): one
// definition of "seconds since t0" on the steady clock, which never jumps with the wall clock.
#pragma once

#include <chrono>

namespace triax {

// Seconds elapsed on the steady clock since t0.
inline double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace triax
