// A read-only memory map of a whole file, for the weight and token-shard readers: nothing is
// copied until a tensor is converted, so a rank that loads one TP shard touches only its pages.
#pragma once
#include <cstddef>
#include <span>
#include <string>

namespace triax::io {

// As with any mmap, a file truncated by another process while mapped faults on access; triax's
// writers never truncate in place (they replace files by rename, atomic_file.h).
class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. IoError naming the file if it cannot be opened, is not a regular
  // file, or cannot be mapped. An empty file maps to an empty span.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  size_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  // For corpora sampled at random offsets: no read-ahead around a fault (madvise MADV_RANDOM).
  void advise_random() const;
  // Unmaps the whole pages inside [offset, offset + len) from this process (MADV_DONTNEED: the
  // next access faults them in again from the page cache), so reading a corpus piece by piece
  // keeps the resident set at the pieces in use, not every page ever read.
  void release_pages(size_t offset, size_t len) const;

 private:
  void release() noexcept;
  std::string path_;
  const std::byte* data_ = nullptr;  // (size_) mapped bytes; nullptr when empty
  size_t size_ = 0;
};

}  // namespace triax::io
