// The torchrun-style TCP bootstrap, tested with real local processes and no mpirun: each test
// forks its ranks, sets RANK / WORLD_SIZE / MASTER_ADDR=127.0.0.1 / MASTER_PORT in the child,
// and checks every all_gather against a closed form. Children run plain functions (no Catch2
// macros) and leave with _exit, so the forked Catch2 state never runs its exit handlers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "triax/core/error.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/gloo_comm.h"
#include "triax/distributed/bootstrap/tcp_wire.h"
#include "triax/faults/fault_injection.h"

#include <fmt/format.h>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using triax::Bootstrap;
using triax::BootstrapOptions;

constexpr int kExpectedError = 3;  // child exit code: the error the test wanted, with the right text

// ---- environment ----

// Every variable the launcher detection or the TCP bootstrap reads; saved and restored around
// in-process tests so that they neither see nor leak launch variables.
const char* const kVars[] = {"RANK",           "WORLD_SIZE",        "LOCAL_RANK",          "MASTER_ADDR",
                             "MASTER_PORT",    "TRIAX_MASTER_PORT", "TRIAX_JOB_ID",        "TORCHELASTIC_RUN_ID",
                             "TRIAX_HOSTNAME", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",        "PMI_RANK",
                             "TORCHELASTIC_USE_AGENT_STORE", "SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE",
                             "TRIAX_COMM"};

// The job token every test rank shares unless a test says otherwise (a launch needs one).
const char* const kTestJob = "test-job";

class EnvGuard {
 public:
  EnvGuard() {
    for (const char* v : kVars) {
      const char* s = std::getenv(v);
      saved_.emplace_back(v, s ? std::optional<std::string>(s) : std::nullopt);
      ::unsetenv(v);
    }
    ::setenv("TRIAX_JOB_ID", kTestJob, 1);
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void set_env(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

// A port nothing listens on right now: bind port 0 on loopback, read it back, close.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The environment of one rank in a forked test.
struct RankEnv {
  int rank = 0;
  int world = 1;
  int port = 0;
  std::string addr = "127.0.0.1";
  std::optional<int> local_rank;
  std::string host;  // TRIAX_HOSTNAME
  std::string job = kTestJob;  // TRIAX_JOB_ID
  std::vector<std::pair<std::string, std::string>> extra;  // more variables
};

void apply(const RankEnv& e) {
  for (const char* v : kVars) ::unsetenv(v);
  set_env("RANK", std::to_string(e.rank));
  set_env("WORLD_SIZE", std::to_string(e.world));
  set_env("MASTER_ADDR", e.addr);
  set_env("MASTER_PORT", std::to_string(e.port));
  if (e.local_rank) set_env("LOCAL_RANK", std::to_string(*e.local_rank));
  if (!e.host.empty()) set_env("TRIAX_HOSTNAME", e.host);
  if (!e.job.empty()) set_env("TRIAX_JOB_ID", e.job);
  for (const auto& [k, v] : e.extra) set_env(k.c_str(), v);
}

// A listening socket on 127.0.0.1:port (port 0: any), standing in for another service.
struct Listener {
  int fd = -1;
  int port = 0;
  explicit Listener(int want = 0) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(want));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 4) != 0) {
      ::close(fd);
      fd = -1;
      return;
    }
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
};

// ---- forked ranks ----

using ChildFn = std::function<int(std::string& msg)>;

// Children started by fork; each reports an exit code and a message through a pipe. The
// destructor kills (SIGKILL, by pid) and reaps whatever is still running.
class Procs {
 public:
  struct Child {
    std::string name;
    pid_t pid = -1;
    int fd = -1;
    bool done = false;
    int code = -1;
    std::string msg;
  };

  ~Procs() {
    for (auto& c : kids_) {
      if (!c.done) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
      }
      if (c.fd >= 0) ::close(c.fd);
    }
  }

  size_t spawn(std::string name, ChildFn fn) {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    std::fflush(nullptr);  // nothing buffered may be written twice
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(p[0]);
      std::string msg;
      int code = 1;
      try {
        code = fn(msg);
      } catch (const std::exception& e) {
        msg = std::string("unexpected exception: ") + e.what();
        code = 2;
      } catch (...) {
        msg = "unexpected non-std exception";
        code = 2;
      }
      if (msg.size() > 3000) msg.resize(3000);  // stays below the pipe buffer: write never blocks
      [[maybe_unused]] auto n = ::write(p[1], msg.data(), msg.size());
      ::_exit(code);
    }
    ::close(p[1]);
    ::fcntl(p[0], F_SETFL, O_NONBLOCK);
    kids_.push_back({std::move(name), pid, p[0]});
    return kids_.size() - 1;
  }

  // Waits until every child in `which` (all when empty) has exited; false at the time limit.
  bool wait(std::chrono::milliseconds limit, std::vector<size_t> which = {}) {
    if (which.empty())
      for (size_t i = 0; i < kids_.size(); ++i) which.push_back(i);
    const auto end = Clock::now() + limit;
    for (;;) {
      reap();
      bool all = true;
      for (size_t i : which) all = all && kids_[i].done;
      if (all) return true;
      if (Clock::now() >= end) return false;
      std::this_thread::sleep_for(5ms);
    }
  }

  // Waits until one child in `which` has exited; its index, or -1 at the time limit.
  long wait_any(std::chrono::milliseconds limit, const std::vector<size_t>& which) {
    const auto end = Clock::now() + limit;
    for (;;) {
      reap();
      for (size_t i : which)
        if (kids_[i].done) return static_cast<long>(i);
      if (Clock::now() >= end) return -1;
      std::this_thread::sleep_for(5ms);
    }
  }

  const Child& operator[](size_t i) const { return kids_[i]; }
  size_t size() const { return kids_.size(); }

  std::string report() const {
    std::string out;
    for (const auto& c : kids_)
      out += c.name + ": " + (c.done ? "exit " + std::to_string(c.code) : std::string("still running")) +
             (c.msg.empty() ? "" : " -- " + c.msg) + "\n";
    return out;
  }

 private:
  void drain(Child& c) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(c.fd, buf, sizeof(buf))) > 0) c.msg.append(buf, static_cast<size_t>(n));
  }
  void reap() {
    for (auto& c : kids_) {
      if (c.done) continue;
      drain(c);
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.done = true;
        c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        drain(c);
      }
    }
  }
  std::vector<Child> kids_;
};

// In a child: runs fn and expects an E whose message contains every needle.
template <class E>
int expect_error(const std::function<void()>& fn, const std::vector<std::string>& needles, std::string& msg) {
  try {
    fn();
    msg = "no exception";
    return 1;
  } catch (const E& e) {
    msg = e.what();
    for (const auto& n : needles)
      if (msg.find(n) == std::string::npos) {
        msg = "message lacks '" + n + "': " + msg;
        return 1;
      }
    return kExpectedError;
  } catch (const std::exception& e) {
    msg = std::string("wrong exception type: ") + e.what();
    return 1;
  }
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// ---- the closed form every rank checks ----

// Rank r's contribution in round k of a world of w: lengths differ per rank and round, some are
// empty, one rank per round sends about 1 MiB, and the bytes depend on (r, k, position).
size_t payload_len(int r, int k, int w) {
  if ((r + k) % 3 == 0) return 0;
  if (r == k % w) return (size_t{1} << 20) + 17 * static_cast<size_t>(r);
  return 1 + 37 * static_cast<size_t>(r) + 11 * static_cast<size_t>(k);
}
std::string payload(int r, int k, int w) {
  std::string s(payload_len(r, k, w), '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((r * 131 + k * 29 + i * 7 + (i >> 8)) & 0xff);
  return s;
}

std::string host_of(int r) { return r % 2 ? "node-b" : "node-a"; }

constexpr int kRounds = 4;

// The happy path on one rank: kRounds all_gathers, broadcasts from non-zero roots, a barrier,
// the host names, each checked exactly; 0 when all hold.
int check_rank(Bootstrap* boot, const RankEnv& e, int expected_local_rank, std::string& msg) {
  if (boot->kind() != triax::LaunchKind::env || boot->rank() != e.rank || boot->world_size() != e.world) {
    msg = "wrong kind/rank/world from Bootstrap::create";
    return 1;
  }
  if (boot->local_rank() != expected_local_rank) {
    msg = "local_rank " + std::to_string(boot->local_rank()) + ", expected " + std::to_string(expected_local_rank);
    return 1;
  }
  for (int k = 1; k <= kRounds; ++k) {
    const auto all = boot->all_gather(payload(e.rank, k, e.world));
    if (all.size() != static_cast<size_t>(e.world)) {
      msg = "round " + std::to_string(k) + ": " + std::to_string(all.size()) + " contributions";
      return 1;
    }
    for (int r = 0; r < e.world; ++r)
      if (all[static_cast<size_t>(r)] != payload(r, k, e.world)) {
        msg = "round " + std::to_string(k) + ": rank " + std::to_string(r) + "'s bytes differ (got " +
              std::to_string(all[static_cast<size_t>(r)].size()) + " bytes, expected " +
              std::to_string(payload_len(r, k, e.world)) + ")";
        return 1;
      }
  }
  for (int root : {e.world - 1, e.world / 2}) {
    const std::string data = "from root " + std::to_string(root) + payload(root, 99, e.world);
    const std::string got = boot->broadcast(e.rank == root ? data : std::string("ignored"), root);
    if (got != data) {
      msg = "broadcast from root " + std::to_string(root) + " differs";
      return 1;
    }
  }
  boot->barrier();
  const auto hosts = boot->all_gather(triax::host_name());
  for (int r = 0; r < e.world; ++r)
    if (hosts[static_cast<size_t>(r)] != host_of(r)) {
      msg = "host of rank " + std::to_string(r) + " is '" + hosts[static_cast<size_t>(r)] + "'";
      return 1;
    }
  if (!triax::gloo_available())
    return expect_error<triax::ConfigError>([&] { boot->world(); }, {"without Gloo"}, msg) == kExpectedError ? 0 : 1;
  // The host communicator over this rendezvous: Gloo, whose pairs listen on this host's resolved
  // name here (the ranks pose as two hosts).
  auto world = boot->world();
  int64_t v[2] = {e.rank + 1, -e.rank};
  world->all_reduce(std::span<int64_t>(v)).wait();
  const int64_t n = e.world;
  if (world->backend() != triax::CommBackend::gloo || world->size() != e.world || v[0] != n * (n + 1) / 2 ||
      v[1] != -n * (n - 1) / 2) {
    msg = fmt::format("world(): backend {}, size {}, all_reduce gave {} {}", triax::backend_name(world->backend()),
                      world->size(), v[0], v[1]);
    return 1;
  }
  return 0;
}

// One rank that finds the launch through Bootstrap::create (launcher detection), then checks.
int gather_rank(const RankEnv& e, int expected_local_rank, std::string& msg) {
  apply(e);
  auto boot = Bootstrap::create(BootstrapOptions{.timeout = 30s});
  return check_rank(boot.get(), e, expected_local_rank, msg);
}

// Connects a raw client to 127.0.0.1:port, retrying while the master starts.
int raw_connect(int port) {
  const auto end = Clock::now() + 20s;
  while (Clock::now() < end) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

// Reads until the peer closes (or 10 s pass); everything it sent.
std::string read_to_end(int fd, bool* closed) {
  std::string out;
  const auto end = Clock::now() + 10s;
  *closed = false;
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends a frame as a hand-made client and returns the reject reason the master answers with.
std::string raw_exchange(int port, const std::string& bytes, bool* closed) {
  const int fd = raw_connect(port);
  REQUIRE(fd >= 0);
  REQUIRE(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()));
  std::string reply = read_to_end(fd, closed);
  ::close(fd);
  return reply;
}

// Decodes one reject frame; empty if the reply is not exactly that.
std::string reject_reason(const std::string& reply) {
  using namespace triax::tcp;
  if (reply.size() < kHeaderBytes) return {};
  std::array<std::byte, kHeaderBytes> head;
  std::memcpy(head.data(), reply.data(), kHeaderBytes);
  const auto h = decode_header(head);
  if (h.magic != kMagic || h.type != static_cast<uint16_t>(FrameType::reject) || h.length != reply.size() - kHeaderBytes)
    return {};
  return reply.substr(kHeaderBytes);
}

}  // namespace

TEST_CASE("tcp bootstrap: forked ranks all_gather exact payloads over several rounds", "[tcp]") {
  struct Case {
    int world;
    bool explicit_local_rank;
    const char* addr;
  };
  const auto c = GENERATE(Case{2, false, "127.0.0.1"}, Case{3, true, "127.0.0.1"}, Case{4, false, "localhost"},
                          Case{8, false, "127.0.0.1"});
  CAPTURE(c.world, c.explicit_local_rank, c.addr);
  const int port = free_port();
  Procs procs;
  // Highest rank first: the workers retry against a master that is not listening yet.
  for (int r = c.world - 1; r >= 0; --r) {
    RankEnv e{r, c.world, port, c.addr};
    e.host = host_of(r);
    int expect = r / 2;  // ranks alternate between node-a and node-b
    if (c.explicit_local_rank) {
      e.local_rank = (r * 5 + 1) % c.world;  // a launcher's value wins over the host names
      expect = *e.local_rank;
    }
    procs.spawn("rank " + std::to_string(r), [e, expect](std::string& msg) { return gather_rank(e, expect, msg); });
  }
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  for (size_t i = 0; i < procs.size(); ++i) CHECK(procs[i].code == 0);
}

TEST_CASE("tcp bootstrap: one rank needs no master and no sockets", "[tcp]") {
  EnvGuard guard;
  set_env("RANK", "0");
  set_env("WORLD_SIZE", "1");
  auto boot = Bootstrap::create();
  CHECK(boot->kind() == triax::LaunchKind::env);
  CHECK(boot->rank() == 0);
  CHECK(boot->world_size() == 1);
  CHECK(boot->local_rank() == 0);
  CHECK(boot->all_gather("abc") == std::vector<std::string>{"abc"});
  CHECK(boot->broadcast("xyz", 0) == "xyz");
  CHECK_THROWS_AS(boot->broadcast("xyz", 1), triax::ConfigError);
  // Its world is Gloo (one rank here), unless TRIAX_COMM asks for MPI, which needs mpirun.
  set_env("TRIAX_COMM", "mpi");
  CHECK_THROWS_WITH(boot->world(), Catch::Contains("TRIAX_COMM=mpi") && Catch::Contains("without mpirun"));
  set_env("TRIAX_COMM", "nccl");
  CHECK_THROWS_WITH(boot->world(), Catch::Contains("TRIAX_COMM='nccl'") && Catch::Contains("auto, mpi or gloo"));
  ::unsetenv("TRIAX_COMM");
  if (triax::gloo_available()) {
    auto w = boot->world();
    CHECK(w->backend() == triax::CommBackend::gloo);
    CHECK(w->size() == 1);
    int v[2] = {3, 4};
    w->all_reduce(std::span<int>(v)).wait();
    CHECK(v[0] == 3);
    CHECK(w->calls() == 1);
  } else {
    CHECK_THROWS_WITH(boot->world(), Catch::Contains("without Gloo"));
  }
}

TEST_CASE("tcp bootstrap: launcher detection picks the env bootstrap only for RANK and WORLD_SIZE", "[tcp]") {
  EnvGuard guard;
  CHECK(Bootstrap::create()->kind() == triax::LaunchKind::single);
  set_env("RANK", "0");
  CHECK(Bootstrap::create()->kind() == triax::LaunchKind::single);
  set_env("WORLD_SIZE", "2");
  // The env path is taken: it fails on the missing MASTER_ADDR, before any socket exists.
  CHECK_THROWS_WITH(Bootstrap::create(), Catch::Contains("MASTER_ADDR is not set"));
}

TEST_CASE("tcp bootstrap: bad launch variables are ConfigErrors naming the variable and value", "[tcp]") {
  struct Bad {
    const char* var;
    const char* value;  // nullptr: unset
    const char* needle;
  };
  const auto bad = GENERATE(Bad{"RANK", nullptr, "RANK is not set"}, Bad{"RANK", "", "RANK='' is set but empty"},
                            Bad{"RANK", "abc", "RANK='abc' is not an integer"}, Bad{"RANK", "1.5", "RANK='1.5'"},
                            Bad{"RANK", " 1", "RANK=' 1'"}, Bad{"RANK", "-1", "RANK='-1' is out of range"},
                            Bad{"RANK", "4", "RANK='4' is out of range; expected 0 <= RANK < WORLD_SIZE=4"},
                            Bad{"RANK", "99999999999999999999", "RANK='99999999999999999999' is out of range"},
                            Bad{"WORLD_SIZE", nullptr, "WORLD_SIZE is not set"},
                            Bad{"WORLD_SIZE", "0", "WORLD_SIZE='0' is out of range"},
                            Bad{"WORLD_SIZE", "four", "WORLD_SIZE='four' is not an integer"},
                            Bad{"WORLD_SIZE", "2000000", "WORLD_SIZE='2000000' is out of range"},
                            Bad{"LOCAL_RANK", "x", "LOCAL_RANK='x' is not an integer"},
                            Bad{"LOCAL_RANK", "-3", "LOCAL_RANK='-3' is out of range"},
                            Bad{"LOCAL_RANK", "4", "LOCAL_RANK='4' is out of range; expected 0 <= LOCAL_RANK < WORLD_SIZE=4"},
                            Bad{"MASTER_ADDR", nullptr, "MASTER_ADDR is not set"},
                            Bad{"MASTER_ADDR", "", "MASTER_ADDR='' is set but empty; expected a host name"},
                            Bad{"MASTER_ADDR", "host name", "MASTER_ADDR='host name'"},
                            Bad{"MASTER_PORT", nullptr, "MASTER_PORT is not set"},
                            Bad{"MASTER_PORT", "0", "MASTER_PORT='0' is out of range"},
                            Bad{"MASTER_PORT", "65536", "MASTER_PORT='65536' is out of range"},
                            Bad{"MASTER_PORT", "http", "MASTER_PORT='http' is not an integer"});
  CAPTURE(bad.var, bad.value ? bad.value : "(unset)");
  EnvGuard guard;
  // A valid world of 4 (rank 2 would connect; every case fails before it gets that far).
  set_env("RANK", "2");
  set_env("WORLD_SIZE", "4");
  set_env("LOCAL_RANK", "1");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", "29500");
  if (bad.value) set_env(bad.var, bad.value);
  else ::unsetenv(bad.var);
  CHECK_THROWS_AS(triax::make_env_bootstrap({}), triax::ConfigError);
  CHECK_THROWS_WITH(triax::make_env_bootstrap({}), Catch::Contains(bad.needle));
}

TEST_CASE("tcp bootstrap: a non-positive timeout is a ConfigError", "[tcp]") {
  EnvGuard guard;
  set_env("RANK", "0");
  set_env("WORLD_SIZE", "1");
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 0ms}), Catch::Contains("timeout must be positive"));
}

TEST_CASE("tcp bootstrap: an unreachable master is a CommError naming address, port and time", "[tcp]") {
  EnvGuard guard;
  const int port = free_port();
  set_env("RANK", "1");
  set_env("WORLD_SIZE", "2");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(port));
  const auto t0 = Clock::now();
  std::string what;
  try {
    triax::make_env_bootstrap(BootstrapOptions{.timeout = 1s});
  } catch (const triax::CommError& e) {
    what = e.what();
  }
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  INFO(what);
  CHECK(contains(what, "master unreachable at 127.0.0.1:" + std::to_string(port)));
  CHECK(contains(what, "rank 1"));
  CHECK(contains(what, "timeout 1.0 s"));
  CHECK(contains(what, "Connection refused"));
  CHECK(s >= 0.95);
  CHECK(s < 3.0);
}

TEST_CASE("tcp bootstrap: the master times out naming the ranks that never came", "[tcp]") {
  EnvGuard guard;
  const int port = free_port();
  set_env("RANK", "0");
  set_env("WORLD_SIZE", "3");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(port));
  const auto t0 = Clock::now();
  CHECK_THROWS_AS(triax::make_env_bootstrap(BootstrapOptions{.timeout = 1s}), triax::TimeoutError);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(s >= 0.95);
  CHECK(s < 3.0);
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 200ms}),
                    Catch::Contains("1 of 3 ranks connected; missing ranks [1,2]") &&
                        Catch::Contains("127.0.0.1:" + std::to_string(port)));

  // A refused process shows up in the timeout message too.
  Procs procs;
  procs.spawn("raw client", [port](std::string& msg) {
    using namespace triax::tcp;
    const int fd = raw_connect(port);
    if (fd < 0) return 1;
    const std::string hello = encode_frame(FrameType::hello, 0, encode_hello(Hello{1, 7, kTestJob, "raw-client"}));
    if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) return 1;
    bool closed = false;
    msg = reject_reason(read_to_end(fd, &closed));
    ::close(fd);
    return contains(msg, "WORLD_SIZE=7 (sent by RANK=1) differs") ? 0 : 1;
  });
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 1500ms}),
                    Catch::Contains("missing ranks [1,2]; refused: 127.0.0.1:") &&
                        Catch::Contains("WORLD_SIZE=7 (sent by RANK=1) differs from rank 0's WORLD_SIZE=3"));
  REQUIRE(procs.wait(20s));
  INFO(procs.report());
  CHECK(procs[0].code == 0);
}

TEST_CASE("tcp bootstrap: a MASTER_PORT in use is a CommError naming it", "[tcp]") {
  EnvGuard guard;
  Listener blocker;
  REQUIRE(blocker.fd >= 0);
  set_env("RANK", "0");
  set_env("WORLD_SIZE", "2");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(blocker.port));
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 1s}),
                    Catch::Contains("MASTER_PORT=" + std::to_string(blocker.port)) &&
                        Catch::Contains("Address already in use") && Catch::Contains("TRIAX_MASTER_PORT"));
}

TEST_CASE("tcp bootstrap: under torchrun's agent store the rendezvous moves to MASTER_PORT+1", "[tcp]") {
  // torchrun's agent serves its own TCPStore on MASTER_PORT; the blocker plays that part.
  std::unique_ptr<Listener> store;
  for (int tries = 0; tries < 50 && !store; ++tries) {
    store = std::make_unique<Listener>();
    Listener next(store->port + 1);  // the pair must be free; released again at once
    if (store->fd < 0 || next.fd < 0 || store->port == 65535) store.reset();
  }
  REQUIRE(store);
  Procs procs;
  for (int r = 0; r < 3; ++r) {
    RankEnv e{r, 3, store->port, "127.0.0.1", std::nullopt, host_of(r)};
    e.extra = {{"TORCHELASTIC_USE_AGENT_STORE", "True"}};
    procs.spawn("rank " + std::to_string(r), [e](std::string& msg) { return gather_rank(e, e.rank / 2, msg); });
  }
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  for (size_t i = 0; i < procs.size(); ++i) CHECK(procs[i].code == 0);

  EnvGuard guard;
  set_env("RANK", "1");
  set_env("WORLD_SIZE", "2");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(store->port));
  set_env("TORCHELASTIC_USE_AGENT_STORE", "True");
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 100ms}),
                    Catch::Contains(fmt::format("master unreachable at 127.0.0.1:{} (MASTER_ADDR=127.0.0.1, MASTER_PORT+1={} "
                                                "(torchrun's agent store holds MASTER_PORT={}))",
                                                store->port + 1, store->port + 1, store->port)));
  set_env("MASTER_PORT", "65535");
  CHECK_THROWS_WITH(triax::make_env_bootstrap({}), Catch::Contains("set TRIAX_MASTER_PORT"));
}

TEST_CASE("tcp bootstrap: TRIAX_MASTER_PORT overrides MASTER_PORT", "[tcp]") {
  Listener taken;
  REQUIRE(taken.fd >= 0);
  const int own = free_port();
  Procs procs;
  for (int r = 0; r < 2; ++r) {
    RankEnv e{r, 2, taken.port, "127.0.0.1", std::nullopt, host_of(r)};
    e.extra = {{"TRIAX_MASTER_PORT", std::to_string(own)}, {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
    procs.spawn("rank " + std::to_string(r), [e](std::string& msg) { return gather_rank(e, 0, msg); });
  }
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  for (size_t i = 0; i < procs.size(); ++i) CHECK(procs[i].code == 0);

  EnvGuard guard;
  set_env("RANK", "1");
  set_env("WORLD_SIZE", "2");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("TRIAX_MASTER_PORT", std::to_string(own));  // MASTER_PORT may then be absent
  CHECK_THROWS_WITH(triax::make_env_bootstrap(BootstrapOptions{.timeout = 100ms}),
                    Catch::Contains(fmt::format("master unreachable at 127.0.0.1:{} (MASTER_ADDR=127.0.0.1, TRIAX_MASTER_PORT={})",
                                                own, own)));
  set_env("TRIAX_MASTER_PORT", "x1");
  CHECK_THROWS_WITH(triax::make_env_bootstrap({}), Catch::Contains("TRIAX_MASTER_PORT='x1' is not an integer"));
}

TEST_CASE("tcp bootstrap: a duplicate RANK is refused with an error to that process", "[tcp]") {
  const int port = free_port();
  Procs procs;
  const auto ok = [](RankEnv e) { return [e](std::string& msg) { return gather_rank(e, e.rank / 2, msg); }; };
  const auto dup_or_ok = [](RankEnv e) {
    return [e](std::string& msg) {
      // Whichever of the two rank-1 processes reaches the master second is refused.
      apply(e);
      std::unique_ptr<Bootstrap> boot;
      const int rc = expect_error<triax::ConfigError>(
          [&] { boot = triax::make_env_bootstrap({.timeout = 30s}); },
          {"rank 1", "refused this process", "RANK=1 is already taken by 127.0.0.1:"}, msg);
      if (!boot) return rc;
      msg.clear();
      return check_rank(boot.get(), e, e.rank / 2, msg);
    };
  };
  // A world of 3 cannot complete before rank 2 starts, so both rank-1 processes meet the master.
  const size_t master = procs.spawn("rank 0", ok(RankEnv{0, 3, port, "127.0.0.1", std::nullopt, host_of(0)}));
  const size_t a = procs.spawn("rank 1 (a)", dup_or_ok(RankEnv{1, 3, port, "127.0.0.1", std::nullopt, host_of(1)}));
  const size_t b = procs.spawn("rank 1 (b)", dup_or_ok(RankEnv{1, 3, port, "127.0.0.1", std::nullopt, host_of(1)}));
  const long first = procs.wait_any(30s, {a, b});
  INFO(procs.report());
  REQUIRE(first >= 0);
  CHECK(procs[static_cast<size_t>(first)].code == kExpectedError);
  procs.spawn("rank 2", ok(RankEnv{2, 3, port, "127.0.0.1", std::nullopt, host_of(2)}));
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[first == static_cast<long>(a) ? b : a].code == 0);
  CHECK(procs[3].code == 0);
}

TEST_CASE("tcp bootstrap: a process with another WORLD_SIZE or job id is refused", "[tcp]") {
  const int port = free_port();
  Procs procs;
  const size_t master = procs.spawn("rank 0", [port](std::string& msg) {
    return gather_rank(RankEnv{0, 2, port, "127.0.0.1", std::nullopt, host_of(0), "job-7"}, 0, msg);
  });
  const size_t wrong_world = procs.spawn("rank 1, WORLD_SIZE=3", [port](std::string& msg) {
    apply(RankEnv{1, 3, port, "127.0.0.1", std::nullopt, host_of(1), "job-7"});
    return expect_error<triax::ConfigError>([] { triax::make_env_bootstrap({.timeout = 30s}); },
                                            {"WORLD_SIZE=3 (sent by RANK=1) differs from rank 0's WORLD_SIZE=2"}, msg);
  });
  const size_t wrong_job = procs.spawn("rank 1, other job", [port](std::string& msg) {
    apply(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, host_of(1), "job-8"});
    return expect_error<triax::ConfigError>([] { triax::make_env_bootstrap({.timeout = 30s}); },
                                            {"job id 'job-8' differs from rank 0's 'job-7'"}, msg);
  });
  // The right rank 1 only after both impostors were refused, so neither can win a race.
  REQUIRE(procs.wait(30s, {wrong_world, wrong_job}));
  procs.spawn("rank 1", [port](std::string& msg) {
    return gather_rank(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, host_of(1), "job-7"}, 0, msg);
  });
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[wrong_world].code == kExpectedError);
  CHECK(procs[wrong_job].code == kExpectedError);
  CHECK(procs[3].code == 0);
}

TEST_CASE("tcp bootstrap: hand-made bad hellos get a reject frame, foreign bytes a closed connection", "[tcp]") {
  using namespace triax::tcp;
  const int port = free_port();
  Procs procs;
  const size_t master = procs.spawn("rank 0", [port](std::string& msg) {
    return gather_rank(RankEnv{0, 2, port, "127.0.0.1", std::nullopt, host_of(0)}, 0, msg);
  });
  bool closed = false;
  auto hello = [](int rank, int world) { return encode_hello(Hello{rank, world, kTestJob, "raw-client"}); };

  std::string reply = raw_exchange(port, encode_frame(FrameType::hello, 0, hello(5, 2)), &closed);
  CHECK(closed);
  CHECK(contains(reject_reason(reply), "RANK=5 is out of range for WORLD_SIZE=2; expected 1..1"));

  reply = raw_exchange(port, encode_frame(FrameType::hello, 0, hello(0, 2)), &closed);
  CHECK(contains(reject_reason(reply), "RANK=0 is taken by the master itself"));

  std::string v2 = encode_header({kMagic, 2, static_cast<uint16_t>(FrameType::hello), 0, hello(1, 2).size()}) + hello(1, 2);
  reply = raw_exchange(port, v2, &closed);
  CHECK(contains(reject_reason(reply), "protocol version 2 but rank 0 speaks version 1"));

  reply = raw_exchange(port, encode_frame(FrameType::contribution, 1, "x"), &closed);
  CHECK(contains(reject_reason(reply), "expected a hello frame, got 'contribution'"));

  reply = raw_exchange(port, encode_frame(FrameType::hello, 0, hello(1, 2).substr(0, 10)), &closed);
  CHECK(contains(reject_reason(reply), "malformed hello frame"));

  reply = raw_exchange(port, "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", &closed);
  CHECK(closed);
  CHECK(reply.empty());

  procs.spawn("rank 1", [port](std::string& msg) {
    return gather_rank(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, host_of(1)}, 0, msg);
  });
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[1].code == 0);
}

TEST_CASE("tcp bootstrap: a rank that dies is named by the master at once, not after the timeout", "[tcp]") {
  const int port = free_port();
  Procs procs;
  const size_t master = procs.spawn("rank 0", [port](std::string& msg) {
    apply(RankEnv{0, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 30s});
    const auto t0 = Clock::now();
    const int rc = expect_error<triax::CommError>([&] { boot->all_gather("x"); },
                                                  {"rank 0: rank 1 (127.0.0.1:", "closed its connection during bootstrap all_gather round 1"},
                                                  msg);
    if (rc == kExpectedError && Clock::now() - t0 > 10s) return 1;
    if (rc != kExpectedError) return rc;
    // The failure is sticky: the next call says why instead of touching dead sockets.
    return expect_error<triax::CommError>([&] { boot->all_gather("y"); }, {"unusable after an earlier failure"}, msg);
  });
  procs.spawn("rank 1", [port](std::string&) {
    apply(RankEnv{1, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 30s});
    ::_exit(0);  // dies without running destructors, like a crash
    return 0;
  });
  REQUIRE(procs.wait(40s));
  INFO(procs.report());
  CHECK(procs[master].code == kExpectedError);
  CHECK(procs[1].code == 0);
}

TEST_CASE("tcp bootstrap: a master that dies is named by the workers", "[tcp]") {
  const int port = free_port();
  Procs procs;
  procs.spawn("rank 0", [port](std::string&) {
    apply(RankEnv{0, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 30s});
    ::_exit(0);
    return 0;
  });
  const size_t worker = procs.spawn("rank 1", [port](std::string& msg) {
    apply(RankEnv{1, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 30s});
    std::this_thread::sleep_for(200ms);  // let rank 0 be gone
    const auto t0 = Clock::now();
    const int rc = expect_error<triax::CommError>(
        [&] { boot->all_gather(std::string(1 << 20, 'z')); }, {"rank 1:", "rank 0 (master at 127.0.0.1:" + std::to_string(port)}, msg);
    return rc == kExpectedError && Clock::now() - t0 > 10s ? 1 : rc;
  });
  REQUIRE(procs.wait(40s));
  INFO(procs.report());
  CHECK(procs[worker].code == kExpectedError);
}

TEST_CASE("tcp bootstrap: a silent rank times out the round; the others learn which rank it was", "[tcp]") {
  const int port = free_port();
  Procs procs;
  const auto timeout = 2s;
  const size_t master = procs.spawn("rank 0", [port, timeout](std::string& msg) {
    apply(RankEnv{0, 3, port});
    auto boot = triax::make_env_bootstrap({.timeout = timeout});
    const auto t0 = Clock::now();
    const int rc = expect_error<triax::TimeoutError>([&] { boot->all_gather("m"); },
                                                     {"all_gather round 1: ranks [2] sent nothing within"}, msg);
    const auto took = Clock::now() - t0;
    if (rc == kExpectedError && (took < timeout - 50ms || took > timeout + 3s)) {
      msg = "timeout fired after " + std::to_string(std::chrono::duration<double>(took).count()) + " s: " + msg;
      return 1;
    }
    return rc;
  });
  const size_t waiting = procs.spawn("rank 1", [port, timeout](std::string& msg) {
    apply(RankEnv{1, 3, port});
    auto boot = triax::make_env_bootstrap({.timeout = timeout});
    return expect_error<triax::CommError>([&] { boot->all_gather("w"); },
                                          {"rank 1: bootstrap all_gather round 1 aborted by rank 0", "ranks [2]"}, msg);
  });
  procs.spawn("rank 2", [port, timeout](std::string&) {
    apply(RankEnv{2, 3, port});
    auto boot = triax::make_env_bootstrap({.timeout = timeout});
    std::this_thread::sleep_for(timeout + 2s);  // connected, but never contributes
    return 0;
  });
  REQUIRE(procs.wait(40s));
  INFO(procs.report());
  CHECK(procs[master].code == kExpectedError);
  CHECK(procs[waiting].code == kExpectedError);
  CHECK(procs[2].code == 0);
}

TEST_CASE("tcp bootstrap: a worker whose master never answers times out naming rank 0", "[tcp]") {
  const int port = free_port();
  Procs procs;
  procs.spawn("rank 0", [port](std::string&) {
    apply(RankEnv{0, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 30s});
    std::this_thread::sleep_for(4s);  // never calls all_gather
    return 0;
  });
  const size_t worker = procs.spawn("rank 1", [port](std::string& msg) {
    apply(RankEnv{1, 2, port});
    auto boot = triax::make_env_bootstrap({.timeout = 1s});
    return expect_error<triax::TimeoutError>(
        [&] { boot->all_gather("w"); },
        {"rank 1: no bootstrap all_gather round 1 result from rank 0 (master at 127.0.0.1:" + std::to_string(port)}, msg);
  });
  REQUIRE(procs.wait(40s));
  INFO(procs.report());
  CHECK(procs[worker].code == kExpectedError);
  CHECK(procs[0].code == 0);
}

TEST_CASE("gloo world: a rank that dies fails its peer's next collective at once, naming the call", "[tcp][gloo]") {
  if (!triax::gloo_available()) {
    SUCCEED("built without Gloo");
    return;
  }
  EnvGuard guard;
  const int port = free_port();
  Procs procs;
  for (int r = 1; r >= 0; --r) {
    RankEnv e{r, 2, port, "127.0.0.1"};
    procs.spawn("rank " + std::to_string(r), [e](std::string& msg) {
      apply(e);
      auto boot = Bootstrap::create(BootstrapOptions{.timeout = 30s});
      auto world = boot->world();
      world->barrier().wait();
      if (e.rank == 1) {
        std::this_thread::sleep_for(200ms);  // lets rank 0 read the barrier's last message
        ::_exit(0);                          // then dies without a word: its sockets close
      }
      std::this_thread::sleep_for(600ms);
      float x[3] = {1, 2, 3};
      const auto t0 = std::chrono::steady_clock::now();
      try {
        world->all_reduce(std::span<float>(x)).wait();
        msg = "the all_reduce completed without its peer";
        return 1;
      } catch (const triax::TimeoutError& err) {
        msg = std::string("a timeout instead of the peer's failure: ") + err.what();
        return 1;
      } catch (const triax::CommError& err) {
        msg = err.what();
        const bool fast = std::chrono::steady_clock::now() - t0 < 20s;
        return contains(msg, "all_reduce #1 (float32 x 3, sum)") && contains(msg, "'world'") && fast &&
                       world->poisoned()
                   ? 0
                   : 1;
      }
    });
  }
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  for (size_t i = 0; i < procs.size(); ++i) CHECK(procs[i].code == 0);
}

TEST_CASE("tcp bootstrap: the job token comes from the launcher, or is required", "[tcp]") {
  EnvGuard guard;
  ::unsetenv("TRIAX_JOB_ID");
  set_env("RANK", "1");
  set_env("WORLD_SIZE", "2");
  set_env("MASTER_ADDR", "127.0.0.1");
  set_env("MASTER_PORT", std::to_string(free_port()));
  // Nothing every rank of one launch shares: refused before anything connects.
  CHECK_THROWS_AS(triax::make_env_bootstrap({.timeout = 200ms}), triax::ConfigError);
  CHECK_THROWS_WITH(triax::make_env_bootstrap({.timeout = 200ms}),
                    Catch::Contains("no job token") && Catch::Contains("TRIAX_JOB_ID"));
  set_env("TRIAX_JOB_ID", std::string(300, 'j'));
  CHECK_THROWS_WITH(triax::make_env_bootstrap({.timeout = 200ms}),
                    Catch::Contains("the job token from TRIAX_JOB_ID is 300 bytes; at most 256"));
  set_env("TRIAX_HOSTNAME", std::string(5000, 'h'));
  set_env("TRIAX_JOB_ID", "j");
  CHECK_THROWS_WITH(triax::make_env_bootstrap({.timeout = 200ms}),
                    Catch::Contains("the host name (TRIAX_HOSTNAME or gethostname) is 5000 bytes; at most 255"));
}

TEST_CASE("tcp bootstrap: a stranger without the job's Slurm id cannot take a rank", "[tcp]") {
  const int port = free_port();
  auto slurm = [](const char* job) {
    return std::vector<std::pair<std::string, std::string>>{{"SLURM_JOB_ID", job}, {"SLURM_STEP_ID", "0"}};
  };
  Procs procs;
  const size_t master = procs.spawn("rank 0", [&](std::string& msg) {
    RankEnv e{0, 2, port, "127.0.0.1", std::nullopt, host_of(0), "", slurm("41")};
    return gather_rank(e, 0, msg);
  });
  const size_t stranger = procs.spawn("a process of job 42 claiming rank 1", [&](std::string& msg) {
    apply(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, "stranger", "", slurm("42")});
    return expect_error<triax::ConfigError>([] { triax::make_env_bootstrap({.timeout = 30s}); },
                                            {"job id 'slurm:42.0' differs from rank 0's 'slurm:41.0' (from "
                                             "SLURM_JOB_ID.SLURM_STEP_ID)"},
                                            msg);
  });
  REQUIRE(procs.wait(30s, {stranger}));
  procs.spawn("rank 1", [&](std::string& msg) {
    return gather_rank(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, host_of(1), "", slurm("41")}, 0, msg);
  });
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[stranger].code == kExpectedError);
  CHECK(procs[2].code == 0);
}

TEST_CASE("tcp bootstrap: hello fields are bounded, half-open connections are not called duplicates", "[tcp]") {
  using namespace triax::tcp;
  const int port = free_port();
  Procs procs;
  const size_t master = procs.spawn("rank 0", [port](std::string& msg) {
    return gather_rank(RankEnv{0, 2, port, "127.0.0.1", std::nullopt, host_of(0)}, 0, msg);
  });
  bool closed = false;
  // A 5 MB host name: refused from the header alone, with a short reason.
  // (Only its header is sent: the master must answer without reading, or waiting for, the rest.)
  const std::string big = encode_hello(Hello{1, 2, kTestJob, std::string(5u << 20, 'h')});
  std::string reply = raw_exchange(
      port, encode_header({kMagic, kVersion, static_cast<uint16_t>(FrameType::hello), 0, big.size()}), &closed);
  CHECK(closed);
  const std::string why = reject_reason(reply);
  CHECK(contains(why, "-byte hello exceeds the " + std::to_string(kMaxHelloPayload) + "-byte limit"));
  CHECK(why.size() < 200);
  // A connection that never says hello, open while the real rank 1 completes the rendezvous.
  const int idle = raw_connect(port);
  REQUIRE(idle >= 0);
  std::this_thread::sleep_for(200ms);
  procs.spawn("rank 1", [port](std::string& msg) {
    return gather_rank(RankEnv{1, 2, port, "127.0.0.1", std::nullopt, host_of(1)}, 0, msg);
  });
  reply = read_to_end(idle, &closed);
  ::close(idle);
  const std::string idle_why = reject_reason(reply);
  CHECK(contains(idle_why, "sent no complete hello; it is not a rank of this job"));
  CHECK(!contains(idle_why, "duplicate"));
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[1].code == 0);
}

namespace {
// An IPv4 address of this host other than loopback ("" when there is none).
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr;
    if ((ntohl(a.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    if (::inet_ntop(AF_INET, &a, buf, sizeof buf)) out = buf;
  }
  ::freeifaddrs(list);
  return out;
}

// 0 when a TCP connection to ip:port is accepted, else errno.
int try_connect(const std::string& ip, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}
}  // namespace

TEST_CASE("tcp bootstrap: the master listens only on the MASTER_ADDR it was given", "[tcp]") {
  const std::string ip = non_loopback_ipv4();
  if (ip.empty()) {
    WARN("no non-loopback IPv4 address on this host: nothing to check");
    return;
  }
  const int port = free_port();
  Procs procs;
  const size_t master = procs.spawn("rank 0", [&](std::string& msg) {
    return gather_rank(RankEnv{0, 2, port, ip, std::nullopt, host_of(0)}, 0, msg);
  });
  // Once the master listens on ip:port, loopback on the same port must be refused.
  const auto end = Clock::now() + 20s;
  while (try_connect(ip, port) != 0 && Clock::now() < end) std::this_thread::sleep_for(20ms);
  REQUIRE(try_connect(ip, port) == 0);
  CHECK(try_connect("127.0.0.1", port) == ECONNREFUSED);
  procs.spawn("rank 1", [&](std::string& msg) {
    return gather_rank(RankEnv{1, 2, port, ip, std::nullopt, host_of(1)}, 0, msg);
  });
  REQUIRE(procs.wait(60s));
  INFO(procs.report());
  CHECK(procs[master].code == 0);
  CHECK(procs[1].code == 0);
}

// Peer death without mpirun: rank 2 is killed, exits or throws at iteration 3 while the others
// compute without talking to the rendezvous (as inside a NCCL collective); the peer watch names
// rank 2 to every other rank within seconds. Ranks leaving normally say goodbye: no false alarm.
namespace {
int watched_rank(const RankEnv& e, const std::string& fault, int iters, std::string& msg) {
  apply(e);
  triax::BootstrapOptions o;
  o.timeout = 20s;
  auto boot = triax::make_env_bootstrap(o);
  std::mutex mu;
  std::string death;
  std::atomic<bool> dead{false};
  boot->watch_peers([&](const std::string& m) {
    std::lock_guard lock(mu);
    death = m;
    dead.store(true);
  });
  boot->barrier();
  const triax::FaultInjector faults(triax::parse_faults(fault), e.rank);
  for (int it = 1; it <= iters; ++it) {
    faults.at_step_start(it);
    for (int k = 0; k < 10 && !dead.load(); ++k) std::this_thread::sleep_for(5ms);
    if (dead.load()) {
      std::lock_guard lock(mu);
      msg = death;
      return 4;
    }
  }
  msg = "finished without noticing a death";
  return 0;
}
}  // namespace

TEST_CASE("tcp bootstrap: a dead rank is named to every other rank within seconds", "[tcp][faults]") {
  const std::string kind = GENERATE(std::string("kill"), std::string("exit"), std::string("throw"));
  CAPTURE(kind);
  const int port = free_port();
  Procs procs;
  for (int r = 3; r >= 0; --r) {
    RankEnv e{r, 4, port, "127.0.0.1"};
    e.host = "node" + std::to_string(r);
    // 400 iterations of ~50 ms: far longer than the 10 s the others may take to notice.
    procs.spawn("rank " + std::to_string(r),
                [e, kind](std::string& msg) { return watched_rank(e, "2:3:" + kind, 400, msg); });
  }
  const size_t rank2 = 1;  // spawned in order 3, 2, 1, 0
  REQUIRE(procs.wait_any(30s, {rank2}) == static_cast<long>(rank2));
  const auto died = Clock::now();
  REQUIRE(procs.wait(10s));
  const double secs = std::chrono::duration<double>(Clock::now() - died).count();
  INFO(procs.report());
  CHECK(secs < 10.0);
  CHECK(procs[rank2].code != 0);
  for (size_t i : {size_t{0}, size_t{2}, size_t{3}}) {
    CHECK(procs[i].code == 4);
    CHECK_THAT(procs[i].msg, Catch::Contains("rank 2 (") && Catch::Contains("host node2") && Catch::Contains("died"));
  }
}

TEST_CASE("tcp bootstrap: watched ranks that finish normally raise no alarm", "[tcp][faults]") {
  const int port = free_port();
  Procs procs;
  for (int r = 3; r >= 0; --r) {
    RankEnv e{r, 4, port, "127.0.0.1"};
    // Ranks leave at different times, without a final barrier: rank 0 (the master) first.
    procs.spawn("rank " + std::to_string(r), [e](std::string& msg) { return watched_rank(e, "", 3 + 2 * e.rank, msg); });
  }
  REQUIRE(procs.wait(30s));
  INFO(procs.report());
  for (size_t i = 0; i < procs.size(); ++i) CHECK(procs[i].code == 0);
}
