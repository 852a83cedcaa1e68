// dtype tables, float conversion and bounds-checked (sub-)tensor reads (see tensor_file.h).
#include "triax/io/tensor_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstring>

#include "triax/core/dtype.h"
#include "triax/core/error.h"

namespace triax::io {
namespace {

struct DTypeRow {
  FileDType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, 15> kDTypes{{
    {FileDType::boolean, "BOOL", 1}, {FileDType::u8, "U8", 1},        {FileDType::i8, "I8", 1},
    {FileDType::f8_e5m2, "F8_E5M2", 1}, {FileDType::f8_e4m3, "F8_E4M3", 1}, {FileDType::i16, "I16", 2},
    {FileDType::u16, "U16", 2},         {FileDType::f16, "F16", 2},         {FileDType::bf16, "BF16", 2},
    {FileDType::i32, "I32", 4},         {FileDType::u32, "U32", 4},         {FileDType::f32, "F32", 4},
    {FileDType::f64, "F64", 8},         {FileDType::i64, "I64", 8},         {FileDType::u64, "U64", 8},
}};

const DTypeRow& row(FileDType t) {
  for (const auto& r : kDTypes)
    if (r.type == t) return r;
  TRIAX_THROW(Error, "internal: unknown FileDType {}", static_cast<int>(t));
}

}  // namespace

size_t file_dtype_size(FileDType t) { return row(t).size; }
std::string_view file_dtype_name(FileDType t) { return row(t).name; }

std::optional<FileDType> parse_file_dtype(std::string_view name) {
  for (const auto& r : kDTypes)
    if (r.name == name) return r.type;
  return std::nullopt;
}

bool file_dtype_converts_to_float(FileDType t) {
  return t == FileDType::f32 || t == FileDType::f64 || t == FileDType::f16 || t == FileDType::bf16;
}

std::string shape_string(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // readers validated that this does not overflow
  return n;
}

void convert_to_float(const std::byte* src, FileDType t, size_t n, float* dst) {
  if (n == 0) return;  // dst may be the null data() of an empty vector
  switch (t) {
    case FileDType::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case FileDType::f64:
      for (size_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        dst[i] = static_cast<float>(d);
      }
      return;
    case FileDType::bf16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      return;
    case FileDType::f16:
      for (size_t i = 0; i < n; ++i) {
        triax::f16 h;
        std::memcpy(&h.bits, src + 2 * i, 2);
        dst[i] = static_cast<float>(h);
      }
      return;
    default:
      TRIAX_THROW(Error, "internal: convert_to_float called for dtype {}", file_dtype_name(t));
  }
}

void convert_from_float(const float* src, size_t n, FileDType t, std::byte* dst) {
  if (n == 0 && file_dtype_converts_to_float(t)) return;
  switch (t) {
    case FileDType::f32:
      std::memcpy(dst, src, n * 4);
      return;
    case FileDType::f64:
      for (size_t i = 0; i < n; ++i) {
        const double d = src[i];
        std::memcpy(dst + 8 * i, &d, 8);
      }
      return;
    case FileDType::bf16:
      for (size_t i = 0; i < n; ++i) {
        const triax::bf16 h(src[i]);
        std::memcpy(dst + 2 * i, &h.bits, 2);
      }
      return;
    case FileDType::f16:
      for (size_t i = 0; i < n; ++i) {
        const triax::f16 h(src[i]);
        std::memcpy(dst + 2 * i, &h.bits, 2);
      }
      return;
    default:
      TRIAX_THROW(ConfigError, "cannot store floats as dtype {}", file_dtype_name(t));
  }
}

void TensorFile::set_tensors(std::vector<TensorInfo> tensors) {
  tensors_ = std::move(tensors);
  index_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

bool TensorFile::contains(std::string_view name) const { return index_.count(std::string(name)) != 0; }

const TensorInfo& TensorFile::info(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  if (it == index_.end()) {
    TRIAX_THROW(IoError, "{}: missing tensor '{}' (the file holds {} tensors)", path(), name, tensors_.size());
  }
  return tensors_[it->second];
}

void TensorFile::check_shape(std::string_view name, const Shape& expected) const {
  const TensorInfo& t = info(name);
  if (t.shape != expected) {
    TRIAX_THROW(IoError, "{}: shape mismatch for tensor '{}': the file has {}, expected {}", path(), name,
                shape_string(t.shape), shape_string(expected));
  }
}

std::vector<float> TensorFile::read(std::string_view name) const {
  std::vector<float> out(static_cast<size_t>(info(name).numel()));
  read_into(name, out);
  return out;
}

std::vector<float> TensorFile::read(std::string_view name, const Shape& expected) const {
  check_shape(name, expected);
  return read(name);
}

void TensorFile::read_into(std::string_view name, std::span<float> out) const {
  const TensorInfo& t = info(name);
  if (!file_dtype_converts_to_float(t.dtype)) {
    TRIAX_THROW(IoError, "{}: tensor '{}' has dtype {}, which does not convert to float", path(), name,
                file_dtype_name(t.dtype));
  }
  if (out.size() != static_cast<size_t>(t.numel())) {
    TRIAX_THROW(IoError, "{}: tensor '{}' has {} elements {} but the destination holds {}", path(), name,
                t.numel(), shape_string(t.shape), out.size());
  }
  convert_to_float(file_.bytes().data() + t.offset, t.dtype, out.size(), out.data());
}

size_t TensorFile::check_slice(const TensorInfo& t, const std::vector<SliceRange>& ranges) const {
  if (!file_dtype_converts_to_float(t.dtype)) {
    TRIAX_THROW(IoError, "{}: tensor '{}' has dtype {}, which does not convert to float", path(), t.name,
                file_dtype_name(t.dtype));
  }
  const size_t rank = t.shape.size();
  if (ranges.size() != rank) {
    TRIAX_THROW(IoError, "{}: slice of tensor '{}' {} gives {} ranges, the tensor has {} dimensions", path(), t.name,
                shape_string(t.shape), ranges.size(), rank);
  }
  size_t n = 1;
  for (size_t d = 0; d < rank; ++d) {
    const SliceRange& r = ranges[d];
    if (r.begin < 0 || r.begin > r.end || r.end > t.shape[d]) {
      TRIAX_THROW(IoError, "{}: slice [{}, {}) of dimension {} is outside tensor '{}' of shape {}", path(), r.begin,
                  r.end, d, t.name, shape_string(t.shape));
    }
    n *= static_cast<size_t>(r.end - r.begin);
  }
  return n;
}

std::vector<float> TensorFile::read_slice(std::string_view name, const std::vector<SliceRange>& ranges) const {
  std::vector<float> out(check_slice(info(name), ranges));  // validated before allocating
  read_slice_into(name, ranges, out);
  return out;
}

void TensorFile::read_slice_into(std::string_view name, const std::vector<SliceRange>& ranges,
                                 std::span<float> out) const {
  const TensorInfo& t = info(name);
  const size_t n = check_slice(t, ranges);
  const size_t rank = t.shape.size();
  if (out.size() != n) {
    TRIAX_THROW(IoError, "{}: slice of tensor '{}' has {} elements but the destination holds {}", path(), name, n,
                out.size());
  }
  if (n == 0) return;
  const size_t es = file_dtype_size(t.dtype);
  const std::byte* base = file_.bytes().data() + t.offset;
  if (rank == 0) {
    convert_to_float(base, t.dtype, 1, out.data());
    return;
  }
  // Row-major strides in elements; the innermost range is one contiguous run per outer index.
  std::vector<size_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * static_cast<size_t>(t.shape[d]);
  const size_t run = static_cast<size_t>(ranges[rank - 1].end - ranges[rank - 1].begin);
  std::vector<int64_t> idx(rank);
  for (size_t d = 0; d < rank; ++d) idx[d] = ranges[d].begin;
  float* dst = out.data();
  for (;;) {
    size_t off = 0;
    for (size_t d = 0; d < rank; ++d) off += static_cast<size_t>(idx[d]) * stride[d];
    convert_to_float(base + off * es, t.dtype, run, dst);
    dst += run;
    // odometer over the outer dimensions (the last one is covered by `run`)
    size_t d = rank - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < ranges[d].end) break;
      idx[d] = ranges[d].begin;
    }
  }
}

std::vector<float> TensorFile::read_rows(std::string_view name, int64_t r0, int64_t r1) const {
  const TensorInfo& t = info(name);
  if (t.shape.empty()) {
    TRIAX_THROW(IoError, "{}: cannot take rows of tensor '{}': it is a scalar", path(), name);
  }
  std::vector<SliceRange> ranges{{r0, r1}};
  for (size_t d = 1; d < t.shape.size(); ++d) ranges.push_back({0, t.shape[d]});
  return read_slice(name, ranges);
}

std::vector<float> TensorFile::read_cols(std::string_view name, int64_t c0, int64_t c1) const {
  const TensorInfo& t = info(name);
  if (t.shape.size() != 2) {
    TRIAX_THROW(IoError, "{}: cannot take columns of tensor '{}' of shape {}: it is not 2-D", path(), name,
                shape_string(t.shape));
  }
  return read_slice(name, {{0, t.shape[0]}, {c0, c1}});
}

std::span<const std::byte> TensorFile::raw(std::string_view name) const {
  const TensorInfo& t = info(name);
  return file_.bytes().subspan(t.offset, t.nbytes);
}

}  // namespace triax::io
