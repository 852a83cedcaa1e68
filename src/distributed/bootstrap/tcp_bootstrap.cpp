// torchrun-style bootstrap: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or
// TRIAX_MASTER_PORT) from the environment and a star-shaped TCP rendezvous through rank 0 (docs/BOOTSTRAP.md). Rank 0
// accepts one connection per rank and keeps them open; each all_gather is one round trip over
// them. Every wait has a deadline, so a missing or dead peer is an error that names it.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <exception>
#include <cstring>
#include <atomic>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/ranges.h>

#include "tcp_socket.h"
#include "triax/core/env.h"
#include "triax/core/log.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/gloo_comm.h"
#include "triax/distributed/comm/host_comm.h"
#include "triax/distributed/bootstrap/tcp_wire.h"

namespace triax {
namespace {

using namespace std::chrono_literals;
using tcp::Clock;
using tcp::FrameReader;
using tcp::FrameType;
using tcp::IoStatus;
using tcp::Socket;

// A rank count no launcher reaches; larger values are typos (and would need that many fds).
constexpr long long kMaxWorldSize = 1 << 20;

// ---- environment ----

using LaunchEnv = TcpLaunch;  // job: TRIAX_JOB_ID, else TORCHELASTIC_RUN_ID, else empty

constexpr const char* kLaunchVars =
    "a torchrun-style launch sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (LOCAL_RANK optional)";

void require_set(const char* name) {
  if (!env_set(name)) TRIAX_THROW(ConfigError, "{} is not set: {}", name, kLaunchVars);
}

// A launch variable that must be set, as an integer in [lo, hi]; `expected` names the range.
int required_int(const char* name, int64_t lo, int64_t hi, const std::string& expected) {
  require_set(name);
  return static_cast<int>(*env_int_opt(name, lo, hi, expected));
}

LaunchEnv read_launch_env() {
  LaunchEnv e;
  e.world_size = required_int("WORLD_SIZE", 1, kMaxWorldSize, fmt::format("1 <= WORLD_SIZE <= {}", kMaxWorldSize));
  e.rank = required_int("RANK", 0, e.world_size - 1, fmt::format("0 <= RANK < WORLD_SIZE={}", e.world_size));
  if (auto lr = env_int_opt("LOCAL_RANK", 0, e.world_size - 1, fmt::format("0 <= LOCAL_RANK < WORLD_SIZE={}", e.world_size)))
    e.local_rank = static_cast<int>(*lr);
  // One process needs no rendezvous: MASTER_* are checked when given but not required.
  const bool need_master = e.world_size > 1;
  if (need_master) require_set("MASTER_ADDR");
  if (auto addr = env_string_opt("MASTER_ADDR", "a host name or IP address (of the host running rank 0)")) {
    if (addr->find_first_of(" \t\r\n") != std::string::npos)
      TRIAX_THROW(ConfigError, "MASTER_ADDR='{}' is not a host name or IP address (of the host running rank 0)", *addr);
    e.master_addr = *addr;
  }
  if (need_master && !env_set("TRIAX_MASTER_PORT")) require_set("MASTER_PORT");
  const auto port = env_port_opt("MASTER_PORT");
  if (port) {
    e.master_port = *port;
    e.port_desc = fmt::format("MASTER_PORT={}", e.master_port);
  }
  if (auto own = env_port_opt("TRIAX_MASTER_PORT")) {
    // triax's own port, for launchers that occupy MASTER_PORT themselves.
    e.master_port = *own;
    e.port_desc = fmt::format("TRIAX_MASTER_PORT={}", e.master_port);
  } else if (port && env_flag("TORCHELASTIC_USE_AGENT_STORE", false)) {
    // torchrun's elastic agent already serves its TCPStore on MASTER_PORT (and says so with
    // TORCHELASTIC_USE_AGENT_STORE): every rank takes the next port, so they still agree.
    if (e.master_port == 65535)
      TRIAX_THROW(ConfigError, "MASTER_PORT=65535 is held by torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE) "
                               "and triax's rendezvous would use MASTER_PORT+1; set TRIAX_MASTER_PORT to a free port");
    e.port_desc = fmt::format("MASTER_PORT+1={} (torchrun's agent store holds MASTER_PORT={})", e.master_port + 1,
                              e.master_port);
    ++e.master_port;
  }
  // The job token: what every rank of one launch shares and a process of another job does not.
  if (auto j = env_string_opt("TRIAX_JOB_ID")) e.job = *j, e.job_desc = "TRIAX_JOB_ID";
  else if (auto t = env_string_opt("TORCHELASTIC_RUN_ID")) e.job = *t, e.job_desc = "TORCHELASTIC_RUN_ID";
  else if (auto s = env_string_opt("SLURM_JOB_ID"))
    e.job = fmt::format("slurm:{}.{}", *s, env_string("SLURM_STEP_ID", "")), e.job_desc = "SLURM_JOB_ID.SLURM_STEP_ID";
  else if (auto p = env_string_opt("PMIX_NAMESPACE")) e.job = "pmix:" + *p, e.job_desc = "PMIX_NAMESPACE";
  if (e.world_size > 1 && e.job.empty())
    TRIAX_THROW(ConfigError,
                "no job token for the TCP rendezvous: set TRIAX_JOB_ID to one value shared by every rank of this "
                "launch (torchrun's TORCHELASTIC_RUN_ID, Slurm's SLURM_JOB_ID or PMIx's PMIX_NAMESPACE are used "
                "when present); without it any process that reaches MASTER_PORT could take a rank");
  if (e.job.size() > tcp::kMaxJobBytes)
    TRIAX_THROW(ConfigError, "the job token from {} is {} bytes; at most {}", e.job_desc, e.job.size(), tcp::kMaxJobBytes);
  return e;
}

// ---- the bootstrap ----

class TcpBootstrap final : public Bootstrap {
 public:
  TcpBootstrap(LaunchEnv e, std::chrono::milliseconds timeout)
      : env_(std::move(e)), timeout_(timeout), master_(tcp::endpoint(env_.master_addr, env_.master_port)) {
    hosts_.assign(static_cast<size_t>(env_.world_size), std::string());
    hosts_[static_cast<size_t>(env_.rank)] = host_name();
    if (hosts_[static_cast<size_t>(env_.rank)].size() > tcp::kMaxHostBytes)
      TRIAX_THROW(ConfigError, "rank {}: the host name (TRIAX_HOSTNAME or gethostname) is {} bytes; at most {}",
                  env_.rank, hosts_[static_cast<size_t>(env_.rank)].size(), tcp::kMaxHostBytes);
    if (env_.world_size > 1) {
      if (env_.rank == 0) rendezvous_master();
      else rendezvous_worker();
    }
    if (env_.local_rank) {
      local_rank_ = *env_.local_rank;
    } else {
      // Ranks before this one on the same host: the launcher's LOCAL_RANK when it numbers
      // ranks host by host, as torchrun does.
      const auto& me = hosts_[static_cast<size_t>(env_.rank)];
      local_rank_ = static_cast<int>(std::count(hosts_.begin(), hosts_.begin() + env_.rank, me));
    }
  }

  ~TcpBootstrap() override {
    if (!watching_) return;
    // Destroyed while an exception unwinds: the rank is failing, and its peers must hear of it.
    // After a failure (a dead peer, a failed round) there is no goodbye either.
    if (std::uncaught_exceptions() == 0 && broken_.empty()) {
      // Goodbye first, so that peers still running do not take this exit for a death.
      std::lock_guard lock(io_mu_);
      const auto d = Clock::now() + 200ms;
      if (env_.rank == 0) {
        for (auto& p : peers_)
          if (p.sock.valid()) tcp::send_frame(p.sock.fd(), FrameType::bye, round_, {}, d);
      } else if (master_sock_.valid()) {
        tcp::send_frame(master_sock_.fd(), FrameType::bye, round_, {}, d);
      }
    }
    watch_stop_.store(true);
    if (watcher_.joinable()) watcher_.join();
  }

  void watch_peers(std::function<void(const std::string&)> on_death) override {
    if (env_.world_size == 1 || watching_) return;
    // The heartbeat: keepalive probes after 2 s of silence, every 1 s, 3 unanswered = dead.
    auto keepalive = [](int fd) {
      const int on = 1, idle = 2, intvl = 1, cnt = 3;
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    };
    if (env_.rank == 0) {
      for (auto& p : peers_)
        if (p.sock.valid()) keepalive(p.sock.fd());
    } else {
      keepalive(master_sock_.fd());
    }
    watching_ = true;
    watcher_ = std::thread([this, cb = std::move(on_death)] { watch_loop(cb); });
  }

  LaunchKind kind() const override { return env_.kind; }
  int rank() const override { return env_.rank; }
  int world_size() const override { return env_.world_size; }
  int local_rank() const override { return local_rank_; }

  std::vector<std::string> all_gather(std::string_view mine) override {
    if (env_.world_size == 1) return {std::string(mine)};
    std::lock_guard lock(io_mu_);  // the peer watch reads a connection only while no round runs
    if (!broken_.empty())
      TRIAX_THROW(CommError, "rank {}: the TCP bootstrap is unusable after an earlier failure: {}", env_.rank, broken_);
    ++round_;
    return env_.rank == 0 ? gather_master(mine) : gather_worker(mine);
  }

  // Gloo over this rendezvous (its pairs' addresses travel through all_gather).
  std::shared_ptr<Communicator> world() override {
    if (!world_) {
      if (host_comm_choice() == HostComm::mpi)
        TRIAX_THROW(ConfigError,
                    "rank {}: TRIAX_COMM=mpi, but the processes were launched without mpirun ({} launch through the "
                    "TCP rendezvous); launch with mpirun, or unset TRIAX_COMM to use Gloo",
                    env_.rank, launch_kind_name(env_.kind));
      world_ = make_gloo_communicator(*this, "world");
    }
    return world_;
  }

 private:
  struct Peer {
    Socket sock;
    FrameReader reader;
    std::string addr;  // remote address, for messages
  };

  // Workers wait a little longer than the master for the master's answer, so that when a
  // round fails the master's abort frame (which names the missing rank) arrives before the
  // worker's own, less informative, timeout fires.
  std::chrono::milliseconds reply_grace() const {
    return std::clamp(std::chrono::milliseconds(timeout_ / 10), std::chrono::milliseconds(100),
                      std::chrono::milliseconds(5000));
  }

  std::string who(int r) const {
    const auto& p = peers_[static_cast<size_t>(r)];
    return fmt::format("rank {} ({}, host {})", r, p.addr, hosts_[static_cast<size_t>(r)]);
  }

  // Master: tells every connected worker why the job failed, closes every connection, and
  // throws. Best effort with a short shared deadline: a dead worker must not delay the error.
  template <class E>
  [[noreturn]] void fail_master(const std::string& msg) {
    const auto d = Clock::now() + 500ms;
    const std::string text = fmt::format("rank 0 (master at {}): {}", master_, msg);
    for (auto& p : peers_) {
      if (!p.sock.valid()) continue;
      tcp::send_frame(p.sock.fd(), FrameType::abort, round_, text, d);
      p.sock.close();
    }
    broken_ = msg;
    throw E(fmt::format("rank 0: {}", msg));
  }

  template <class E>
  [[noreturn]] void fail_worker(const std::string& msg) {
    master_sock_.close();
    broken_ = msg;
    throw E(fmt::format("rank {}: {}", env_.rank, msg));
  }

  // ---- peer watch ----

  // After a peer closed its end: reads what it left (a goodbye or rank 0's abort) to the end.
  // Returns the frame type seen last, or 0 when the connection ended without one.
  static uint16_t drain(int fd, FrameReader& reader, std::string* payload) {
    uint16_t last = 0;
    const auto d = Clock::now() + 200ms;
    for (;;) {
      const auto st = tcp::read_frame(fd, reader, d);
      if (st != FrameReader::State::frame) return last;
      last = reader.header().type;
      *payload = reader.take_payload();
    }
  }

  void watch_loop(const std::function<void(const std::string&)>& on_death) {
    std::vector<int> watched;  // master: worker ranks still connected; worker: {0}
    if (env_.rank == 0)
      for (int r = 1; r < env_.world_size; ++r) watched.push_back(r);
    else
      watched.push_back(0);
    while (!watch_stop_.load() && !watched.empty()) {
      std::vector<pollfd> fds;
      // Workers also read what rank 0 sends outside a round (an abort naming a dead rank, a goodbye);
      // rank 0 never reads outside a round: a worker's next contribution may already be on its way.
      for (int r : watched)
        fds.push_back({r == 0 ? master_sock_.fd() : peers_[static_cast<size_t>(r)].sock.fd(),
                       static_cast<short>(r == 0 ? POLLIN | POLLRDHUP : POLLRDHUP), 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      // A round in progress reads the connections itself (and fails naming a dead peer).
      std::unique_lock lock(io_mu_, std::try_to_lock);
      if (!lock.owns_lock() || watch_stop_.load()) {
        std::this_thread::sleep_for(20ms);
        continue;
      }
      std::vector<int> still;
      for (size_t i = 0; i < watched.size(); ++i) {
        const int r = watched[i];
        if (!(fds[i].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
          still.push_back(r);
          continue;
        }
        std::string payload;
        if (env_.rank != 0) {
          const uint16_t t = drain(master_sock_.fd(), master_reader_, &payload);
          if (t == static_cast<uint16_t>(FrameType::bye)) continue;
          if (t == 0 && !(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) {  // part of a frame so far
            still.push_back(r);
            continue;
          }
          const std::string msg =
              t == static_cast<uint16_t>(FrameType::abort)
                  ? fmt::format("rank {}: peer failure reported by the rendezvous: {}", env_.rank, payload)
                  : fmt::format("rank {}: lost the connection to rank 0 (the rendezvous master at {}, host {}) without "
                                "a goodbye: rank 0 died, was killed, or its host is unreachable",
                                env_.rank, master_, hosts_[0]);
          broken_ = msg;
          lock.unlock();
          on_death(msg);
          return;
        }
        auto& p = peers_[static_cast<size_t>(r)];
        if (drain(p.sock.fd(), p.reader, &payload) == static_cast<uint16_t>(FrameType::bye)) continue;
        const std::string msg = fmt::format(
            "{} died: its rendezvous connection closed without a goodbye (the process exited, was killed, or its host "
            "is unreachable)",
            who(r));
        // Name it to every other rank, then close: their watch reads the abort.
        const auto d = Clock::now() + 500ms;
        for (auto& q : peers_)
          if (q.sock.valid() && &q != &p) tcp::send_frame(q.sock.fd(), FrameType::abort, round_, msg, d);
        broken_ = msg;
        lock.unlock();
        on_death(fmt::format("rank 0: {}", msg));
        return;
      }
      watched = std::move(still);
    }
  }

  // ---- rendezvous, master side ----

  // Why the master refuses this hello, or empty when it takes it (then *hello is filled).
  std::string check_hello(const tcp::FrameHeader& h, std::string_view payload, const std::string& bound,
                          tcp::Hello* hello) const {
    if (h.version != tcp::kVersion)
      return fmt::format("protocol version {} but rank 0 speaks version {}: one job mixes triax builds", h.version,
                         tcp::kVersion);
    if (h.type != static_cast<uint16_t>(FrameType::hello))
      return fmt::format("expected a hello frame, got '{}'", tcp::frame_type_name(h.type));
    try {
      *hello = tcp::decode_hello(payload);
    } catch (const CommError& e) {
      return e.what();
    }
    const int w = env_.world_size;
    if (hello->job.size() > tcp::kMaxJobBytes || hello->host.size() > tcp::kMaxHostBytes)
      return fmt::format("a hello with a {}-byte job token and a {}-byte host name (limits {} and {})",
                         hello->job.size(), hello->host.size(), tcp::kMaxJobBytes, tcp::kMaxHostBytes);
    if (hello->job != env_.job)
      return fmt::format("job id '{}' differs from rank 0's '{}' (from {}): a process of another job reached this "
                         "MASTER_PORT",
                         hello->job, env_.job, env_.job_desc);
    if (hello->world_size != w)
      return fmt::format("WORLD_SIZE={} (sent by RANK={}) differs from rank 0's WORLD_SIZE={}", hello->world_size,
                         hello->rank, w);
    if (hello->rank == 0)
      return fmt::format("RANK=0 is taken by the master itself ({}); the other processes need RANK 1..{}", bound, w - 1);
    if (hello->rank < 1 || hello->rank >= w)
      return fmt::format("RANK={} is out of range for WORLD_SIZE={}; expected 1..{}", hello->rank, w, w - 1);
    const auto& slot = peers_[static_cast<size_t>(hello->rank)];
    if (slot.sock.valid())
      return fmt::format("RANK={} is already taken by {} (host {}): two processes were started with the same RANK",
                         hello->rank, slot.addr, hosts_[static_cast<size_t>(hello->rank)]);
    return {};
  }

  // The refused connections for a timeout message: the first few, then a count (a port
  // scanner must not produce a megabyte-long exception).
  static std::string refused_summary(const std::vector<std::string>& rejected) {
    constexpr size_t kShown = 8;
    std::string out;
    for (size_t i = 0; i < rejected.size() && i < kShown; ++i) out += (i ? "; " : "") + rejected[i];
    if (rejected.size() > kShown) out += fmt::format("; and {} more", rejected.size() - kShown);
    return out;
  }

  // The master's rendezvous in progress: the listening socket, the connections that have not
  // sent a complete hello yet, and what was refused (for the timeout message).
  struct MasterRendezvous {
    Clock::time_point start, deadline;
    std::string bound;                  // the address the listener is bound to
    Socket listener;
    std::vector<Peer> pending;          // accepted, hello not yet complete
    std::vector<std::string> rejected;  // "address: reason", for the timeout message
    int connected = 1;                  // ranks connected, the master included
  };

  void reject(MasterRendezvous& rv, Peer& p, const std::string& reason) {
    log::warn("TCP rendezvous: refused {}: {}", p.addr, reason);
    rv.rejected.push_back(fmt::format("{}: {}", p.addr, reason));
    tcp::send_frame(p.sock.fd(), FrameType::reject, 0, reason, Clock::now() + 500ms);
    p.sock.close();
  }

  // A complete hello: the peer takes its RANK's slot, or is refused with the reason.
  void admit(MasterRendezvous& rv, Peer& p) {
    const auto h = p.reader.header();
    const std::string payload = p.reader.take_payload();
    tcp::Hello hello;
    if (std::string why = check_hello(h, payload, rv.bound, &hello); !why.empty()) return reject(rv, p, why);
    log::debug("TCP rendezvous: rank {} connected from {} (host {})", hello.rank, p.addr, hello.host);
    hosts_[static_cast<size_t>(hello.rank)] = hello.host;
    p.reader.set_limit(tcp::kMaxPayload);  // an admitted rank's all_gather contributions
    peers_[static_cast<size_t>(hello.rank)] = std::move(p);
    ++rv.connected;
  }

  [[noreturn]] void fail_rendezvous_timeout(const MasterRendezvous& rv) {
    std::vector<int> missing;
    for (int r = 1; r < env_.world_size; ++r)
      if (!peers_[static_cast<size_t>(r)].sock.valid()) missing.push_back(r);
    fail_master<TimeoutError>(fmt::format(
        "TCP rendezvous on {} timed out after {}: {} of {} ranks connected; missing ranks [{}]{}{}. Are all "
        "WORLD_SIZE processes started, with MASTER_ADDR={} ({}) reachable from their hosts?",
        rv.bound, tcp::format_duration(Clock::now() - rv.start), rv.connected, env_.world_size,
        fmt::join(missing, ","), rv.rejected.empty() ? "" : "; refused: ", refused_summary(rv.rejected),
        env_.master_addr, env_.port_desc));
  }

  // Reads what the half-open connections sent (their poll results from fds[k], in order): a
  // complete hello is admitted or refused, anything else drops the connection.
  void pump_pending(MasterRendezvous& rv, const std::vector<pollfd>& fds, size_t& k) {
    std::vector<Peer> still_pending;
    for (auto& p : rv.pending) {
      const short ev = fds[k++].revents;
      if (!ev) {
        still_pending.push_back(std::move(p));
        continue;
      }
      switch (p.reader.pump(p.sock.fd())) {
        case FrameReader::State::need_more: still_pending.push_back(std::move(p)); break;
        case FrameReader::State::frame: admit(rv, p); break;
        case FrameReader::State::bad_magic:
          // Not a triax peer (a port scanner, another service): no reply in a protocol it
          // does not speak.
          log::warn("TCP rendezvous: dropped {}: not a triax rendezvous peer (magic 0x{:08x})", p.addr,
                    p.reader.header().magic);
          rv.rejected.push_back(fmt::format("{}: not a triax rendezvous peer", p.addr));
          break;
        case FrameReader::State::too_large:
          reject(rv, p, fmt::format("a {}-byte hello exceeds the {}-byte limit", p.reader.header().length,
                                    p.reader.limit()));
          break;
        case FrameReader::State::closed:
        case FrameReader::State::error: log::debug("TCP rendezvous: {} went away before its hello", p.addr); break;
      }
    }
    rv.pending = std::move(still_pending);
  }

  // The admitted ranks watched in this poll (results from fds[k], in order): one that speaks or
  // disconnects before the welcome is gone, and its RANK free again.
  void watch_admitted(MasterRendezvous& rv, const std::vector<int>& admitted, const std::vector<pollfd>& fds,
                      size_t& k) {
    for (int r : admitted) {
      auto& p = peers_[static_cast<size_t>(r)];
      if (!fds[k++].revents) continue;
      // An admitted rank must stay silent until the welcome: anything else means it is gone.
      const auto st = p.reader.pump(p.sock.fd());
      if (st == FrameReader::State::need_more) continue;
      log::warn("TCP rendezvous: {} {} before the rendezvous completed; its RANK is free again", who(r),
                st == FrameReader::State::frame ? "sent an unexpected frame" : "disconnected");
      p = Peer{};
      --rv.connected;
    }
  }

  // Every connection waiting on the listener, as a pending peer.
  void accept_new(MasterRendezvous& rv) {
    for (;;) {
      int err = 0;
      Socket s = tcp::accept_one(rv.listener.fd(), &err);
      if (err)
        fail_master<CommError>(fmt::format("rank 0 cannot accept more rendezvous connections on {} after {} of {} "
                                           "ranks: {} (raise the open-file limit, ulimit -n)",
                                           rv.bound, rv.connected, env_.world_size, std::strerror(err)));
      if (!s.valid()) break;
      Peer p;
      p.reader = FrameReader(tcp::kMaxHelloPayload);  // a stranger's frame is read only this far
      p.addr = tcp::peer_address(s.fd());
      p.sock = std::move(s);
      rv.pending.push_back(std::move(p));
    }
  }

  // Every rank is connected: refuse the connections still half-open and send each rank the
  // welcome (every rank's host name).
  void complete_rendezvous(MasterRendezvous& rv) {
    // Connections still half-open sent no complete hello (a port scanner, a process that hangs):
    // they are not ranks of this job. (A duplicate RANK is refused as one when its hello arrives.)
    for (auto& p : rv.pending)
      reject(rv, p, fmt::format("the rendezvous completed with all {} ranks while this connection had sent no "
                                "complete hello; it is not a rank of this job",
                                env_.world_size));

    const std::string welcome = tcp::encode_strings(hosts_);
    const auto d = Clock::now() + timeout_;
    for (int r = 1; r < env_.world_size; ++r) {
      auto& p = peers_[static_cast<size_t>(r)];
      if (auto res = tcp::send_frame(p.sock.fd(), FrameType::welcome, 0, welcome, d); res.status != IoStatus::ok)
        fail_master<CommError>(fmt::format("sending the rendezvous welcome to {} failed: {}", who(r), tcp::describe(res)));
    }
    log::info("TCP rendezvous: {} ranks connected to {} in {}", env_.world_size, rv.bound,
              tcp::format_duration(Clock::now() - rv.start));
  }

  void rendezvous_master() {
    MasterRendezvous rv;
    rv.start = Clock::now();
    rv.deadline = rv.start + timeout_;
    rv.listener = tcp::listen_on(env_.master_addr, env_.master_port, env_.port_desc, &rv.bound);
    peers_.resize(static_cast<size_t>(env_.world_size));
    while (rv.connected < env_.world_size) {
      const int ms = tcp::poll_ms(rv.deadline);
      if (ms == 0) fail_rendezvous_timeout(rv);
      // Watch the listener, the half-open connections, and the admitted ranks (so a rank that
      // dies before the rendezvous completes frees its slot for a restarted process).
      std::vector<pollfd> fds;
      fds.push_back({rv.listener.fd(), POLLIN, 0});
      for (auto& p : rv.pending) fds.push_back({p.sock.fd(), POLLIN, 0});
      std::vector<int> admitted;  // ranks watched in this poll, in fds order after the pending ones
      for (int r = 1; r < env_.world_size; ++r)
        if (peers_[static_cast<size_t>(r)].sock.valid()) {
          admitted.push_back(r);
          fds.push_back({peers_[static_cast<size_t>(r)].sock.fd(), POLLIN, 0});
        }
      if (::poll(fds.data(), fds.size(), ms) <= 0) continue;  // timeout or EINTR: loop re-checks

      size_t k = 1;
      pump_pending(rv, fds, k);
      watch_admitted(rv, admitted, fds, k);
      if (fds[0].revents & POLLIN) accept_new(rv);
    }
    rv.listener.close();
    complete_rendezvous(rv);
  }

  // ---- rendezvous, worker side ----

  void rendezvous_worker() {
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    auto backoff = 50ms;
    int attempts = 0;
    std::string why;
    for (;;) {
      ++attempts;
      // One attempt never eats the whole budget when SYNs vanish into a firewall: the master
      // may come up on a route that answers later.
      const auto attempt_deadline = std::min(deadline, Clock::now() + 5s);
      master_sock_ = tcp::connect_once(env_.master_addr, env_.master_port, attempt_deadline, &why);
      if (master_sock_.valid()) break;
      const auto now = Clock::now();
      if (now >= deadline)
        TRIAX_THROW(CommError,
                    "rank {}: master unreachable at {} (MASTER_ADDR={}, {}): tried for {} ({} attempts, timeout "
                    "{}); last error: {}. Is rank 0 running, and can this host reach MASTER_ADDR?",
                    env_.rank, master_, env_.master_addr, env_.port_desc, tcp::format_duration(now - start), attempts, tcp::format_duration(timeout_), why);
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    log::debug("TCP rendezvous: rank {} connected to {} after {} attempts", env_.rank, master_, attempts);

    // The master may still wait for other ranks: the worker allows it a full timeout from now.
    const auto connected_at = Clock::now();
    const tcp::Hello hello{env_.rank, env_.world_size, env_.job, hosts_[static_cast<size_t>(env_.rank)]};
    if (auto r = tcp::send_frame(master_sock_.fd(), FrameType::hello, 0, tcp::encode_hello(hello), connected_at + timeout_);
        r.status != IoStatus::ok)
      fail_worker<CommError>(fmt::format("sending the rendezvous hello to rank 0 at {} failed: {}", master_, tcp::describe(r)));

    const auto st = tcp::read_frame(master_sock_.fd(), master_reader_, connected_at + timeout_ + reply_grace());
    if (st == FrameReader::State::need_more)
      fail_worker<TimeoutError>(fmt::format(
          "connected to rank 0 at {} but got no rendezvous reply within {} (are all WORLD_SIZE={} processes started? "
          "is {} used by another service?)",
          master_, tcp::format_duration(Clock::now() - connected_at), env_.world_size, env_.port_desc));
    if (st != FrameReader::State::frame)
      fail_worker<CommError>(fmt::format("rank 0 at {} closed the connection during the rendezvous: {}", master_,
                                         read_failure(st)));
    const auto h = master_reader_.header();
    std::string payload = master_reader_.take_payload();
    if (h.type == static_cast<uint16_t>(FrameType::reject))
      fail_worker<ConfigError>(fmt::format("the rendezvous master at {} refused this process: {}", master_, payload));
    if (h.type == static_cast<uint16_t>(FrameType::abort))
      fail_worker<CommError>(fmt::format("the rendezvous failed: {}", payload));
    if (h.version != tcp::kVersion || h.type != static_cast<uint16_t>(FrameType::welcome))
      fail_worker<CommError>(fmt::format("expected a welcome frame (version {}) from rank 0 at {}, got '{}' version {}",
                                         tcp::kVersion, master_, tcp::frame_type_name(h.type), h.version));
    auto hosts = tcp::decode_strings(payload);
    if (hosts.size() != hosts_.size())
      fail_worker<CommError>(fmt::format("rank 0 at {} sent {} host names for WORLD_SIZE={}", master_, hosts.size(),
                                         env_.world_size));
    hosts_ = std::move(hosts);
  }

  std::string read_failure(FrameReader::State st) {
    switch (st) {
      case FrameReader::State::closed: return "connection closed by peer";
      case FrameReader::State::error: return std::strerror(master_reader_.error());
      case FrameReader::State::bad_magic: return "it sent bytes that are not a triax frame";
      case FrameReader::State::too_large:
        return fmt::format("it announced a {}-byte frame (limit {})", master_reader_.header().length, tcp::kMaxPayload);
      default: return "?";
    }
  }

  // ---- all_gather ----

  std::vector<std::string> gather_master(std::string_view mine) {
    const int w = env_.world_size;
    std::vector<std::string> out(static_cast<size_t>(w));
    out[0] = std::string(mine);
    std::vector<int> waiting;
    for (int r = 1; r < w; ++r) waiting.push_back(r);
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    while (!waiting.empty()) {
      const int ms = tcp::poll_ms(deadline);
      if (ms == 0)
        fail_master<TimeoutError>(fmt::format(
            "bootstrap all_gather round {}: ranks [{}] sent nothing within {} (they exited, hang, or call "
            "all_gather fewer times than rank 0)",
            round_, fmt::join(waiting, ","), tcp::format_duration(Clock::now() - start)));
      std::vector<pollfd> fds;
      for (int r : waiting) fds.push_back({peers_[static_cast<size_t>(r)].sock.fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), ms) <= 0) continue;
      std::vector<int> next;
      for (size_t i = 0; i < waiting.size(); ++i) {
        const int r = waiting[i];
        if (!fds[i].revents) {
          next.push_back(r);
          continue;
        }
        auto& p = peers_[static_cast<size_t>(r)];
        const auto st = p.reader.pump(p.sock.fd());
        if (st == FrameReader::State::need_more) {
          next.push_back(r);
          continue;
        }
        if (st == FrameReader::State::closed || st == FrameReader::State::error)
          fail_master<CommError>(fmt::format("{} closed its connection during bootstrap all_gather round {} ({}): "
                                             "the process exited or failed",
                                             who(r), round_,
                                             st == FrameReader::State::error ? std::strerror(p.reader.error()) : "end of stream"));
        if (st != FrameReader::State::frame)
          fail_master<CommError>(fmt::format("{} sent a corrupt frame in bootstrap all_gather round {}", who(r), round_));
        const auto h = p.reader.header();
        std::string payload = p.reader.take_payload();
        if (h.type != static_cast<uint16_t>(FrameType::contribution) || h.round != round_)
          fail_master<CommError>(fmt::format("{} sent a '{}' frame for round {} while rank 0 is in bootstrap "
                                             "all_gather round {}: the ranks call all_gather a different number of "
                                             "times",
                                             who(r), tcp::frame_type_name(h.type), h.round, round_));
        out[static_cast<size_t>(r)] = std::move(payload);
      }
      waiting = std::move(next);
    }
    const std::string result = tcp::encode_strings(out);
    if (result.size() > tcp::kMaxPayload)
      fail_master<CommError>(fmt::format("bootstrap all_gather round {} gathered {} bytes, over the {}-byte frame limit "
                                         "of the TCP rendezvous (it carries start-up data only)",
                                         round_, result.size(), tcp::kMaxPayload));
    const auto d = Clock::now() + timeout_;
    for (int r = 1; r < w; ++r) {
      auto& p = peers_[static_cast<size_t>(r)];
      if (auto res = tcp::send_frame(p.sock.fd(), FrameType::result, round_, result, d); res.status != IoStatus::ok)
        fail_master<CommError>(fmt::format("sending bootstrap all_gather round {} to {} failed: {}", round_, who(r),
                                           tcp::describe(res)));
    }
    return out;
  }

  std::vector<std::string> gather_worker(std::string_view mine) {
    if (mine.size() > tcp::kMaxPayload)
      TRIAX_THROW(ConfigError, "rank {}: bootstrap all_gather of {} bytes exceeds the TCP rendezvous limit of {} bytes",
                  env_.rank, mine.size(), tcp::kMaxPayload);
    const int fd = master_sock_.fd();
    const auto start = Clock::now();
    if (auto r = tcp::send_frame(fd, FrameType::contribution, round_, mine, start + timeout_); r.status != IoStatus::ok) {
      // The master may have said why before it closed.
      std::string reason = pending_abort();
      fail_worker<CommError>(fmt::format("sending bootstrap all_gather round {} to rank 0 (master at {}) failed: {}{}",
                                         round_, master_, tcp::describe(r),
                                         reason.empty() ? std::string() : "; " + reason));
    }
    const auto st = tcp::read_frame(fd, master_reader_, start + timeout_ + reply_grace());
    if (st == FrameReader::State::need_more)
      fail_worker<TimeoutError>(fmt::format("no bootstrap all_gather round {} result from rank 0 (master at {}) within "
                                            "{}: some rank did not contribute, or rank 0 hangs",
                                            round_, master_, tcp::format_duration(Clock::now() - start)));
    if (st != FrameReader::State::frame)
      fail_worker<CommError>(fmt::format("lost the connection to rank 0 (master at {}) during bootstrap all_gather "
                                         "round {}: {} (rank 0 exited or failed)",
                                         master_, round_, read_failure(st)));
    const auto h = master_reader_.header();
    std::string payload = master_reader_.take_payload();
    if (h.type == static_cast<uint16_t>(FrameType::abort))
      fail_worker<CommError>(fmt::format("bootstrap all_gather round {} aborted by {}", round_, payload));
    if (h.type != static_cast<uint16_t>(FrameType::result) || h.round != round_)
      fail_worker<CommError>(fmt::format("expected the result of bootstrap all_gather round {} from rank 0 at {}, got "
                                         "a '{}' frame for round {}",
                                         round_, master_, tcp::frame_type_name(h.type), h.round));
    auto all = tcp::decode_strings(payload);
    if (all.size() != static_cast<size_t>(env_.world_size))
      fail_worker<CommError>(fmt::format("rank 0 at {} returned {} contributions for WORLD_SIZE={} in round {}", master_,
                                         all.size(), env_.world_size, round_));
    return all;
  }

  // Reads an abort frame the master may have left before closing, without waiting.
  std::string pending_abort() {
    const auto st = tcp::read_frame(master_sock_.fd(), master_reader_, Clock::now());
    if (st != FrameReader::State::frame) return {};
    const auto h = master_reader_.header();
    std::string payload = master_reader_.take_payload();
    return h.type == static_cast<uint16_t>(FrameType::abort) ? payload : std::string();
  }

  LaunchEnv env_;
  std::chrono::milliseconds timeout_;
  std::string master_;  // "address:port" of rank 0, for messages
  std::vector<std::string> hosts_;  // host name of every rank, in rank order
  std::shared_ptr<Communicator> world_;  // Gloo, built on first use
  int local_rank_ = 0;
  uint64_t round_ = 0;
  std::string broken_;  // why the bootstrap failed; non-empty makes every later call throw
  // Master: one connection per rank (index 0 unused). Worker: the connection to rank 0.
  std::vector<Peer> peers_;
  Socket master_sock_;
  FrameReader master_reader_;
  // Peer watch (watch_peers): all_gather and the watch thread take io_mu_ to touch connections.
  std::mutex io_mu_;
  bool watching_ = false;
  std::atomic<bool> watch_stop_{false};
  std::thread watcher_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_env_bootstrap(const BootstrapOptions& opts) {
  if (opts.timeout <= std::chrono::milliseconds::zero())
    TRIAX_THROW(ConfigError, "BootstrapOptions.timeout must be positive, got {} ms", opts.timeout.count());
  return std::make_unique<TcpBootstrap>(read_launch_env(), opts.timeout);
}

std::unique_ptr<Bootstrap> make_tcp_bootstrap(TcpLaunch launch, const BootstrapOptions& opts) {
  if (opts.timeout <= std::chrono::milliseconds::zero())
    TRIAX_THROW(ConfigError, "BootstrapOptions.timeout must be positive, got {} ms", opts.timeout.count());
  return std::make_unique<TcpBootstrap>(std::move(launch), opts.timeout);
}

}  // namespace triax
