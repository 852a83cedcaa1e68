// Write to PATH.tmp, fsync, rename (see atomic_file.h).
#include "triax/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <random>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "triax/core/error.h"

namespace triax::io {

std::string unique_tmp_suffix() {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  return fmt::format(".tmp.{}.{:016x}", ::getpid(), counter.fetch_add(0x9e3779b97f4a7c15ULL));
}

AtomicFile::AtomicFile(std::string path) : AtomicFile(std::move(path), ".tmp") {}

AtomicFile::AtomicFile(std::string path, std::string_view tmp_suffix)
    : path_(std::move(path)), tmp_path_(path_ + std::string(tmp_suffix)) {
  if (path_.empty()) TRIAX_THROW(IoError, "cannot write a file with an empty path");
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    TRIAX_THROW(IoError, "{}: cannot create temporary file {}: {}", path_, tmp_path_,
                std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) abandon();
}

void AtomicFile::abandon() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  if (fd_ < 0) TRIAX_THROW(IoError, "{}: write after the file was committed or abandoned", path_);
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    // write() may be partial (signals, large sizes); loop until done or a real error
    const size_t chunk = left < (size_t{1} << 30) ? left : (size_t{1} << 30);
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      abandon();
      TRIAX_THROW(IoError, "{}: write failed after {} bytes: {} ({} was left untouched)", tmp_path_,
                  written_, std::strerror(e), path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) TRIAX_THROW(IoError, "{}: commit after the file was committed or abandoned", path_);
  if (::fsync(fd_) != 0) {
    const int e = errno;
    abandon();
    TRIAX_THROW(IoError, "{}: fsync failed: {}", tmp_path_, std::strerror(e));
  }
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int e = errno;
    abandon();
    TRIAX_THROW(IoError, "{}: close failed: {}", tmp_path_, std::strerror(e));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    abandon();
    TRIAX_THROW(IoError, "{}: cannot rename {} over it: {}", path_, tmp_path_, std::strerror(e));
  }
  committed_ = true;
  // Make the rename itself durable; failure here is not an error for the data (it is written).
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace triax::io
