// What the weight-file readers (safetensors, llm.c) share: the element types a file may store,
// a tensor's entry (name, dtype, shape, byte range), and a mapped file of named tensors that
// converts whole tensors or N-d sub-blocks (TP shards, one layer of a stacked tensor) to float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "triax/io/mapped_file.h"

namespace triax::io {

using Shape = std::vector<int64_t>;

// Element types as stored in files (safetensors' set; llm.c uses f32 and bf16).
enum class FileDType : uint8_t { boolean, u8, i8, f8_e5m2, f8_e4m3, i16, u16, f16, bf16, i32, u32, f32, f64, i64, u64 };

size_t file_dtype_size(FileDType t);
// The safetensors spelling: "F32", "BF16", "I64", "BOOL", ...
std::string_view file_dtype_name(FileDType t);
std::optional<FileDType> parse_file_dtype(std::string_view name);
// f32, f64, f16 and bf16 convert to float; the others are only listed (raw() gives their bytes).
bool file_dtype_converts_to_float(FileDType t);

// "[768, 2304]"
std::string shape_string(std::span<const int64_t> shape);

struct TensorInfo {
  std::string name;
  FileDType dtype = FileDType::f32;
  Shape shape;          // empty = scalar
  uint64_t offset = 0;  // absolute byte offset of the first element in the file
  uint64_t nbytes = 0;  // numel() * file_dtype_size(dtype)
  int64_t numel() const;
};

// A half-open index range [begin, end) along one dimension.
struct SliceRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// A mapped file holding named tensors. Built by SafetensorsReader and LlmcGpt2Reader after they
// validated every entry against the file size, so every read below stays inside the mapping.
class TensorFile {
 public:
  const std::string& path() const { return file_.path(); }
  // In storage order (ascending offset).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(std::string_view name) const;
  // IoError naming the file and the tensor if absent.
  const TensorInfo& info(std::string_view name) const;
  // IoError naming the file, the tensor, its shape and the expected one unless they are equal.
  void check_shape(std::string_view name, const Shape& expected) const;

  // The whole tensor as float (row-major, as stored).
  std::vector<float> read(std::string_view name) const;
  // Same, after check_shape(name, expected).
  std::vector<float> read(std::string_view name, const Shape& expected) const;
  // Into caller memory; IoError unless out.size() == numel.
  void read_into(std::string_view name, std::span<float> out) const;

  // The sub-block ranges[0] x ranges[1] x ... (one range per dimension, row-major result of shape
  // (end-begin) per dimension). IoError for a wrong number of ranges or a range outside the shape.
  std::vector<float> read_slice(std::string_view name, const std::vector<SliceRange>& ranges) const;
  void read_slice_into(std::string_view name, const std::vector<SliceRange>& ranges, std::span<float> out) const;
  // Rows [r0, r1) of the leading dimension (any rank >= 1): shape (r1-r0, rest...).
  std::vector<float> read_rows(std::string_view name, int64_t r0, int64_t r1) const;
  // Columns [c0, c1) of a 2-D tensor: shape (rows, c1-c0).
  std::vector<float> read_cols(std::string_view name, int64_t c0, int64_t c1) const;

  // The stored bytes of a tensor, for dtypes that do not convert to float.
  std::span<const std::byte> raw(std::string_view name) const;

 protected:
  TensorFile() = default;
  explicit TensorFile(MappedFile file) : file_(std::move(file)) {}
  // Registers validated entries (the caller checked ranges against the file size).
  void set_tensors(std::vector<TensorInfo> tensors);
  const MappedFile& file() const { return file_; }

 private:
  // Validates dtype, rank and ranges of a slice; returns its element count.
  size_t check_slice(const TensorInfo& t, const std::vector<SliceRange>& ranges) const;

  MappedFile file_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

// Converts n stored elements (possibly unaligned) to float. `t` must convert to float.
void convert_to_float(const std::byte* src, FileDType t, size_t n, float* dst);
// Converts n floats to the stored form: f32, f64, f16 (round to nearest even) or bf16 (same).
void convert_from_float(const float* src, size_t n, FileDType t, std::byte* dst);

}  // namespace triax::io
