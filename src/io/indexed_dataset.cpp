// Megatron-LM indexed dataset reader and writer (see indexed_dataset.h).
#include "triax/io/indexed_dataset.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <vector>

#include "triax/core/error.h"
#include "triax/io/atomic_file.h"

namespace triax::io {
namespace {

template <class T>
T load(const std::byte* base, int64_t i) {
  T v;
  std::memcpy(&v, base + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

const char* dtype_name(int code) {
  switch (code) {
    case 1: return "uint8";
    case 2: return "int8";
    case 3: return "int16";
    case 4: return "int32";
    case 5: return "int64";
    case 6: return "float64";
    case 7: return "float32";
    case 8: return "uint16";
    default: return "unknown";
  }
}

}  // namespace

int indexed_dtype_size(int code) {
  switch (code) {
    case 1: case 2: return 1;
    case 3: case 8: return 2;
    case 4: case 7: return 4;
    case 5: case 6: return 8;
    default: return 0;
  }
}

IndexedDataset::IndexedDataset(std::string prefix) : prefix_(std::move(prefix)) {
  idx_ = MappedFile(idx_path());
  bin_ = MappedFile(bin_path());
  const std::string ip = idx_path();
  const auto b = idx_.bytes();
  if (b.size() < kIndexedHeaderBytes)
    TRIAX_THROW(IoError, "{}: {} bytes, shorter than the {}-byte Megatron index header", ip, b.size(),
                kIndexedHeaderBytes);
  if (std::memcmp(b.data(), kIndexedMagic, sizeof(kIndexedMagic)) != 0)
    TRIAX_THROW(IoError, "{}: offset 0: not a Megatron indexed dataset index (magic is not \"MMIDIDX\\0\\0\"{})", ip,
                std::memcmp(b.data(), "TNTIDX", 6) == 0 ? "; this is the older fairseq 'cached/lazy' index" : "");
  const auto version = load<uint64_t>(b.data() + 9, 0);
  if (version != 1) TRIAX_THROW(IoError, "{}: offset 9: index version {} (only version 1 is known)", ip, version);
  dtype_ = static_cast<int>(static_cast<uint8_t>(b[17]));
  size_ = indexed_dtype_size(dtype_);
  if (size_ == 0 || dtype_ == 6 || dtype_ == 7)
    TRIAX_THROW(IoError, "{}: offset 17: dtype code {} ({}) is not an integer token type (1-5 or 8)", ip, dtype_,
                dtype_name(dtype_));
  const auto S = load<uint64_t>(b.data() + 18, 0), D = load<uint64_t>(b.data() + 26, 0);
  // Sizes in 128 bits so corrupt counts cannot overflow into a plausible size.
  const unsigned __int128 want = static_cast<unsigned __int128>(kIndexedHeaderBytes) +
                                 static_cast<unsigned __int128>(S) * 12 + static_cast<unsigned __int128>(D) * 8;
  if (b.size() != want && b.size() != want + S)  // + S: Megatron's multimodal sequence modes
    TRIAX_THROW(IoError, "{}: header counts {} sequences and {} document indices ({} bytes of index) but the file is {} "
                "bytes{}", ip, S, D, static_cast<uint64_t>(want > std::numeric_limits<uint64_t>::max() ? 0 : want),
                b.size(), want > b.size() ? ": truncated" : "");
  if (D < 1) TRIAX_THROW(IoError, "{}: offset 26: {} document indices (at least the leading 0 is needed)", ip, D);
  S_ = static_cast<int64_t>(S);
  D_ = static_cast<int64_t>(D);
  lengths_ = b.data() + kIndexedHeaderBytes;
  pointers_ = lengths_ + 4 * S_;
  docs_ = pointers_ + 8 * S_;
  const int64_t first_doc = load<int64_t>(docs_, 0), last_doc = load<int64_t>(docs_, D_ - 1);
  if (first_doc != 0 || last_doc != S_)
    TRIAX_THROW(IoError, "{}: document indices run from {} to {} (offsets {} and {}); expected 0 to the sequence count {}",
                ip, first_doc, last_doc, kIndexedHeaderBytes + 12 * S, kIndexedHeaderBytes + 12 * S + 8 * (D - 1), S);
  if (bin_.size() % static_cast<size_t>(size_) != 0)
    TRIAX_THROW(IoError, "{}: {} bytes is not a whole number of {}-byte {} tokens (the index {} says {})", bin_path(),
                bin_.size(), size_, dtype_name(dtype_), ip, dtype_name(dtype_));
  validate_entries();
  tokens_ = S_ > 0 ? sequence_start(S_ - 1) + sequence_length(S_ - 1) : 0;
}

void IndexedDataset::validate_entries() const {
  // Every entry, whatever the sampling mode (--data-respect-eod reads the document indices, the
  // plain mode only the last sequence's end): a corrupt index must not train on overlapping or
  // made-up token ranges. One pass over the mapped index; the token data is not read.
  const std::string ip = idx_path();
  const uint64_t lengths_at = kIndexedHeaderBytes, pointers_at = lengths_at + 4 * static_cast<uint64_t>(S_);
  const unsigned __int128 bin_bytes = bin_.size();
  unsigned __int128 prev_end = 0;  // byte where the previous sequence ends
  for (int64_t s = 0; s < S_; ++s) {
    const int64_t len = sequence_length(s), ptr = load<int64_t>(pointers_, s);
    if (len < 0)
      TRIAX_THROW(IoError, "{}: offset {}: sequence {} has a negative length {} (the first bad entry of {} sequences)",
                  ip, lengths_at + 4 * static_cast<uint64_t>(s), s, len, S_);
    const unsigned __int128 end = static_cast<unsigned __int128>(ptr) + static_cast<unsigned __int128>(len) * size_;
    if (ptr < 0 || ptr % size_ != 0 || static_cast<unsigned __int128>(ptr) < prev_end || end > bin_bytes)
      TRIAX_THROW(IoError, "{}: offset {}: sequence {} starts at byte {} with {} tokens of {} bytes: {} (the first bad "
                  "entry of {} sequences; {} is {} bytes)", ip, pointers_at + 8 * static_cast<uint64_t>(s), s, ptr, len,
                  size_,
                  ptr < 0 || ptr % size_ != 0 ? "not a token-aligned offset"
                  : static_cast<unsigned __int128>(ptr) < prev_end
                      ? fmt::format("it overlaps sequence {}, which ends at byte {}", s - 1,
                                    static_cast<uint64_t>(prev_end))
                      : std::string("it points past its data file"),
                  S_, bin_path(), bin_.size());
    prev_end = end;
  }
  const uint64_t docs_at = pointers_at + 8 * static_cast<uint64_t>(S_);
  for (int64_t d = 1; d < D_; ++d) {
    const int64_t prev = load<int64_t>(docs_, d - 1), cur = load<int64_t>(docs_, d);
    if (cur < prev || cur > S_)
      TRIAX_THROW(IoError, "{}: offset {}: document index {} is {} after {}; expected a non-decreasing sequence index "
                  "in [0, {}] (the first bad entry of {})", ip, docs_at + 8 * static_cast<uint64_t>(d), d, cur, prev,
                  S_, D_);
  }
}

int64_t IndexedDataset::sequence_length(int64_t s) const { return load<int32_t>(lengths_, s); }

int64_t IndexedDataset::sequence_start(int64_t s) const {
  if (s < 0 || s >= S_) TRIAX_THROW(IoError, "{}: sequence {} out of range [0, {})", idx_path(), s, S_);
  const int64_t ptr = load<int64_t>(pointers_, s), len = sequence_length(s);
  const uint64_t at = kIndexedHeaderBytes + 4 * static_cast<uint64_t>(S_) + 8 * static_cast<uint64_t>(s);
  if (ptr < 0 || ptr % size_ != 0 || len < 0 ||
      static_cast<unsigned __int128>(ptr) + static_cast<unsigned __int128>(len) * size_ > bin_.size())
    TRIAX_THROW(IoError, "{}: offset {}: sequence {} at byte {} with {} tokens of {} bytes points past its data file {} "
                "({} bytes){}", idx_path(), at, s, ptr, len, size_, bin_path(), bin_.size(),
                ptr % size_ != 0 ? " or is not token-aligned" : "");
  return ptr / size_;
}

std::pair<int64_t, int64_t> IndexedDataset::document_range(int64_t d) const {
  if (d < 0 || d >= D_ - 1) TRIAX_THROW(IoError, "{}: document {} out of range [0, {})", idx_path(), d, D_ - 1);
  const int64_t s0 = load<int64_t>(docs_, d), s1 = load<int64_t>(docs_, d + 1);
  if (s0 < 0 || s1 <= s0 || s1 > S_)
    TRIAX_THROW(IoError, "{}: offset {}: document {} spans sequences [{}, {}), not an increasing range inside [0, {}]",
                idx_path(), kIndexedHeaderBytes + 12 * static_cast<uint64_t>(S_) + 8 * static_cast<uint64_t>(d), d, s0,
                s1, S_);
  return {sequence_start(s0), sequence_start(s1 - 1) + sequence_length(s1 - 1)};
}

int64_t IndexedDataset::token(int64_t i) const {
  const std::byte* p = bin_.bytes().data();
  switch (dtype_) {
    case 1: return load<uint8_t>(p, i);
    case 2: return load<int8_t>(p, i);
    case 3: return load<int16_t>(p, i);
    case 4: return load<int32_t>(p, i);
    case 5: return load<int64_t>(p, i);
    default: return load<uint16_t>(p, i);
  }
}

void write_indexed_dataset(const std::string& prefix, std::span<const std::span<const int32_t>> documents,
                           int dtype_code) {
  require(dtype_code == 8 || dtype_code == 4, "indexed dataset {}: dtype code {} (write uint16 = 8 or int32 = 4)",
          prefix, dtype_code);
  require(!documents.empty(), "indexed dataset {}: no documents to write", prefix);
  const int size = indexed_dtype_size(dtype_code);
  AtomicFile bin(prefix + ".bin");
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, docs{0};
  int64_t ptr = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    const auto doc = documents[d];
    require(!doc.empty(), "indexed dataset {}: document {} is empty", prefix, d);
    require(doc.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
            "indexed dataset {}: document {} has {} tokens, more than an int32 length holds", prefix, d, doc.size());
    if (dtype_code == 8) {
      std::vector<uint16_t> t(doc.size());
      for (size_t i = 0; i < doc.size(); ++i) {
        require(doc[i] >= 0 && doc[i] <= 65535, "indexed dataset {}: token {} of document {} is {}, outside uint16",
                prefix, i, d, doc[i]);
        t[i] = static_cast<uint16_t>(doc[i]);
      }
      bin.write_values(std::span<const uint16_t>(t));
    } else {
      bin.write_values(doc);
    }
    lengths.push_back(static_cast<int32_t>(doc.size()));
    pointers.push_back(ptr);
    ptr += static_cast<int64_t>(doc.size()) * size;
    docs.push_back(static_cast<int64_t>(lengths.size()));
  }
  bin.commit();
  AtomicFile idx(prefix + ".idx");
  idx.write(std::as_bytes(std::span<const char>(kIndexedMagic, sizeof(kIndexedMagic))));
  const uint64_t version = 1, S = lengths.size(), D = docs.size();
  const uint8_t code = static_cast<uint8_t>(dtype_code);
  idx.write_values(std::span<const uint64_t>(&version, 1));
  idx.write_values(std::span<const uint8_t>(&code, 1));
  idx.write_values(std::span<const uint64_t>(&S, 1));
  idx.write_values(std::span<const uint64_t>(&D, 1));
  idx.write_values(std::span<const int32_t>(lengths));
  idx.write_values(std::span<const int64_t>(pointers));
  idx.write_values(std::span<const int64_t>(docs));
  idx.commit();
}

}  // namespace triax::io
