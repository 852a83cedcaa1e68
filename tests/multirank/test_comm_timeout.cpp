// Timeouts: a receive whose peer never sends and a collective that the other ranks skip must
// fail with a TimeoutError that names the call, its sequence number, the group and the peer,
// and leave the communicator poisoned. Each case runs on a fresh split communicator, so the
// world communicator stays usable, and ends with a world barrier, so no rank is left waiting.
#include <catch2/catch.hpp>

#include <chrono>

#include "support/multirank.h"

using namespace triax;
using namespace triax::test;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A later call on a poisoned communicator throws CommError (not a new timeout) and says why.
void check_poisoned(Communicator& c) {
  CHECK(c.poisoned());
  const uint64_t calls = c.calls();
  try {
    std::vector<float> x(4, 1.0f);
    c.all_reduce(std::span<float>(x)).wait();
    FAIL("a call on a poisoned communicator succeeded");
  } catch (const TimeoutError& e) {
    FAIL("expected a CommError about the earlier failure, got a new timeout: " << e.what());
  } catch (const CommError& e) {
    INFO(e.what());
    CHECK(contains(e.what(), "cannot be used again"));
    CHECK(contains(e.what(), "'" + c.name() + "'"));
  }
  CHECK(c.calls() == calls);  // refused before it was numbered
}

}  // namespace

TEST_CASE("a receive from a peer that never sends times out naming the peer", "[comm][timeout]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  // With one rank the "peer" is the rank itself, which never sends either.
  const int peer = n > 1 ? 1 : 0;
  {
    auto sub = w.split(0, r, "timeout_p2p");
    REQUIRE(sub);
    sub->set_timeout(300ms);
    sub->barrier().wait();  // seq 0: the receive below is call #1
    if (r == 0) {
      std::vector<double> got(16);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        sub->recv(std::span<double>(got), peer, 7).wait();
        FAIL("the receive completed although rank " << peer << " never sent");
      } catch (const TimeoutError& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK(contains(msg, "recv #1"));
        CHECK(contains(msg, "'timeout_p2p'"));
        CHECK(contains(msg, fmt::format("peer group rank {} (world rank {})", peer, peer)));
        CHECK(contains(msg, "float64 x 16"));
        CHECK(contains(msg, "0.300 s"));
      }
      const auto waited = std::chrono::steady_clock::now() - t0;
      CHECK(waited >= 300ms);
      CHECK(waited < 10s);
      check_poisoned(*sub);
    }
    // Everyone meets on the world, which the timeout did not touch, before the split goes away.
    w.barrier().wait();
  }
  CHECK_FALSE(w.poisoned());
}

TEST_CASE("a batch receive from a silent peer names that peer", "[comm][timeout]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  if (n < 2) {
    SUCCEED("needs a peer");
    return;
  }
  {
    auto sub = w.split(0, r, "timeout_batch");
    sub->set_timeout(300ms);
    if (r == 0) {
      std::vector<int32_t> got(3);
      const P2POp ops[] = {P2POp::recv(std::span<int32_t>(got), n - 1, 2)};
      try {
        sub->batch_send_recv(ops).wait();
        FAIL("the batch completed although its peer never sent");
      } catch (const TimeoutError& e) {
        INFO(e.what());
        CHECK(contains(e.what(), "batch_send_recv #0"));
        CHECK(contains(e.what(), fmt::format("peer group rank {} (world rank {})", n - 1, n - 1)));
        CHECK(contains(e.what(), "'timeout_batch'"));
      }
      check_poisoned(*sub);
    }
    w.barrier().wait();
  }
}

TEST_CASE("a collective the other ranks skip times out naming the group", "[comm][timeout]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  if (n < 2) {
    SUCCEED("with one rank nobody can skip the collective");
    return;
  }
  {
    // Members are world ranks in reverse order, so group and world ranks differ.
    auto sub = w.split(0, n - 1 - r, "skipped");
    sub->set_timeout(300ms);
    if (r == 0) {
      std::vector<float> x(8, 1.0f);  // small: whatever rank 0 sends goes eagerly, nothing waits on it
      try {
        sub->all_reduce(std::span<float>(x)).wait();
        FAIL("the all_reduce completed although the other ranks never called it");
      } catch (const TimeoutError& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK(contains(msg, "all_reduce #0"));
        CHECK(contains(msg, "'skipped'"));
        std::string members;
        for (int s = n - 1; s >= 0; --s) members += fmt::format("{}{}", s, s ? "," : "");
        CHECK(contains(msg, "world ranks [" + members + "]"));
        CHECK(contains(msg, "other members of the group"));
      }
      check_poisoned(*sub);
    }
    // The barrier lets every rank take in rank 0's eager fragments on the still-live split, so
    // none can surface later on a communicator that reuses its context id.
    w.barrier().wait();
  }
  // The world still works and still agrees on its results.
  int v[1] = {r + 1};
  w.all_reduce(std::span<int>(v)).wait();
  CHECK(v[0] == n * (n + 1) / 2);
}

TEST_CASE("Work::wait with an explicit timeout overrides the communicator's", "[comm][timeout]") {
  Communicator& w = world();
  const int r = w.rank();
  {
    auto sub = w.split(r, 0, "alone");  // one rank per group: a receive from itself never matches
    REQUIRE(sub->size() == 1);
    std::vector<float> got(2);
    Work rw = sub->recv(std::span<float>(got), 0, 1);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(rw.wait(50ms), TimeoutError);
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(waited >= 50ms);
    CHECK(waited < sub->timeout());
    CHECK(sub->poisoned());
  }
  w.barrier().wait();
}
