// safetensors: validating reader over a memory map, atomic writer (see safetensors.h).
#include "triax/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "triax/core/error.h"
#include "triax/io/atomic_file.h"

namespace triax::io {
namespace {

static_assert(std::endian::native == std::endian::little, "the file formats are little-endian");

using json = nlohmann::json;

// A JSON value that is a non-negative integer (not a float, not a bool).
bool as_u64(const json& j, uint64_t& out) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// A JSON value for an error message, cut short so a hostile header cannot make a huge message.
std::string brief(const json& j) {
  std::string s = j.dump();
  if (s.size() > 64) s = s.substr(0, 60) + " ...";
  return s;
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t& out) { return __builtin_mul_overflow(a, b, &out); }

TensorInfo parse_entry(const std::string& path, const std::string& name, const json& e, uint64_t data_start,
                       uint64_t data_size) {
  if (!e.is_object()) TRIAX_THROW(IoError, "{}: header entry for tensor '{}' is not a JSON object", path, name);
  TensorInfo t;
  t.name = name;

  const auto dt = e.find("dtype");
  if (dt == e.end()) TRIAX_THROW(IoError, "{}: tensor '{}' has no \"dtype\" field", path, name);
  if (!dt->is_string()) TRIAX_THROW(IoError, "{}: tensor '{}': \"dtype\" is not a string", path, name);
  const auto parsed = parse_file_dtype(dt->get_ref<const std::string&>());
  if (!parsed) {
    TRIAX_THROW(IoError, "{}: tensor '{}' has unknown dtype '{}'", path, name, dt->get_ref<const std::string&>());
  }
  t.dtype = *parsed;

  const auto sh = e.find("shape");
  if (sh == e.end()) TRIAX_THROW(IoError, "{}: tensor '{}' has no \"shape\" field", path, name);
  if (!sh->is_array()) TRIAX_THROW(IoError, "{}: tensor '{}': \"shape\" is not an array", path, name);
  uint64_t numel = 1;
  for (const json& d : *sh) {
    uint64_t v = 0;
    if (!as_u64(d, v) || v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      TRIAX_THROW(IoError, "{}: tensor '{}': shape {} has an entry that is not a non-negative integer", path, name,
                  brief(*sh));
    }
    if (mul_overflows(numel, v, numel)) {
      TRIAX_THROW(IoError, "{}: tensor '{}': shape {} has an absurd element count (overflows 64 bits)", path, name,
                  brief(*sh));
    }
    t.shape.push_back(static_cast<int64_t>(v));
  }
  uint64_t nbytes = 0;
  if (mul_overflows(numel, file_dtype_size(t.dtype), nbytes) ||
      numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    TRIAX_THROW(IoError, "{}: tensor '{}': shape {} has an absurd byte size", path, name, brief(*sh));
  }
  t.nbytes = nbytes;

  const auto off = e.find("data_offsets");
  if (off == e.end()) TRIAX_THROW(IoError, "{}: tensor '{}' has no \"data_offsets\" field", path, name);
  uint64_t begin = 0, end = 0;
  if (!off->is_array() || off->size() != 2 || !as_u64((*off)[0], begin) || !as_u64((*off)[1], end)) {
    TRIAX_THROW(IoError, "{}: tensor '{}': \"data_offsets\" {} is not a pair of non-negative integers [begin, end]",
                path, name, brief(*off));
  }
  if (begin > end) {
    TRIAX_THROW(IoError, "{}: tensor '{}': data_offsets [{}, {}] end before they begin", path, name, begin, end);
  }
  if (end > data_size) {
    TRIAX_THROW(IoError, "{}: tensor '{}': data_offsets [{}, {}] run past the end of the {}-byte data section", path,
                name, begin, end, data_size);
  }
  if (end - begin != nbytes) {
    TRIAX_THROW(IoError,
                "{}: tensor '{}': data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {} bytes", path, name,
                begin, end, end - begin, shape_string(t.shape), file_dtype_name(t.dtype), nbytes);
  }
  t.offset = data_start + begin;
  return t;
}

}  // namespace

SafetensorsReader::SafetensorsReader(std::string path) : TensorFile(MappedFile(std::move(path))) {
  const std::string& p = this->path();
  const auto bytes = file().bytes();
  if (bytes.size() < 8) {
    TRIAX_THROW(IoError, "{}: file is {} bytes, shorter than the 8-byte safetensors header length", p, bytes.size());
  }
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kSafetensorsMaxHeader) {
    TRIAX_THROW(IoError, "{}: absurd header length {} (limit {} bytes): corrupt or not a safetensors file", p, n,
                kSafetensorsMaxHeader);
  }
  if (n > bytes.size() - 8) {
    TRIAX_THROW(IoError, "{}: header length {} exceeds the {} bytes that follow it (file size {}): truncated or corrupt",
                p, n, bytes.size() - 8, bytes.size());
  }
  const char* text = reinterpret_cast<const char*>(bytes.data() + 8);
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = bytes.size() - data_start;

  // Duplicate top-level names would make a tensor ambiguous; nlohmann would silently keep one.
  std::set<std::string> seen;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second) TRIAX_THROW(IoError, "{}: header names tensor '{}' twice", p, k);
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    TRIAX_THROW(IoError, "{}: header ({} bytes) is not valid JSON: {}", p, n, e.what());
  }
  if (!header.is_object()) TRIAX_THROW(IoError, "{}: header is not a JSON object", p);

  std::vector<TensorInfo> tensors;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) TRIAX_THROW(IoError, "{}: \"__metadata__\" is not a JSON object", p);
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          TRIAX_THROW(IoError, "{}: \"__metadata__\" value of '{}' is not a string", p, m.key());
        }
        metadata_.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    tensors.push_back(parse_entry(p, it.key(), *it, data_start, data_size));
  }

  // The data section must be covered exactly once: no overlap (two tensors aliasing bytes), no
  // holes (bytes no entry accounts for), nothing after the last tensor.
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  uint64_t pos = data_start;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.offset < pos) {
      TRIAX_THROW(IoError, "{}: data of tensors '{}' [{}, {}) and '{}' [{}, {}) overlap", p, prev->name,
                  prev->offset - data_start, prev->offset - data_start + prev->nbytes, t.name, t.offset - data_start,
                  t.offset - data_start + t.nbytes);
    }
    if (t.offset > pos) {
      TRIAX_THROW(IoError, "{}: {} bytes of the data section before tensor '{}' (at {}) belong to no tensor", p,
                  t.offset - pos, t.name, t.offset - data_start);
    }
    pos = t.offset + t.nbytes;
    prev = &t;
  }
  if (pos != bytes.size()) {
    TRIAX_THROW(IoError, "{}: {} bytes after the last tensor belong to no tensor (data section {} bytes, used {})", p,
                bytes.size() - pos, data_size, pos - data_start);
  }
  set_tensors(std::move(tensors));
}

void SafetensorsWriter::add(std::string name, Shape shape, std::vector<float> data, FileDType stored) {
  require(!name.empty(), "safetensors: a tensor name must not be empty");
  require(name != "__metadata__", "safetensors: '__metadata__' is reserved and cannot name a tensor");
  for (const Entry& e : entries_) require(e.name != name, "safetensors: tensor '{}' added twice", name);
  require(stored == FileDType::f32 || stored == FileDType::bf16 || stored == FileDType::f16 ||
              stored == FileDType::f64,
          "safetensors: tensor '{}': floats cannot be stored as {}", name, file_dtype_name(stored));
  uint64_t numel = 1;
  for (int64_t d : shape) {
    require(d >= 0, "safetensors: tensor '{}' has a negative dimension in {}", name, shape_string(shape));
    numel *= static_cast<uint64_t>(d);
  }
  require(numel == data.size(), "safetensors: tensor '{}' of shape {} needs {} values, got {}", name,
          shape_string(shape), numel, data.size());
  entries_.push_back({std::move(name), std::move(shape), std::move(data), stored});
}

void SafetensorsWriter::add(std::string name, Shape shape, std::span<const float> data, FileDType stored) {
  add(std::move(name), std::move(shape), std::vector<float>(data.begin(), data.end()), stored);
}

void SafetensorsWriter::add_metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

std::string SafetensorsWriter::header_json() const {
  // ordered: metadata first, then tensors in data order, which keeps the header readable.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  uint64_t off = 0;
  for (const Entry& e : entries_) {
    const uint64_t nb = e.data.size() * file_dtype_size(e.stored);
    h[e.name] = {{"dtype", file_dtype_name(e.stored)}, {"shape", e.shape}, {"data_offsets", {off, off + nb}}};
    off += nb;
  }
  return h.dump();
}

void SafetensorsWriter::write(const std::string& path) const {
  std::string header = header_json();
  header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = header.size();
  AtomicFile out(path);
  std::byte len[8];
  std::memcpy(len, &n, 8);
  out.write(len);
  out.write(std::as_bytes(std::span(header)));
  std::vector<std::byte> buf;
  for (const Entry& e : entries_) {
    if (e.stored == FileDType::f32) {
      out.write_values(std::span<const float>(e.data));
      continue;
    }
    // convert in chunks so a large tensor does not need a second full-size buffer
    constexpr size_t kChunk = size_t{1} << 20;
    const size_t es = file_dtype_size(e.stored);
    for (size_t i = 0; i < e.data.size(); i += kChunk) {
      const size_t m = std::min(kChunk, e.data.size() - i);
      buf.resize(m * es);
      convert_from_float(e.data.data() + i, m, e.stored, buf.data());
      out.write(buf);
    }
  }
  out.commit();
}

}  // namespace triax::io
