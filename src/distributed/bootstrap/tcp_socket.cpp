// POSIX sockets for the TCP rendezvous: every wait goes through poll() with a deadline.
#include "tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "triax/core/error.h"

namespace triax::tcp {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

void set_nodelay(int fd) {
  // Frames are small and strictly request/response: Nagle would only add latency.
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string sockaddr_text(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return endpoint(host, port);
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

// Connecting to a port in the ephemeral range on loopback while nothing listens can end in a
// TCP "simultaneous open" with itself; such a socket must count as refused, not as the master.
bool is_self_connected(int fd) {
  sockaddr_storage me{}, peer{};
  socklen_t a = sizeof(me), b = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &a) != 0) return false;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0) return false;
  return same_address(me, peer);
}

}  // namespace

int poll_ms(Deadline d) {
  const auto left = d - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > 1'000'000'000 ? 1'000'000'000 : static_cast<int>(ms);
}

std::string format_duration(std::chrono::nanoseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  if (s < 1.0) return fmt::format("{:.0f} ms", s * 1e3);
  return fmt::format("{:.1f} s", s);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ < 0) return;
  // shutdown first: the peer sees an orderly end of stream after everything we queued.
  ::shutdown(fd_, SHUT_RDWR);
  ::close(fd_);
  fd_ = -1;
}

std::string describe(const IoResult& r) {
  switch (r.status) {
    case IoStatus::ok: return "ok";
    case IoStatus::timeout: return "timed out";
    case IoStatus::closed: return "connection closed by peer";
    case IoStatus::error: return errno_text(r.err);
  }
  return "?";
}

IoResult send_all(int fd, std::string_view data, Deadline d) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      if (errno == EPIPE || errno == ECONNRESET) return {IoStatus::closed, errno};
      return {IoStatus::error, errno};
    }
    pollfd p{fd, POLLOUT, 0};
    const int ms = poll_ms(d);
    if (ms == 0) return {IoStatus::timeout, 0};
    const int rc = ::poll(&p, 1, ms);
    if (rc < 0 && errno != EINTR) return {IoStatus::error, errno};
    // POLLERR/POLLHUP: the next send() reports the error.
  }
  return {};
}

IoResult send_frame(int fd, FrameType type, uint64_t round, std::string_view payload, Deadline d) {
  const std::string head = encode_header({kMagic, kVersion, static_cast<uint16_t>(type), round, payload.size()});
  if (auto r = send_all(fd, head, d); r.status != IoStatus::ok) return r;
  return send_all(fd, payload, d);
}

FrameReader::State FrameReader::pump(int fd) {
  for (;;) {
    char* dst;
    size_t want;
    if (!have_header_) {
      dst = reinterpret_cast<char*>(head_.data()) + head_got_;
      want = kHeaderBytes - head_got_;
    } else {
      if (payload_got_ == payload_.size()) return State::frame;
      dst = payload_.data() + payload_got_;
      want = payload_.size() - payload_got_;
    }
    const ssize_t n = ::recv(fd, dst, want, 0);
    if (n == 0) return State::closed;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return State::need_more;
      err_ = errno;
      return errno == ECONNRESET ? State::closed : State::error;
    }
    if (!have_header_) {
      head_got_ += static_cast<size_t>(n);
      if (head_got_ < kHeaderBytes) continue;
      header_ = decode_header(head_);
      if (header_.magic != kMagic) return State::bad_magic;
      if (header_.length > limit_) return State::too_large;
      have_header_ = true;
      payload_.assign(static_cast<size_t>(header_.length), '\0');
      payload_got_ = 0;
    } else {
      payload_got_ += static_cast<size_t>(n);
    }
  }
}

std::string FrameReader::take_payload() {
  std::string out = std::move(payload_);
  payload_.clear();
  payload_got_ = 0;
  head_got_ = 0;
  have_header_ = false;
  return out;
}

FrameReader::State read_frame(int fd, FrameReader& reader, Deadline d) {
  for (;;) {
    const auto st = reader.pump(fd);
    if (st != FrameReader::State::need_more) return st;
    const int ms = poll_ms(d);
    if (ms == 0) return st;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR) return FrameReader::State::error;
  }
}

std::string endpoint(std::string_view host, int port) {
  if (host.find(':') != std::string_view::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  return sockaddr_text(reinterpret_cast<const sockaddr*>(&ss));
}

// The first non-loopback address `name` resolves to, as a sockaddr for `port`; its length, or
// nullopt when there is none.
std::optional<socklen_t> non_loopback_address(const std::string& name, int port, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(name.c_str(), service.c_str(), &hints, &res) != 0) return std::nullopt;
  std::optional<socklen_t> len;
  for (addrinfo* ai = res; ai && !len; ai = ai->ai_next) {
    bool loopback = true;
    if (ai->ai_family == AF_INET)
      loopback = (ntohl(reinterpret_cast<const sockaddr_in*>(ai->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (ai->ai_family == AF_INET6)
      loopback = IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(ai->ai_addr)->sin6_addr);
    if (loopback || ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    std::memcpy(out, ai->ai_addr, ai->ai_addrlen);
    len = static_cast<socklen_t>(ai->ai_addrlen);
  }
  ::freeaddrinfo(res);
  return len;
}

Socket listen_on(const std::string& master_addr, int port, std::string_view port_desc, std::string* bound) {
  sockaddr_storage ss{};
  socklen_t len = 0;
  bool v6_wildcard = false;
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  in_addr a4{};
  in6_addr a6{};
  if (master_addr == "localhost" || (inet_pton(AF_INET, master_addr.c_str(), &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127)) {
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    in->sin_addr = master_addr == "localhost" ? in_addr{htonl(INADDR_LOOPBACK)} : a4;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, master_addr.c_str(), &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6)) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    in6->sin6_addr = a6;
    len = sizeof(sockaddr_in6);
  } else if (inet_pton(AF_INET, master_addr.c_str(), &a4) == 1 && a4.s_addr != htonl(INADDR_ANY)) {
    // An address of this host: listen there only, not on every interface.
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    in->sin_addr = a4;
    len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, master_addr.c_str(), &a6) == 1 && !IN6_IS_ADDR_UNSPECIFIED(&a6)) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    in6->sin6_addr = a6;
    len = sizeof(sockaddr_in6);
  } else if (const auto named = non_loopback_address(master_addr, port, &ss)) {
    // A host name: the first non-loopback address it resolves to here.
    len = *named;
  } else {
    // A wildcard address, or a name that resolves to loopback only on this host (Debian maps its
    // own name to 127.0.1.1 while other hosts resolve it to a real address): every interface,
    // IPv6 and IPv4 together where the kernel allows dual-stack sockets.
    ss = {};
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    in6->sin6_addr = in6addr_any;
    len = sizeof(sockaddr_in6);
    v6_wildcard = true;
  }

  int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0 && v6_wildcard && (errno == EAFNOSUPPORT || errno == EPROTONOSUPPORT)) {
    // No IPv6 on this host: the IPv4 wildcard.
    ss = {};
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof(sockaddr_in);
    v6_wildcard = false;
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }
  *bound = sockaddr_text(reinterpret_cast<const sockaddr*>(&ss));
  if (fd < 0)
    TRIAX_THROW(CommError, "rank 0 cannot create the rendezvous socket for {}: {}", *bound, errno_text(errno));
  Socket sock(fd);
  int one = 1, zero = 0;
  // A restarted job must be able to reuse its port while the previous run's connections sit
  // in TIME_WAIT.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (v6_wildcard) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    const int err = errno;
    std::string hint;
    if (err == EADDRINUSE)
      hint = ": another process (a previous run, another job, a launcher's own store) holds this port; choose a free "
             "MASTER_PORT, or set TRIAX_MASTER_PORT to give triax a port of its own";
    else if (err == EACCES)
      hint = ": ports below 1024 need privileges; choose a port >= 1024";
    else if (err == EADDRNOTAVAIL)
      hint = ": MASTER_ADDR is not an address of this host; rank 0 must run on the host MASTER_ADDR names";
    TRIAX_THROW(CommError, "rank 0 cannot listen on {} for the TCP rendezvous (MASTER_ADDR={}, {}): {}{}", *bound,
                master_addr, port_desc, errno_text(err), hint);
  }
  if (::listen(fd, SOMAXCONN) != 0)
    TRIAX_THROW(CommError, "rank 0 cannot listen on {} ({}): {}", *bound, port_desc, errno_text(errno));
  return sock;
}

Socket accept_one(int listen_fd, int* err) {
  *err = 0;
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return Socket(fd);
    }
    if (errno == EINTR) continue;
    // EAGAIN: nothing pending. ECONNABORTED and friends concern one connection that is gone
    // already; only running out of descriptors is the caller's problem.
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) *err = errno;
    return Socket();
  }
}

Socket connect_once(const std::string& host, int port, Deadline d, std::string* why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // No AI_ADDRCONFIG: it hides 127.0.0.1 on hosts whose only interface is loopback.
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    *why = fmt::format("cannot resolve '{}': {}", host, rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return Socket();
  }
  std::string errors;
  Socket out;
  for (addrinfo* ai = res; ai && !out.valid(); ai = ai->ai_next) {
    const std::string target = sockaddr_text(ai->ai_addr);
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    int err = 0;
    if (!s.valid()) {
      err = errno;
    } else if (::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS || err == EINTR) {
        pollfd p{s.fd(), POLLOUT, 0};
        int rc;
        do {
          rc = ::poll(&p, 1, poll_ms(d));
        } while (rc < 0 && errno == EINTR);
        if (rc == 0) {
          err = ETIMEDOUT;
        } else {
          socklen_t l = sizeof(err);
          if (getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &l) != 0) err = errno;
        }
      }
    }
    if (err == 0 && is_self_connected(s.fd())) err = ECONNREFUSED;
    if (err == 0) {
      set_nodelay(s.fd());
      out = std::move(s);
    } else {
      errors += fmt::format("{}{}: {}", errors.empty() ? "" : "; ", target, errno_text(err));
    }
  }
  ::freeaddrinfo(res);
  if (!out.valid()) *why = errors.empty() ? fmt::format("'{}' resolved to no address", host) : errors;
  return out;
}

}  // namespace triax::tcp
