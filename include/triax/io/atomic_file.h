// Crash-safe file replacement: bytes go to PATH.tmp, which is fsync'ed and renamed over PATH only
// when everything was written, so an existing PATH is never truncated or lost by a failed write.
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace triax::io {

class AtomicFile {
 public:
  // Creates (or truncates) PATH.tmp. IoError naming PATH.tmp if it cannot be created.
  explicit AtomicFile(std::string path);
  // The same with PATH + tmp_suffix as the temporary file: writers that may race on one PATH (two
  // jobs given the same metrics textfile) each pass a suffix of their own (unique_tmp_suffix()).
  AtomicFile(std::string path, std::string_view tmp_suffix);
  // Without commit(): removes PATH.tmp and leaves PATH as it was.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; IoError (naming the file, the byte offset and errno) on a short write.
  void write(std::span<const std::byte> bytes);
  template <class T>
  void write_values(std::span<const T> values) {
    write(std::as_bytes(values));
  }
  // fsync, close, rename PATH.tmp -> PATH, fsync the directory. IoError on any failure, in which
  // case PATH.tmp is removed and PATH is untouched.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_path_; }
  size_t bytes_written() const { return written_; }

 private:
  void abandon() noexcept;
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// ".tmp.<pid>.<random hex>": a temporary name no other process or writer of this one picks.
std::string unique_tmp_suffix();

}  // namespace triax::io
