// Several asynchronous calls in flight at once on one communicator: started in one order,
// waited in another (reverse, interleaved, polled with test()), each on its own buffer, each
// result checked exactly.
#include <catch2/catch.hpp>

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
// Rank r contributes r + 1 + k at element i of buffer k: sum n(n+1)/2 + n k, exact.
std::vector<float> ramp(int r, size_t count, float k) { return std::vector<float>(count, static_cast<float>(r + 1) + k); }
}  // namespace

TEST_CASE("two all_reduces in flight, waited in reverse order", "[comm][async]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const double tri = n * (n + 1) / 2.0;
  for (size_t count : {size_t{3}, size_t{100000}}) {
    auto a = ramp(r, count, 0.0f);
    auto b = ramp(r, count, 100.0f);
    Work wa = w.all_reduce(std::span<float>(a));
    Work wb = w.all_reduce(std::span<float>(b), ReduceOp::max);
    wb.wait();
    wa.wait();
    INFO("rank " << r << ", count " << count);
    CHECK_MATCH(compare(a, [&](size_t) { return tri; }));
    CHECK_MATCH(compare(b, [&](size_t) { return n + 100.0; }));
  }
}

TEST_CASE("ranks wait on in-flight calls in different orders", "[comm][async]") {
  // Even ranks wait first-to-last, odd ranks last-to-first: each wait must keep the other
  // calls moving (as MPI's progress engine does), or the two halves would wait on each other.
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const double tri = n * (n + 1) / 2.0;
  for (size_t count : {size_t{3}, size_t{100000}}) {
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 4; ++k) bufs.push_back(ramp(r, count, 10.0f * k));
    std::vector<float> block(count * n), scattered(count);
    for (size_t j = 0; j < block.size(); ++j) block[j] = static_cast<float>(r + 1) + static_cast<float>(j / count);
    std::vector<Work> works;
    for (auto& b : bufs) works.push_back(w.all_reduce(std::span<float>(b)));
    works.push_back(w.reduce_scatter(std::span<const float>(block), std::span<float>(scattered)));
    if (r % 2 == 0)
      for (auto& wk : works) wk.wait();
    else
      for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
    INFO("rank " << r << ", count " << count);
    for (int k = 0; k < 4; ++k) CHECK_MATCH(compare(bufs[k], [&](size_t) { return tri + 10.0 * k * n; }));
    CHECK_MATCH(compare(scattered, [&](size_t) { return tri + static_cast<double>(n) * r; }));
  }
}

TEST_CASE("two all_gathers in flight, waited in reverse order", "[comm][async]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const size_t block = 5000;
  std::vector<int32_t> a(block), b(block), ga(block * n), gb(block * n);
  for (size_t i = 0; i < block; ++i) {
    a[i] = static_cast<int32_t>(r * 1'000'000 + i);
    b[i] = -static_cast<int32_t>(r * 1'000'000 + i) - 1;
  }
  Work wa = w.all_gather(std::span<const int32_t>(a), std::span<int32_t>(ga));
  Work wb = w.all_gather(std::span<const int32_t>(b), std::span<int32_t>(gb));
  wb.wait();
  wa.wait();
  CHECK_MATCH(compare(ga, [&](size_t j) { return static_cast<double>((j / block) * 1'000'000 + j % block); }));
  CHECK_MATCH(compare(gb, [&](size_t j) { return -static_cast<double>((j / block) * 1'000'000 + j % block) - 1; }));
}

TEST_CASE("a mix of collectives and point-to-point in flight, polled with test()", "[comm][async]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto sum = ramp(r, 20000, 1.0f);
  std::vector<double> bc(777, r == n - 1 ? 2.5 : -1.0);
  std::vector<bf16> mine(3000, bf16(static_cast<float>(r))), got(3000);
  std::vector<int64_t> gathered(static_cast<size_t>(n));
  const int64_t me[1] = {int64_t{r} * r};
  std::vector<Work> works;
  works.push_back(w.all_reduce(std::span<float>(sum), ReduceOp::avg));
  works.push_back(w.recv(std::span<bf16>(got), left, 4));
  works.push_back(w.broadcast(std::span<double>(bc), n - 1));
  works.push_back(w.send(std::span<const bf16>(mine), right, 4));
  works.push_back(w.all_gather(std::span<const int64_t>(me), std::span<int64_t>(gathered)));
  // Poll every handle until all are done (no wait at all), newest first.
  for (bool all_done = false; !all_done;) {
    all_done = true;
    for (auto it = works.rbegin(); it != works.rend(); ++it) all_done = it->test() && all_done;
  }
  for (auto& wk : works) CHECK(wk.test());  // stays complete
  INFO("rank " << r);
  CHECK_MATCH(compare(sum, [&](size_t) { return (n + 1) / 2.0 + 1.0; }));
  CHECK_MATCH(compare(bc, [&](size_t) { return 2.5; }));
  CHECK_MATCH(compare(got, [&](size_t) { return static_cast<double>(left); }));
  CHECK_MATCH(compare(gathered, [&](size_t s) { return static_cast<double>(s * s); }));
}

TEST_CASE("many all_reduces in flight, waited with wait_all", "[comm][async]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  constexpr int kInFlight = 16;
  std::vector<std::vector<int32_t>> bufs;
  for (int k = 0; k < kInFlight; ++k) bufs.emplace_back(100 + 37 * k, r + 1 + k);
  std::vector<Work> works;
  for (auto& b : bufs) works.push_back(w.all_reduce(std::span<int32_t>(b)));
  wait_all(works);
  for (int k = 0; k < kInFlight; ++k) {
    INFO("buffer " << k);
    CHECK_MATCH(compare(bufs[k], [&](size_t) { return n * (n + 1) / 2.0 + static_cast<double>(n) * k; }));
  }
}

TEST_CASE("waiting twice and testing after completion are harmless", "[comm][async]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  std::vector<double> x(10, 2.0 * r);
  Work wk = w.all_reduce(std::span<double>(x), ReduceOp::avg);
  wk.wait();
  wk.wait();
  CHECK(wk.test());
  // avg runs its division once: a second wait must not divide again.
  CHECK_MATCH(compare(x, [&](size_t) { return static_cast<double>(n - 1); }));
  Work none;
  CHECK_FALSE(none.valid());
  none.wait();
  CHECK(none.test());
}
