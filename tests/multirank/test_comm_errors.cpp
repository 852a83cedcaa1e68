// Bad arguments: buffers of the wrong size, counts that do not add up, peers and roots out of
// range, reductions of raw bytes. Each throws CommError naming the call, the group and the
// numbers, before anything is sent, without using up a sequence number or poisoning the
// communicator. Mismatched message sizes between peers fail on a fresh split communicator.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "support/multirank.h"

using namespace triax;
using namespace triax::test;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs f, which must throw CommError (not a timeout) whose message contains every part; then
// checks the communicator is untouched.
template <class F>
void expect_comm_error(Communicator& c, F&& f, std::initializer_list<std::string> parts) {
  const uint64_t calls = c.calls();
  try {
    f();
    FAIL("no CommError thrown");
  } catch (const TimeoutError& e) {
    FAIL("a timeout instead of an argument error: " << e.what());
  } catch (const CommError& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) {
      INFO("missing '" << p << "'");
      CHECK(contains(msg, p));
    }
  }
  CHECK(c.calls() == calls);
  CHECK_FALSE(c.poisoned());
}

}  // namespace

TEST_CASE("collectives refuse buffers of the wrong size, naming group and sizes", "[comm][errors]") {
  Communicator& w = world();
  const int n = w.size();
  const std::string group = "'world'";
  const size_t b = 3;
  std::vector<float> in(b * n + 1), out(b), big(b * n);

  expect_comm_error(w, [&] { w.reduce_scatter(std::span<const float>(in), std::span<float>(out)); },
                    {"reduce_scatter", group, std::to_string(b * n + 1), std::to_string(b * n)});
  expect_comm_error(w, [&] { w.all_gather(std::span<const float>(out), std::span<float>(in)); },
                    {"all_gather", group, std::to_string(b * n + 1), std::to_string(b * n)});
  expect_comm_error(w, [&] { w.all_to_all(std::span<const float>(big), std::span<float>(in)); },
                    {"all_to_all", group, std::to_string(b * n), std::to_string(b * n + 1)});
  if (n > 1) {
    std::vector<float> odd(b * n + 1), odd2(b * n + 1);
    expect_comm_error(w, [&] { w.all_to_all(std::span<const float>(odd), std::span<float>(odd2)); },
                      {"all_to_all", group, std::to_string(b * n + 1), "divisible by the group size " + std::to_string(n)});
  }

  // all_to_all_v: wrong number of counts, a negative count, counts that do not sum to the buffer.
  std::vector<int64_t> ok(n, 1), short_counts(n + 1, 1), negative(n, 1), too_many(n, 2);
  negative[n - 1] = -1;
  std::vector<float> vin(n), vout(n);
  auto a2av = [&](std::vector<int64_t>& sc, std::vector<int64_t>& rc) {
    w.all_to_all_v(std::span<const float>(vin), std::span<const int64_t>(sc), std::span<float>(vout),
                   std::span<const int64_t>(rc));
  };
  expect_comm_error(w, [&] { a2av(short_counts, ok); },
                    {"all_to_all_v", group, std::to_string(n + 1) + " send counts", "expected " + std::to_string(n)});
  expect_comm_error(w, [&] { a2av(ok, negative); }, {"all_to_all_v", group, "negative count for rank " + std::to_string(n - 1)});
  expect_comm_error(w, [&] { a2av(too_many, ok); },
                    {"all_to_all_v", group, "sum to " + std::to_string(2 * n), "buffer of " + std::to_string(n)});

  // The refusals were local: every rank is still in step.
  std::vector<int> v(2, 1);
  w.all_reduce(std::span<int>(v)).wait();
  CHECK(v[0] == n);
}

TEST_CASE("peers and roots out of range are refused", "[comm][errors]") {
  Communicator& w = world();
  const int n = w.size();
  std::vector<double> x(4, 1.0);
  for (int bad : {-1, n, n + 7}) {
    const std::string num = std::to_string(bad);
    expect_comm_error(w, [&] { w.broadcast(std::span<double>(x), bad); }, {"broadcast root " + num, "'world'", "size " + std::to_string(n)});
    expect_comm_error(w, [&] { w.send(std::span<const double>(x), bad); }, {"send peer " + num, "'world'"});
    expect_comm_error(w, [&] { w.recv(std::span<double>(x), bad); }, {"recv peer " + num, "'world'"});
    // A bad peer anywhere in a batch refuses the whole batch before any of it starts.
    std::vector<double> y(4);
    const P2POp ops[] = {P2POp::recv(std::span<double>(y), 0, 0), P2POp::send(std::span<const double>(x), bad, 0)};
    expect_comm_error(w, [&] { w.batch_send_recv(ops); }, {"batch send peer " + num, "'world'"});
  }
  w.barrier().wait();
}

TEST_CASE("raw bytes move but are never reduced", "[comm][errors]") {
  Communicator& w = world();
  const int n = w.size();
  std::vector<unsigned char> bytes(5, 1), out(5 * n);
  expect_comm_error(w, [&] { w.all_reduce(std::span<unsigned char>(bytes)); }, {"all_reduce", "uint8", "'world'"});
  expect_comm_error(w, [&] { w.reduce_scatter(std::span<const unsigned char>(out), std::span<unsigned char>(bytes)); },
                    {"reduce_scatter", "uint8", "'world'"});
  w.barrier().wait();
}

TEST_CASE("a message of the wrong size fails the receive and poisons the communicator", "[comm][errors]") {
  Communicator& w = world();
  const int n = w.size(), r = w.rank();
  if (n < 2) {
    SUCCEED("needs a peer");
    return;
  }
  // Rank 1 sends 4 elements, then 8, each on its own split; rank 0 expects 8, then 4.
  for (const auto& [sent, expected, name] : {std::tuple<size_t, size_t, const char*>{4, 8, "short_message"},
                                             std::tuple<size_t, size_t, const char*>{8, 4, "long_message"}}) {
    auto sub = w.split(0, r, name);
    if (r == 1) {
      std::vector<float> x(sent, 2.0f);
      sub->send(std::span<const float>(x), 0, 3).wait();
    } else if (r == 0) {
      std::vector<float> got(expected);
      try {
        sub->recv(std::span<float>(got), 1, 3).wait();
        FAIL("a message of " << sent << " elements was accepted by a receive of " << expected);
      } catch (const TimeoutError& e) {
        FAIL("a timeout instead of a size error: " << e.what());
      } catch (const CommError& e) {
        const std::string msg = e.what();
        INFO(msg);
        CHECK(contains(msg, "recv #0"));
        CHECK(contains(msg, "'" + std::string(name) + "'"));
        if (sent < expected) CHECK(contains(msg, fmt::format("received {} elements from the peer, expected {}", sent, expected)));
        else CHECK(contains(msg, "more than the receive buffer holds"));
      }
      CHECK(sub->poisoned());
    }
    w.barrier().wait();
  }
}

TEST_CASE("TRIAX_COMM_TIMEOUT_S must be a positive number", "[comm][errors]") {
  const char* old = std::getenv("TRIAX_COMM_TIMEOUT_S");
  const std::string saved = old ? old : "";
  for (const char* bad : {"soon", "0", "-3", "12s", ""}) {
    ::setenv("TRIAX_COMM_TIMEOUT_S", bad, 1);
    INFO("TRIAX_COMM_TIMEOUT_S='" << bad << "'");
    CHECK_THROWS_AS(default_comm_timeout(), ConfigError);
  }
  ::setenv("TRIAX_COMM_TIMEOUT_S", "2.5", 1);
  CHECK(default_comm_timeout() == std::chrono::milliseconds(2500));
  ::unsetenv("TRIAX_COMM_TIMEOUT_S");
  CHECK(default_comm_timeout() == std::chrono::milliseconds(600'000));
  if (old) ::setenv("TRIAX_COMM_TIMEOUT_S", saved.c_str(), 1);
}

TEST_CASE("all_to_all_v on one rank refuses to send itself more than it receives", "[comm][errors]") {
  Communicator& w = world();
  {
    // A group of one per rank: Self's copy (or MPI's truncation check) must catch it, not
    // overrun the 3-element output.
    auto alone = w.split(w.rank(), 0, "alone");
    REQUIRE(alone->size() == 1);
    std::vector<float> in(5, 1.0f), out(4, -1.0f);
    const int64_t sc[1] = {5}, rc[1] = {3};
    try {
      alone->all_to_all_v(std::span<const float>(in), std::span<const int64_t>(sc), std::span<float>(out.data(), 3),
                          std::span<const int64_t>(rc))
          .wait();
      FAIL("5 elements were sent into a receive of 3");
    } catch (const CommError& e) {
      INFO(e.what());
      CHECK(contains(e.what(), "all_to_all_v"));
      CHECK(contains(e.what(), "'alone'"));
    }
    CHECK(out[3] == -1.0f);  // nothing written past the receive
  }
  w.barrier().wait();
}
