// The node probe's measurements (triax-probe): GEMM rate, STREAM triad bandwidth, point-to-point
// and small all-reduce latency with the job's peers, random 4 KiB read IOPS on a directory.
// Each returns the best of its repetitions (the machine's capability, not its noise).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "triax/distributed/comm/comm.h"

namespace triax::probe {

// FLOP/s of an n x n x n fp32 GEMM (OpenBLAS), best of reps; the result is checked.
double measure_gemm_flops(int n, int reps);
// STREAM triad a = b + s c over `elems` doubles: 24 bytes moved per element, best of reps.
double measure_triad_bytes_s(size_t elems, int reps);

struct Latency {
  double p2p_s = 0;        // 8-byte exchange (send to rank+k, receive from rank-k), mean over offsets k
  double allreduce_s = 0;  // one 8-byte all-reduce
};
// Collective over world. One rank: both are 0.
Latency measure_latency(Communicator& world, int iters);

struct ReadIops {
  double iops = 0;
  bool direct = false;  // O_DIRECT worked (otherwise page-cache reads after a drop of the file's pages)
  size_t reads = 0;
};
// Writes a file of file_bytes in dir (removed afterwards), then reads random 4 KiB blocks for
// `seconds`. IoError naming the file when dir is not writable.
ReadIops measure_read_iops(const std::string& dir, size_t file_bytes, double seconds, uint64_t seed);

}  // namespace triax::probe
