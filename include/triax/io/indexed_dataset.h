// Megatron-LM's indexed dataset ("MMIDIDX"): PREFIX.bin holds the tokens of every sequence back to
// back, PREFIX.idx says where each sequence starts and which sequences form a document. Both
// files are memory-mapped and validated at open without reading the token data; a writer for
// tests and scripts/prepare_data.py's format.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "triax/io/mapped_file.h"

namespace triax::io {

// The .idx layout (little endian), as Megatron-LM's megatron/core/datasets/indexed_dataset.py
// writes it: 9-byte magic "MMIDIDX\0\0", uint64 version 1, uint8 dtype code, uint64 sequence
// count S, uint64 document-index count D, int32 lengths[S] (tokens per sequence), int64
// pointers[S] (byte offset of each sequence in .bin), int64 document_indices[D] (sequence index
// where each document starts, the first 0 and the last S: D - 1 documents).
inline constexpr char kIndexedMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
inline constexpr uint64_t kIndexedHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Megatron's dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
// 8 uint16. Token data must be an integer type (codes 1-5, 8). 0 for an unknown code.
int indexed_dtype_size(int code);

class IndexedDataset {
 public:
  // prefix: the path without ".idx"/".bin". IoError naming the file and byte offset for: a
  // missing file, a wrong magic or version, an unknown or non-integer dtype, an .idx size other
  // than its counts say, a .bin size that is not a whole number of tokens, document indices that
  // do not start at 0, end at S and increase, a negative sequence length, and a sequence pointer
  // that is not token-aligned, overlaps the previous sequence or ends past .bin (every entry is
  // checked at open, naming the first bad one).
  explicit IndexedDataset(std::string prefix);

  const std::string& prefix() const { return prefix_; }
  std::string bin_path() const { return prefix_ + ".bin"; }
  std::string idx_path() const { return prefix_ + ".idx"; }
  int dtype_code() const { return dtype_; }
  int token_bytes() const { return size_; }
  int64_t num_sequences() const { return S_; }
  int64_t num_documents() const { return D_ - 1; }
  // Tokens from the start of .bin to the end of the last sequence.
  int64_t num_tokens() const { return tokens_; }
  // Token offset (in .bin) of sequence s; IoError if s's pointer is not token-aligned, points past
  // .bin, or its sequence ends past .bin (naming the .idx entry's byte offset).
  int64_t sequence_start(int64_t s) const;
  int64_t sequence_length(int64_t s) const;
  // Token range [begin, end) of document d (its first sequence's start to its last one's end).
  std::pair<int64_t, int64_t> document_range(int64_t d) const;
  // Token i of .bin as int64 (bounds-checked by the caller: 0 <= i < num_tokens()).
  int64_t token(int64_t i) const;
  const MappedFile& bin_file() const { return bin_; }

 private:
  void validate_entries() const;
  std::string prefix_;
  MappedFile idx_, bin_;
  int dtype_ = 0, size_ = 0;
  // The arrays sit at unaligned offsets of the mapping (the header is 34 bytes): read by memcpy.
  const std::byte* lengths_ = nullptr;   // int32 (S)
  const std::byte* pointers_ = nullptr;  // int64 (S)
  const std::byte* docs_ = nullptr;      // int64 (D)
  int64_t S_ = 0, D_ = 0, tokens_ = 0;
};

// Writes PREFIX.bin and PREFIX.idx (atomically) with one sequence per document. dtype_code 8
// (uint16) or 4 (int32). ConfigError for an empty document list, an empty document, or a token
// that does not fit the dtype.
void write_indexed_dataset(const std::string& prefix, std::span<const std::span<const int32_t>> documents,
                           int dtype_code = 8);

}  // namespace triax::io
