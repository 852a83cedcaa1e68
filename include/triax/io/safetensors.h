// The safetensors weight format (HuggingFace): an 8-byte little-endian header length N, N bytes
// of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the
// data. A validating mmap reader (never reads outside the file) and an atomic writer.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "triax/io/tensor_file.h"

namespace triax::io {

// Headers larger than this are rejected as corrupt (the format's own limit).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

class SafetensorsReader : public TensorFile {
 public:
  // Maps and validates the whole file: header length vs file size and kSafetensorsMaxHeader,
  // JSON syntax, every entry's fields, known dtypes, non-negative shapes, data_offsets inside the
  // data section, sized shape*dtype, not overlapping and covering it without holes, duplicate
  // names, metadata values that are strings. IoError naming the file and the problem otherwise.
  explicit SafetensorsReader(std::string path);

  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Adds a tensor stored as `stored` (f32, bf16, f16 or f64; converted with round-to-nearest-even).
  // ConfigError for an empty, reserved ("__metadata__") or duplicate name, a negative dimension,
  // or data.size() != product(shape). Tensors are written in the order added.
  void add(std::string name, Shape shape, std::vector<float> data, FileDType stored = FileDType::f32);
  void add(std::string name, Shape shape, std::span<const float> data, FileDType stored = FileDType::f32);
  void add_metadata(std::string key, std::string value);

  // Writes PATH.tmp, fsyncs it and renames it over PATH (atomic_file.h): a failure leaves an
  // existing PATH as it was. The header is padded with spaces to a multiple of 8 bytes so every
  // tensor starts 8-byte aligned in the file.
  void write(const std::string& path) const;
  // The exact header JSON (without padding) write() would produce.
  std::string header_json() const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::string name;
    Shape shape;
    std::vector<float> data;
    FileDType stored;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace triax::io
