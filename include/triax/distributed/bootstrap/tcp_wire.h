// Wire format of the torchrun-style TCP rendezvous (docs/BOOTSTRAP.md): every message is one
// frame, a fixed 24-byte big-endian header (magic, version, type, round, payload length) and the
// payload. Public so that tests can speak the protocol as a misbehaving or foreign peer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace triax::tcp {

inline constexpr uint32_t kMagic = 0x54524158;  // "TRAX": anything else is not a triax peer
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 24;
// Frames larger than this are refused on both ends: a garbage header must not make us allocate
// gigabytes, and the rendezvous carries start-up data, not tensors.
inline constexpr uint64_t kMaxPayload = uint64_t{1} << 30;
// Bounds of the hello's text fields (a host name is at most 255 bytes in DNS; a job token is an
// id, not a document) and so of the whole hello frame the master reads from a stranger.
inline constexpr size_t kMaxJobBytes = 256;
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr uint64_t kMaxHelloPayload = 4 + 4 + 8 + kMaxJobBytes + 8 + kMaxHostBytes;

enum class FrameType : uint16_t {
  hello = 1,         // worker -> master: rank, world size, job id, host name
  welcome = 2,       // master -> worker: every rank's host name, in rank order
  reject = 3,        // master -> worker: why this hello was refused (text); the connection closes
  contribution = 4,  // worker -> master: this rank's bytes for all_gather round `round`
  result = 5,        // master -> worker: every rank's bytes for round `round`, in rank order
  abort = 6,         // master -> worker: the job failed (text); the connection closes
  bye = 7,           // either way, when watching peers: this process leaves normally; the connection closes
};

std::string_view frame_type_name(uint16_t type);

struct FrameHeader {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  uint16_t type = 0;
  uint64_t round = 0;   // all_gather round (1, 2, ...); 0 during the rendezvous
  uint64_t length = 0;  // payload bytes that follow the header
};

// Header bytes of a frame whose payload (of header.length bytes) follows separately.
std::string encode_header(const FrameHeader& h);
// Decodes exactly kHeaderBytes bytes; checks nothing (the reader decides what to refuse).
FrameHeader decode_header(std::span<const std::byte, kHeaderBytes> bytes);
// Header and payload in one buffer (small frames, tests).
std::string encode_frame(FrameType type, uint64_t round, std::string_view payload);

struct Hello {
  int rank = 0;
  int world_size = 0;
  std::string job;   // the job token (TRIAX_JOB_ID, or derived from the launcher); must match the master's
  std::string host;  // host_name() of the sender
};
std::string encode_hello(const Hello& h);
// Throws CommError when the payload is truncated or has trailing bytes.
Hello decode_hello(std::string_view payload);

// A list of byte strings: u32 count, then per item u64 length and the bytes. Used for the
// welcome (host names) and every all_gather result.
std::string encode_strings(std::span<const std::string> items);
std::vector<std::string> decode_strings(std::string_view payload);

}  // namespace triax::tcp
