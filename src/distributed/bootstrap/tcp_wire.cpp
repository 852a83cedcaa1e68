// Encoding and decoding of the TCP rendezvous frames (big-endian, explicit byte shifts so the
// format does not depend on the host's endianness or struct padding).
#include "triax/distributed/bootstrap/tcp_wire.h"

#include "triax/core/error.h"

namespace triax::tcp {
namespace {

void put_u16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}
void put_u32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>(v >> s));
}
void put_u64(std::string& out, uint64_t v) {
  for (int s = 56; s >= 0; s -= 8) out.push_back(static_cast<char>(v >> s));
}

// Reads big-endian integers and length-prefixed strings from a payload, refusing to read past
// its end so a truncated or hostile frame becomes an error, never an overread.
class Cursor {
 public:
  Cursor(std::string_view data, std::string_view what) : data_(data), what_(what) {}
  uint64_t uint(int bytes) {
    need(static_cast<size_t>(bytes));
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<unsigned char>(data_[pos_++]);
    return v;
  }
  std::string str() {
    const uint64_t n = uint(8);
    need(n);
    std::string s(data_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  void finish() const {
    if (pos_ != data_.size())
      TRIAX_THROW(CommError, "malformed {} frame: {} trailing bytes after {} bytes of content", what_,
                  data_.size() - pos_, pos_);
  }

 private:
  void need(uint64_t n) const {
    if (n > data_.size() - pos_)
      TRIAX_THROW(CommError, "malformed {} frame: needs {} more bytes at offset {} but has only {}", what_, n, pos_,
                  data_.size() - pos_);
  }
  std::string_view data_;
  std::string_view what_;
  size_t pos_ = 0;
};

}  // namespace

std::string_view frame_type_name(uint16_t type) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::hello: return "hello";
    case FrameType::welcome: return "welcome";
    case FrameType::reject: return "reject";
    case FrameType::contribution: return "contribution";
    case FrameType::result: return "result";
    case FrameType::abort: return "abort";
    case FrameType::bye: return "bye";
  }
  return "unknown";
}

std::string encode_header(const FrameHeader& h) {
  std::string out;
  out.reserve(kHeaderBytes);
  put_u32(out, h.magic);
  put_u16(out, h.version);
  put_u16(out, h.type);
  put_u64(out, h.round);
  put_u64(out, h.length);
  return out;
}

FrameHeader decode_header(std::span<const std::byte, kHeaderBytes> bytes) {
  Cursor c({reinterpret_cast<const char*>(bytes.data()), bytes.size()}, "header");
  FrameHeader h;
  h.magic = static_cast<uint32_t>(c.uint(4));
  h.version = static_cast<uint16_t>(c.uint(2));
  h.type = static_cast<uint16_t>(c.uint(2));
  h.round = c.uint(8);
  h.length = c.uint(8);
  return h;
}

std::string encode_frame(FrameType type, uint64_t round, std::string_view payload) {
  std::string out = encode_header({kMagic, kVersion, static_cast<uint16_t>(type), round, payload.size()});
  out.append(payload);
  return out;
}

std::string encode_hello(const Hello& h) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(h.rank));
  put_u32(out, static_cast<uint32_t>(h.world_size));
  put_u64(out, h.job.size());
  out += h.job;
  put_u64(out, h.host.size());
  out += h.host;
  return out;
}

Hello decode_hello(std::string_view payload) {
  Cursor c(payload, "hello");
  Hello h;
  // Ranks travel as u32; values past INT_MAX come out negative and fail the range check.
  h.rank = static_cast<int>(static_cast<uint32_t>(c.uint(4)));
  h.world_size = static_cast<int>(static_cast<uint32_t>(c.uint(4)));
  h.job = c.str();
  h.host = c.str();
  c.finish();
  return h;
}

std::string encode_strings(std::span<const std::string> items) {
  size_t total = 4;
  for (const auto& s : items) total += 8 + s.size();
  std::string out;
  out.reserve(total);
  put_u32(out, static_cast<uint32_t>(items.size()));
  for (const auto& s : items) {
    put_u64(out, s.size());
    out += s;
  }
  return out;
}

std::vector<std::string> decode_strings(std::string_view payload) {
  Cursor c(payload, "string list");
  const uint64_t n = c.uint(4);
  // Each item needs at least its 8-byte length: bounds the reserve by the payload size.
  if (n > payload.size() / 8) TRIAX_THROW(CommError, "malformed string list frame: {} items in {} bytes", n, payload.size());
  std::vector<std::string> out;
  out.reserve(n);
  for (uint64_t i = 0; i < n; ++i) out.push_back(c.str());
  c.finish();
  return out;
}

}  // namespace triax::tcp
