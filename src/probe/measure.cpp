// Probe measurements. The GEMM and triad results are verified (a wrong kernel must not score
// high); IOPS prefers O_DIRECT so the page cache does not measure memory instead of storage.
#include "triax/probe/measure.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "triax/core/clock.h"
#include "triax/core/error.h"
#include "triax/ops/gemm.h"

namespace triax::probe {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

double measure_gemm_flops(int n, int reps) {
  require(n >= 16 && reps >= 1, "GEMM probe: n {} must be >= 16 and reps {} >= 1", n, reps);
  const size_t nn = static_cast<size_t>(n) * n;
  std::vector<float> a(nn), b(nn), c(nn);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  double best = 1e300;
  for (int r = 0; r < reps + 1; ++r) {  // the first call warms up (thread pool, pages)
    const auto t0 = Clock::now();
    ops::gemm<float>(ops::Trans::no, ops::Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    if (r > 0) best = std::min(best, since(t0));
  }
  // Check one row against a double-precision dot product.
  const int i = n / 3;
  for (int j = 0; j < n; j += std::max(1, n / 17)) {
    double ref = 0;
    for (int k = 0; k < n; ++k) ref += double(a[size_t(i) * n + k]) * b[size_t(k) * n + j];
    require(std::fabs(ref - c[size_t(i) * n + j]) <= 1e-3 * std::sqrt(double(n)),
            "GEMM probe: C[{},{}] = {} but the reference is {}", i, j, c[size_t(i) * n + j], ref);
  }
  return 2.0 * n * double(n) * n / best;
}

double measure_triad_bytes_s(size_t elems, int reps) {
  require(elems >= 1024 && reps >= 1, "triad probe: {} elements must be >= 1024 and reps {} >= 1", elems, reps);
  std::vector<double> a(elems), b(elems), c(elems);
  const long n = static_cast<long>(elems);
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) {  // first touch by the threads that run the triad
    a[i] = 0;
    b[i] = 1.0 + static_cast<double>(i % 7);
    c[i] = 2.0;
  }
  const double s = 3.0;
  double best = 1e300;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    if (r > 0) best = std::min(best, since(t0));
  }
  for (long i = 0; i < n; i += std::max(1L, n / 101))
    require(a[i] == 1.0 + static_cast<double>(i % 7) + 6.0, "triad probe: a[{}] = {} is wrong", i, a[i]);
  return 24.0 * static_cast<double>(elems) / best;
}

Latency measure_latency(Communicator& world, int iters) {
  require(iters >= 1, "latency probe: iters {} must be >= 1", iters);
  const int W = world.size(), me = world.rank();
  Latency out;
  if (W == 1) return out;
  double send_v = me, recv_v = -1;
  double total = 0;
  for (int k = 1; k < W; ++k) {
    // Ping-pong along offset k: even rounds r -> r+k, odd rounds back; everyone takes part.
    const int to = (me + k) % W, from = (me - k + W) % W;
    world.barrier().wait();
    const auto t0 = Clock::now();
    for (int it = 0; it < iters; ++it) {
      auto s = world.send(std::span<const double>(&send_v, 1), to, k);
      auto r = world.recv(std::span<double>(&recv_v, 1), from, k);
      s.wait();
      r.wait();
    }
    total += since(t0) / iters;
    require(recv_v == static_cast<double>(from), "latency probe: rank {} got {} from rank {}", me, recv_v, from);
  }
  out.p2p_s = total / (W - 1);
  double v = 1;
  world.barrier().wait();
  const auto t0 = Clock::now();
  for (int it = 0; it < iters; ++it) {
    v = 1;
    world.all_reduce(std::span<double>(&v, 1), ReduceOp::sum).wait();
  }
  out.allreduce_s = since(t0) / iters;
  require(v == W, "latency probe: all-reduce of ones gave {} on {} ranks", v, W);
  return out;
}

ReadIops measure_read_iops(const std::string& dir, size_t file_bytes, double seconds, uint64_t seed) {
  constexpr size_t kBlock = 4096;
  require(file_bytes >= 16 * kBlock && seconds > 0, "IOPS probe: file of {} bytes must hold >= 16 blocks, seconds {} > 0",
          file_bytes, seconds);
  const std::string path = fmt::format("{}/.triax-probe-{}-{}.dat", dir, ::getpid(), seed);
  {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) throw IoError(fmt::format("IOPS probe: cannot create {}: {}", path, std::strerror(errno)));
    std::vector<char> block(1 << 20);
    std::mt19937_64 rng(seed);
    for (auto& c : block) c = static_cast<char>(rng());
    for (size_t done = 0; done < file_bytes;) {
      const size_t n = std::min(block.size(), file_bytes - done);
      const ssize_t w = ::write(fd, block.data(), n);
      if (w <= 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(path.c_str());
        throw IoError(fmt::format("IOPS probe: writing {} at byte {}: {}", path, done, std::strerror(err)));
      }
      done += static_cast<size_t>(w);
    }
    ::fsync(fd);
    ::close(fd);
  }
  ReadIops out;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  out.direct = fd >= 0;
  if (fd < 0) {
    fd = ::open(path.c_str(), O_RDONLY);
    if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  if (fd < 0) {
    const int err = errno;
    ::unlink(path.c_str());
    throw IoError(fmt::format("IOPS probe: cannot open {}: {}", path, std::strerror(err)));
  }
  void* raw = nullptr;
  if (posix_memalign(&raw, kBlock, kBlock) != 0) raw = nullptr;
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  const size_t blocks = file_bytes / kBlock;
  const auto t0 = Clock::now();
  double elapsed = 0;
  bool read_failed = false;
  int err = 0;
  while ((elapsed = since(t0)) < seconds) {
    for (int i = 0; i < 64; ++i) {
      const off_t off = static_cast<off_t>((rng() % blocks) * kBlock);
      if (::pread(fd, buf.get(), kBlock, off) != static_cast<ssize_t>(kBlock)) {
        read_failed = true;
        err = errno;
        break;
      }
      ++out.reads;
    }
    if (read_failed) break;
  }
  ::close(fd);
  ::unlink(path.c_str());
  if (read_failed) throw IoError(fmt::format("IOPS probe: reading {}: {}", path, std::strerror(err)));
  out.iops = static_cast<double>(out.reads) / elapsed;
  return out;
}

}  // namespace triax::probe
