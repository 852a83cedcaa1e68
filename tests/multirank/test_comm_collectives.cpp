// Every collective and point-to-point call of the world communicator, for every element type,
// with rank-derived inputs whose results have closed forms: each rank contributes small integers
// (exact in bf16/fp16 too), so every result is checked exactly, element by element.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "support/multirank.h"
#include "../../benchmarks/comm_check.h"

using namespace triax;
using namespace triax::test;

#define CHECK_MATCH(expr)       \
  do {                          \
    const auto mm_ = (expr);    \
    INFO(mm_.first);            \
    CHECK(mm_.wrong == 0);      \
  } while (0)

namespace {

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
// Odd sizes on purpose: not multiples of the group size, of a cache line or of MPI's eager limit.
// 70001 elements take the large-message paths (the MPI backend's ring above (n-1) x 64 KiB,
// np <= 4 for 4-byte types); the .ring ctest variants force the ring on every size.
const size_t kCounts[] = {1, 5, 257, 4099, 70001};

// Closed-form pattern per reduce op: the value rank r contributes at (global) index i, and the
// reduced value at i over n ranks. All values are integers small enough to be exact in T, so
// every partial sum is exact in any order.
template <class T>
struct ReducePattern {
  ReduceOp op;
  int n;
  int64_t k;  // period in i
  ReducePattern(ReduceOp o, int n_) : op(o), n(n_) {
    const int64_t m = exact_int<T>();
    switch (op) {
      case ReduceOp::sum: k = sum_period<T>(n); break;
      // avg: v = 2r + i%k; sum = n(n-1) + n(i%k) divides by n exactly, also for integers.
      case ReduceOp::avg: k = std::clamp<int64_t>((m - int64_t{n} * (n - 1)) / n + 1, 1, 1000); break;
      default: k = std::min<int64_t>(m / 2, 1000); break;
    }
  }
  double input(int r, size_t i) const {
    const auto j = static_cast<int64_t>(i) % k;
    switch (op) {
      case ReduceOp::sum: return r + 1 + j;
      case ReduceOp::avg: return 2 * r + j;
      default: {
        // The maximum sits at a rank that changes with i; the minimum at the farthest rank.
        const int64_t at = static_cast<int64_t>(i) % n;
        return static_cast<double>(j - std::abs(r - at));
      }
    }
  }
  double expect(size_t i) const {
    const auto j = static_cast<int64_t>(i) % k;
    const int64_t at = static_cast<int64_t>(i) % n;
    switch (op) {
      case ReduceOp::sum: return static_cast<double>(int64_t{n} * (n + 1) / 2 + n * j);
      case ReduceOp::avg: return static_cast<double>(n - 1 + j);
      case ReduceOp::max: return static_cast<double>(j);
      case ReduceOp::min: return static_cast<double>(j - std::max<int64_t>(at, n - 1 - at));
    }
    return 0;
  }
};

// Pattern of the data-moving collectives: distinct across sources, destinations and positions
// (37 and 3 are odd, so no two nearby entries collide modulo a power of two).
template <class T>
double move_value(int src, int dst, size_t i) {
  const int64_t p = std::min<int64_t>(exact_int<T>(), int64_t{1} << 20);
  return static_cast<double>((int64_t{src} * 37 + int64_t{dst} * 101 + static_cast<int64_t>(i) * 3 + 1) % p);
}

template <class T>
std::vector<T> filled(size_t n, auto&& f) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from_d<T>(f(i));
  return v;
}

}  // namespace

TEMPLATE_TEST_CASE("all_reduce sum/avg/max/min equal the closed forms", "[comm][all_reduce]", float, double, int32_t,
                   int64_t, bf16, f16) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  for (size_t count : kCounts) {
    for (ReduceOp op : kOps) {
      const ReducePattern<T> p(op, n);
      auto x = filled<T>(count, [&](size_t i) { return p.input(r, i); });
      w.all_reduce(std::span<T>(x), op).wait();
      INFO("rank " << r << " of " << n << ", " << dtype_name(dtype_of<T>()) << " x " << count << ", "
                   << reduce_op_name(op));
      CHECK_MATCH(compare(x, [&](size_t i) { return p.expect(i); }));
    }
  }
}

TEMPLATE_TEST_CASE("reduce_scatter gives each rank its reduced block", "[comm][reduce_scatter]", float, double,
                   int32_t, int64_t, bf16, f16) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  for (size_t block : kCounts) {
    for (ReduceOp op : kOps) {
      const ReducePattern<T> p(op, n);
      const auto in = filled<T>(block * n, [&](size_t j) { return p.input(r, j); });
      std::vector<T> out(block);
      w.reduce_scatter(std::span<const T>(in), std::span<T>(out), op).wait();
      INFO("rank " << r << ", block " << block << ", " << reduce_op_name(op));
      CHECK_MATCH(compare(out, [&](size_t i) { return p.expect(static_cast<size_t>(r) * block + i); }));
    }
  }
}

TEMPLATE_TEST_CASE("all_gather puts block s from rank s", "[comm][all_gather]", float, double, int32_t, int64_t, bf16,
                   f16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  for (size_t block : kCounts) {
    const auto in = filled<T>(block, [&](size_t i) { return move_value<T>(r, 0, i); });
    std::vector<T> out(block * n);
    w.all_gather(std::span<const T>(in), std::span<T>(out)).wait();
    INFO("rank " << r << ", block " << block);
    CHECK_MATCH(compare(out, [&](size_t j) { return move_value<T>(static_cast<int>(j / block), 0, j % block); }));
  }
}

TEMPLATE_TEST_CASE("all_to_all transposes the blocks", "[comm][all_to_all]", float, double, int32_t, int64_t, bf16,
                   f16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  for (size_t block : kCounts) {
    // in: block d goes to rank d; out: block s came from rank s.
    const auto in = filled<T>(block * n, [&](size_t j) { return move_value<T>(r, static_cast<int>(j / block), j % block); });
    std::vector<T> out(block * n);
    w.all_to_all(std::span<const T>(in), std::span<T>(out)).wait();
    INFO("rank " << r << ", block " << block);
    CHECK_MATCH(compare(out, [&](size_t j) { return move_value<T>(static_cast<int>(j / block), r, j % block); }));
  }
}

TEMPLATE_TEST_CASE("all_to_all_v with uneven and zero counts", "[comm][all_to_all_v]", float, double, int32_t, int64_t,
                   bf16, f16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  for (int64_t unit : {int64_t{1}, int64_t{7}, int64_t{1500}}) {
    // Rank s sends ((s + 2d) % 3) * unit elements to rank d: zero for a third of the pairs
    // (including s = d = 0), so some peers exchange nothing.
    auto count = [&](int s, int d) { return ((s + 2 * d) % 3) * unit; };
    std::vector<int64_t> sc(n), rc(n);
    for (int d = 0; d < n; ++d) sc[d] = count(r, d);
    for (int s = 0; s < n; ++s) rc[s] = count(s, r);
    std::vector<T> in, out(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})));
    for (int d = 0; d < n; ++d)
      for (int64_t i = 0; i < sc[d]; ++i) in.push_back(from_d<T>(move_value<T>(r, d, static_cast<size_t>(i))));
    w.all_to_all_v(std::span<const T>(in), std::span<const int64_t>(sc), std::span<T>(out),
                   std::span<const int64_t>(rc))
        .wait();
    std::vector<double> want;
    for (int s = 0; s < n; ++s)
      for (int64_t i = 0; i < rc[s]; ++i) want.push_back(move_value<T>(s, r, static_cast<size_t>(i)));
    INFO("rank " << r << ", unit " << unit);
    CHECK_MATCH(compare(out, [&](size_t j) { return want[j]; }));
  }
}

TEMPLATE_TEST_CASE("broadcast from every root", "[comm][broadcast]", float, double, int32_t, int64_t, bf16, f16,
                   unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int64_t p = std::min<int64_t>(exact_int<T>(), int64_t{1} << 20);
  for (size_t count : kCounts) {
    for (int root = 0; root < n; ++root) {
      // Non-roots start from a value that differs from the root's at every element.
      auto x = filled<T>(count, [&](size_t i) {
        const double v = move_value<T>(root, 0, i);
        return r == root ? v : std::fmod(v + 1, static_cast<double>(p));
      });
      w.broadcast(std::span<T>(x), root).wait();
      INFO("rank " << r << ", root " << root << ", count " << count);
      CHECK_MATCH(compare(x, [&](size_t i) { return move_value<T>(root, 0, i); }));
    }
  }
}

TEMPLATE_TEST_CASE("send/recv around the ring", "[comm][p2p]", float, double, int32_t, int64_t, bf16, f16,
                   unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  // 70000 elements are past every eager limit, so the rendezvous path runs too.
  for (size_t count : {size_t{1}, size_t{257}, size_t{70000}}) {
    const auto mine = filled<T>(count, [&](size_t i) { return move_value<T>(r, right, i); });
    std::vector<T> got(count);
    Work rw = w.recv(std::span<T>(got), left, 5);
    Work sw = w.send(std::span<const T>(mine), right, 5);
    sw.wait();
    rw.wait();
    INFO("rank " << r << ", count " << count);
    CHECK_MATCH(compare(got, [&](size_t i) { return move_value<T>(left, r, i); }));
  }
}

TEMPLATE_TEST_CASE("send/recv in blocking order between pairs", "[comm][p2p]", float, bf16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int partner = (r ^ 1) < n ? (r ^ 1) : r;  // the odd one out of an odd world talks to itself
  for (size_t count : {size_t{3}, size_t{70000}}) {
    const auto mine = filled<T>(count, [&](size_t i) { return move_value<T>(r, partner, i); });
    std::vector<T> got(count);
    if (partner == r) {
      Work rw = w.recv(std::span<T>(got), r, 9);
      w.send(std::span<const T>(mine), r, 9).wait();
      rw.wait();
    } else if (r % 2 == 0) {  // even sends first: each wait must complete before the next call
      w.send(std::span<const T>(mine), partner, 9).wait();
      w.recv(std::span<T>(got), partner, 9).wait();
    } else {
      w.recv(std::span<T>(got), partner, 9).wait();
      w.send(std::span<const T>(mine), partner, 9).wait();
    }
    INFO("rank " << r << ", partner " << partner << ", count " << count);
    CHECK_MATCH(compare(got, [&](size_t i) { return move_value<T>(partner, r, i); }));
  }
}

TEMPLATE_TEST_CASE("batch_send_recv exchanges with both ring neighbours", "[comm][p2p][batch]", float, double,
                   int32_t, int64_t, bf16, f16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (size_t count : {size_t{0}, size_t{1}, size_t{257}, size_t{70000}}) {
    // Tag 1 travels rightwards, tag 2 leftwards, so with two ranks (left == right) or one rank
    // the messages are still told apart.
    const auto to_right = filled<T>(count, [&](size_t i) { return move_value<T>(r, right, i); });
    const auto to_left = filled<T>(count, [&](size_t i) { return move_value<T>(r, left, i + 11); });
    std::vector<T> from_left(count), from_right(count);
    const P2POp ops[] = {
        P2POp::send(std::span<const T>(to_right), right, 1),
        P2POp::recv(std::span<T>(from_left), left, 1),
        P2POp::send(std::span<const T>(to_left), left, 2),
        P2POp::recv(std::span<T>(from_right), right, 2),
    };
    w.batch_send_recv(ops).wait();
    INFO("rank " << r << ", count " << count);
    CHECK_MATCH(compare(from_left, [&](size_t i) { return move_value<T>(left, r, i); }));
    CHECK_MATCH(compare(from_right, [&](size_t i) { return move_value<T>(right, r, i + 11); }));
  }
}

TEST_CASE("barrier holds every rank until the last arrives", "[comm][barrier]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  using clock = std::chrono::steady_clock;
  // steady_clock is CLOCK_MONOTONIC, shared by the processes of one host; across hosts the
  // times are not comparable, so the check needs every rank on this host.
  std::vector<char> host(64, '\0'), hosts(64 * static_cast<size_t>(n));
  const std::string h = host_name().substr(0, 63);
  std::copy(h.begin(), h.end(), host.begin());
  w.all_gather(std::span<const char>(host), std::span<char>(hosts)).wait();
  bool one_host = true;
  for (int s = 0; s < n; ++s) one_host = one_host && std::string(hosts.data() + 64 * s) == h;
  if (!one_host) {
    w.barrier().wait();
    WARN("ranks on several hosts: barrier ordering not checked");
    return;
  }
  const int late = n - 1;
  int64_t times[2] = {0, 0};  // (entered, left) in ns
  if (r == late) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  times[0] = clock::now().time_since_epoch().count();
  w.barrier().wait();
  times[1] = clock::now().time_since_epoch().count();
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  w.all_gather(std::span<const int64_t>(times), std::span<int64_t>(all)).wait();
  const int64_t late_entry = all[2 * late];
  for (int s = 0; s < n; ++s) {
    INFO("rank " << s << " left the barrier " << (late_entry - all[2 * s + 1]) << " ns before rank " << late
                 << " entered it");
    CHECK(all[2 * s + 1] >= late_entry);
  }
}

TEST_CASE("every call gets the next sequence number", "[comm][seq]") {
  Communicator& w = world();
  const uint64_t before = w.calls();
  std::vector<float> a{1.0f, 2.0f};
  Work x = w.all_reduce(std::span<float>(a));
  Work y = w.barrier();
  CHECK(x.info().seq == before);
  CHECK(y.info().seq == before + 1);
  CHECK(x.info().op == "all_reduce");
  CHECK(y.info().op == "barrier");
  CHECK(w.calls() == before + 2);
  y.wait();
  x.wait();
  CHECK(a[0] == static_cast<float>(w.size()));
}
