// POSIX socket plumbing for the TCP rendezvous (private to src/distributed/bootstrap): an owning fd, deadline-bound
// non-blocking I/O, an incremental frame reader, and the listen / connect halves. Nothing here
// blocks without a deadline, so a dead or silent peer becomes an error instead of a hang.
#pragma once
#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "triax/distributed/bootstrap/tcp_wire.h"

namespace triax::tcp {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Milliseconds from now to d for poll(): rounded up so we never spin on a sub-millisecond rest,
// 0 once the deadline has passed.
int poll_ms(Deadline d);
// "1.5 s" / "250 ms" for messages.
std::string format_duration(std::chrono::nanoseconds d);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Sends FIN after anything queued, then closes; data already sent still reaches the peer.
  void close();

 private:
  int fd_ = -1;
};

enum class IoStatus { ok, timeout, closed, error };
struct IoResult {
  IoStatus status = IoStatus::ok;
  int err = 0;  // errno when status == error
};
// "timed out", "connection closed by peer", or strerror(err).
std::string describe(const IoResult& r);

// Writes every byte of data to the non-blocking socket fd before d (poll for POLLOUT between
// partial writes). A peer that went away gives closed/error, never SIGPIPE.
IoResult send_all(int fd, std::string_view data, Deadline d);
// Header then payload, without copying the payload into a frame buffer.
IoResult send_frame(int fd, FrameType type, uint64_t round, std::string_view payload, Deadline d);

// Reads frames from a non-blocking socket as bytes arrive; never consumes bytes of the next
// frame, so one reader per connection survives across all_gather rounds.
class FrameReader {
 public:
  enum class State { need_more, frame, closed, error, bad_magic, too_large };
  // Frames announcing more than `limit` payload bytes are refused (too_large) before any is read.
  explicit FrameReader(uint64_t limit = kMaxPayload) : limit_(limit) {}
  void set_limit(uint64_t limit) { limit_ = limit; }
  uint64_t limit() const { return limit_; }
  // Reads what is available without blocking; `frame` once a whole frame is buffered.
  State pump(int fd);
  int error() const { return err_; }
  // Valid once the header is complete (after `frame`, `bad_magic` or `too_large`).
  const FrameHeader& header() const { return header_; }
  // Hands over the payload of the completed frame and resets for the next one.
  std::string take_payload();

 private:
  std::array<std::byte, kHeaderBytes> head_{};
  size_t head_got_ = 0;
  bool have_header_ = false;
  FrameHeader header_;
  std::string payload_;
  size_t payload_got_ = 0;
  int err_ = 0;
  uint64_t limit_ = kMaxPayload;
};

// Polls fd until reader has a whole frame or d passes. Returns the reader's final state, with
// need_more meaning "timed out".
FrameReader::State read_frame(int fd, FrameReader& reader, Deadline d);

// "127.0.0.1:29500", "[::1]:29500".
std::string endpoint(std::string_view host, int port);
// The remote address of a connected socket, for messages ("10.0.0.7:41234").
std::string peer_address(int fd);

// Rank 0's listening socket (non-blocking, SO_REUSEADDR). A loopback literal or "localhost" in
// master_addr binds loopback only (single-host jobs, tests); any other address binds every
// interface, because a name can resolve to a loopback alias on its own host (Debian maps the
// host name to 127.0.1.1) while the other hosts reach it through the network. Throws CommError
// naming the address and the port; port_desc says where the port came from ("MASTER_PORT=29500").
// *bound receives what was bound, for messages.
Socket listen_on(const std::string& master_addr, int port, std::string_view port_desc, std::string* bound);
// Accepts one pending connection (non-blocking, close-on-exec, TCP_NODELAY); invalid Socket
// when none is pending, with *err set (errno) only when the process is out of descriptors or
// memory, which would otherwise leave the listener readable forever.
Socket accept_one(int listen_fd, int* err);

// One connection attempt to host:port that gives up at d: resolves the name (IPv4 or IPv6) and
// tries each address. On failure returns an invalid Socket and puts the reason in *why.
Socket connect_once(const std::string& host, int port, Deadline d, std::string* why);

}  // namespace triax::tcp
