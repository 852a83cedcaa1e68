// Fresh random inputs, different on every rank and every run, against a serial reference that
// every rank computes in double after regenerating every rank's inputs from the shared seed.
// Also the uneven and zero-length cases. TRIAX_TEST_SEED=<n> replays a run (the seed is printed
// with every failure).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <limits>
#include <numeric>

#include "support/multirank.h"
#include "triax/core/env.h"
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

// Rank 0 draws the seed (or takes TRIAX_TEST_SEED) and broadcasts it, once per process.
uint64_t run_seed() {
  static const uint64_t seed = [] {
    int64_t s[1] = {0};
    if (world().rank() == 0) {
      s[0] = env_int("TRIAX_TEST_SEED", 0, std::numeric_limits<int64_t>::max(),
                     static_cast<int64_t>(std::random_device{}() >> 1));
    }
    world().broadcast(std::span<int64_t>(s), 0).wait();
    return static_cast<uint64_t>(s[0]);
  }();
  return seed;
}

// Two kinds of random values: "exact" ones are small dyadic numbers (integers times a power of
// two) whose sums over up to 8 ranks are exact in T in any order, so sum/avg compare with no
// tolerance; "general" ones are arbitrary values in [-1, 1) (rounded to T), compared within the
// error bound of a sum of n terms.
template <class T>
double draw(std::mt19937_64& g, bool exact) {
  if constexpr (std::is_integral_v<T>) {
    const int64_t lim = std::is_same_v<T, int32_t> ? 1'000'000 : int64_t{100'000'000'000'000};  // 8-rank sums stay exact in double
    return static_cast<double>(std::uniform_int_distribution<int64_t>(-lim, lim)(g));
  } else if (exact) {
    // |k| <= exact_int/16 keeps 8-rank sums exact; the scale makes the values fractional.
    const int64_t lim = exact_int<T>() / 16;
    const double scale = std::is_same_v<T, bf16> ? 0.25 : std::is_same_v<T, f16> ? 1.0 / 16 : 1.0 / 1024;
    return static_cast<double>(std::uniform_int_distribution<int64_t>(-lim, lim)(g)) * scale;
  } else {
    return to_d(from_d<T>(std::uniform_real_distribution<double>(-1.0, 1.0)(g)));
  }
}

template <class T>
std::vector<T> random_vec(uint64_t seed, int rank, int stream, size_t n, bool exact) {
  auto g = rng_for(seed, rank, stream);
  std::vector<T> v(n);
  for (auto& x : v) x = from_d<T>(draw<T>(g, exact));
  return v;
}

// Reference reduction of element i over all ranks' inputs, in double; returns (value, tolerance).
template <class T>
std::pair<double, double> reference(const std::vector<std::vector<T>>& all, size_t i, ReduceOp op, bool exact) {
  const int n = static_cast<int>(all.size());
  // long double (64-bit significand on x86-64) keeps the reference's own error far below the
  // backend's, also for float64 inputs.
  long double sum = to_d(all[0][i]);
  double acc = to_d(all[0][i]), mag = std::fabs(acc);
  for (int r = 1; r < n; ++r) {
    const double x = to_d(all[r][i]);
    mag += std::fabs(x);
    sum += x;
    if (op == ReduceOp::max) acc = std::max(acc, x);
    else if (op == ReduceOp::min) acc = std::min(acc, x);
  }
  if (op == ReduceOp::max || op == ReduceOp::min) return {acc, 0.0};
  acc = static_cast<double>(sum);
  double tol = 0.0;
  // Each of the backend's n-1 adds rounds once in T; the reference rounds once more to double.
  if (!exact) tol = (n - 1) * unit_roundoff<T>() * mag * 1.0001 + std::ldexp(std::fabs(acc), -53);
  if (op == ReduceOp::avg) {
    if constexpr (std::is_integral_v<T>) {
      // Integers average by truncation (like NCCL's ncclAvg): sum computed exactly in int64.
      int64_t s = 0;
      for (int r = 0; r < n; ++r) s += static_cast<int64_t>(all[r][i]);
      return {static_cast<double>(s / n), 0.0};
    } else {
      // The division rounds once more in T, except for exact inputs over a power-of-two group.
      const double q = acc / n;
      double t = tol / n;
      if (!(exact && is_pow2(n))) t += unit_roundoff<T>() * std::fabs(q);
      return {q, t};
    }
  }
  return {acc, tol};
}

}  // namespace

TEMPLATE_TEST_CASE("all_reduce of random inputs matches the serial reference", "[comm][random][all_reduce]", float,
                   double, int32_t, int64_t, bf16, f16) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const uint64_t seed = run_seed();
  int stream = 0;
  for (bool exact : {true, false}) {
    if (std::is_integral_v<T> && !exact) continue;
    for (size_t count : {size_t{1}, size_t{33}, size_t{3001}}) {
      for (ReduceOp op : kOps) {
        ++stream;
        std::vector<std::vector<T>> all;
        for (int s = 0; s < n; ++s) all.push_back(random_vec<T>(seed, s, stream, count, exact));
        auto x = all[r];
        w.all_reduce(std::span<T>(x), op).wait();
        INFO("seed " << seed << " rank " << r << " of " << n << ", " << dtype_name(dtype_of<T>()) << " x " << count
                     << ", " << reduce_op_name(op) << (exact ? ", exact inputs" : ", general inputs"));
        Mismatch m;
        for (size_t i = 0; i < count; ++i) {
          const auto [want, tol] = reference(all, i, op, exact);
          const double got = to_d(x[i]);
          if (std::fabs(got - want) > tol && m.wrong++ == 0)
            m.first = fmt::format("element {}: got {} expected {} (tol {})", i, got, want, tol);
        }
        CHECK_MATCH(m);
      }
    }
  }
}

TEMPLATE_TEST_CASE("reduce_scatter of random inputs matches the serial reference", "[comm][random][reduce_scatter]",
                   float, double, int32_t, int64_t, bf16, f16) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const uint64_t seed = run_seed();
  int stream = 100;
  for (size_t block : {size_t{1}, size_t{129}}) {
    for (ReduceOp op : kOps) {
      ++stream;
      std::vector<std::vector<T>> all;
      for (int s = 0; s < n; ++s) all.push_back(random_vec<T>(seed, s, stream, block * n, true));
      std::vector<T> out(block);
      w.reduce_scatter(std::span<const T>(all[r]), std::span<T>(out), op).wait();
      INFO("seed " << seed << " rank " << r << ", block " << block << ", " << reduce_op_name(op));
      Mismatch m;
      for (size_t i = 0; i < block; ++i) {
        const auto [want, tol] = reference(all, static_cast<size_t>(r) * block + i, op, true);
        if (std::fabs(to_d(out[i]) - want) > tol && m.wrong++ == 0)
          m.first = fmt::format("element {}: got {} expected {}", i, to_d(out[i]), want);
      }
      CHECK_MATCH(m);
    }
  }
}

TEMPLATE_TEST_CASE("all_gather, all_to_all and broadcast of random inputs", "[comm][random][move]", float, double,
                   int32_t, int64_t, bf16, f16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const uint64_t seed = run_seed();
  auto gen = [&](int s, int stream, size_t count) {
    auto g = rng_for(seed, s, stream);
    std::vector<T> v(count);
    for (auto& x : v) {
      if constexpr (std::is_same_v<T, unsigned char>) x = static_cast<T>(g() & 0xff);
      else x = from_d<T>(draw<T>(g, false));
    }
    return v;
  };
  const size_t block = 531;
  INFO("seed " << seed << " rank " << r << " of " << n);
  {
    std::vector<T> out(block * n);
    const auto in = gen(r, 200, block);
    w.all_gather(std::span<const T>(in), std::span<T>(out)).wait();
    std::vector<T> want;
    for (int s = 0; s < n; ++s) {
      auto b = gen(s, 200, block);
      want.insert(want.end(), b.begin(), b.end());
    }
    CHECK_MATCH(compare(out, [&](size_t j) { return to_d(want[j]); }));
  }
  {
    std::vector<T> out(block * n);
    const auto in = gen(r, 201, block * n);
    w.all_to_all(std::span<const T>(in), std::span<T>(out)).wait();
    Mismatch m;
    for (int s = 0; s < n; ++s) {
      const auto theirs = gen(s, 201, block * n);
      for (size_t i = 0; i < block; ++i)
        if (!(to_d(out[s * block + i]) == to_d(theirs[r * block + i])) && m.wrong++ == 0)
          m.first = fmt::format("block from rank {} element {}", s, i);
    }
    CHECK_MATCH(m);
  }
  {
    // Root drawn from the seed, so every rank agrees on it.
    auto g = rng_for(seed, -1, 202);
    const int root = static_cast<int>(g() % static_cast<uint64_t>(n));
    auto x = r == root ? gen(root, 203, block) : gen(r, 204, block);
    w.broadcast(std::span<T>(x), root).wait();
    const auto want = gen(root, 203, block);
    INFO("root " << root);
    CHECK_MATCH(compare(x, [&](size_t i) { return to_d(want[i]); }));
  }
}

TEMPLATE_TEST_CASE("all_to_all_v with random counts, many of them zero", "[comm][random][all_to_all_v]", float, int64_t,
                   bf16, unsigned char) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const uint64_t seed = run_seed();
  for (int round = 0; round < 4; ++round) {
    // The count matrix comes from the shared seed; about half the pairs send nothing, and in
    // round 3 every pair sends nothing.
    auto g = rng_for(seed, -1, 300 + round);
    std::vector<int64_t> counts(static_cast<size_t>(n) * n);
    for (auto& c : counts) c = (round == 3 || g() % 2) ? 0 : static_cast<int64_t>(g() % 3000);
    auto cnt = [&](int s, int d) { return counts[static_cast<size_t>(s) * n + d]; };
    std::vector<int64_t> sc(n), rc(n);
    for (int d = 0; d < n; ++d) sc[d] = cnt(r, d);
    for (int s = 0; s < n; ++s) rc[s] = cnt(s, r);
    auto payload = [&](int s, int d) {  // what s sends to d
      auto pg = rng_for(seed, s * 1000 + d, 310 + round);
      std::vector<T> v(static_cast<size_t>(cnt(s, d)));
      for (auto& x : v) {
        if constexpr (std::is_same_v<T, unsigned char>) x = static_cast<T>(pg() & 0xff);
        else x = from_d<T>(draw<T>(pg, false));
      }
      return v;
    };
    std::vector<T> in, out(static_cast<size_t>(std::accumulate(rc.begin(), rc.end(), int64_t{0})));
    for (int d = 0; d < n; ++d) {
      auto p = payload(r, d);
      in.insert(in.end(), p.begin(), p.end());
    }
    w.all_to_all_v(std::span<const T>(in), std::span<const int64_t>(sc), std::span<T>(out),
                   std::span<const int64_t>(rc))
        .wait();
    std::vector<T> want;
    for (int s = 0; s < n; ++s) {
      auto p = payload(s, r);
      want.insert(want.end(), p.begin(), p.end());
    }
    INFO("seed " << seed << " rank " << r << ", round " << round);
    CHECK_MATCH(compare(out, [&](size_t j) { return to_d(want[j]); }));
  }
}

TEST_CASE("random point-to-point permutation with random sizes", "[comm][random][p2p]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const uint64_t seed = run_seed();
  for (int round = 0; round < 3; ++round) {
    // Rank s sends to perm[s]; sizes (some zero) from the shared seed.
    auto g = rng_for(seed, -1, 400 + round);
    std::vector<int> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    std::vector<size_t> size(n);
    for (auto& s : size) s = g() % 4 == 0 ? 0 : g() % 50000;
    int from = 0;
    for (int s = 0; s < n; ++s)
      if (perm[s] == r) from = s;
    auto payload = [&](int s) { return random_vec<double>(seed, s, 410 + round, size[s], false); };
    const auto mine = payload(r);
    std::vector<double> got(size[from]);
    const P2POp ops[] = {P2POp::recv(std::span<double>(got), from, round),
                         P2POp::send(std::span<const double>(mine), perm[r], round)};
    w.batch_send_recv(ops).wait();
    const auto want = payload(from);
    INFO("seed " << seed << " rank " << r << " receives " << size[from] << " from " << from);
    CHECK_MATCH(compare(got, [&](size_t i) { return want[i]; }));
  }
}

TEMPLATE_TEST_CASE("zero-length calls complete and touch nothing", "[comm][empty]", float, bf16, int64_t) {
  using T = TestType;
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  std::vector<T> none;
  for (ReduceOp op : kOps) w.all_reduce(std::span<T>(none), op).wait();
  w.reduce_scatter(std::span<const T>(none), std::span<T>(none)).wait();
  w.all_gather(std::span<const T>(none), std::span<T>(none)).wait();
  w.all_to_all(std::span<const T>(none), std::span<T>(none)).wait();
  const std::vector<int64_t> zeros(n, 0);
  w.all_to_all_v(std::span<const T>(none), std::span<const int64_t>(zeros), std::span<T>(none),
                 std::span<const int64_t>(zeros))
      .wait();
  w.broadcast(std::span<T>(none), n - 1).wait();
  Work rw = w.recv(std::span<T>(none), (r + n - 1) % n, 3);
  w.send(std::span<const T>(none), (r + 1) % n, 3).wait();
  rw.wait();
  w.batch_send_recv(std::span<const P2POp>()).wait();
  // Zero-length views into a live buffer must leave it alone.
  std::vector<T> guard(4, from_d<T>(7));
  w.all_reduce(std::span<T>(guard.data() + 1, 0)).wait();
  CHECK_MATCH(compare(guard, [](size_t) { return 7.0; }));
  SUCCEED("rank " << r << ": every zero-length call completed");
}
