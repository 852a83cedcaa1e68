// Read-only mmap of a whole file (see mapped_file.h).
#include "triax/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <utility>

#include "triax/core/error.h"

namespace triax::io {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) TRIAX_THROW(IoError, "{}: cannot open for reading: {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    TRIAX_THROW(IoError, "{}: cannot stat: {}", path_, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    TRIAX_THROW(IoError, "{}: not a regular file", path_);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      TRIAX_THROW(IoError, "{}: cannot mmap {} bytes: {}", path_, size_, std::strerror(e));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { release(); }

void MappedFile::advise_random() const {
  if (data_) ::madvise(const_cast<std::byte*>(data_), size_, MADV_RANDOM);  // advice only: failure is harmless
}

void MappedFile::release_pages(size_t offset, size_t len) const {
  if (!data_ || offset >= size_) return;
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t end = std::min(size_, offset + len);
  // Outward to whole pages: the mapping is read-only, so a dropped page is only re-read, never lost.
  const size_t first = offset / page * page, last = (end + page - 1) / page * page;
  if (last > first) ::madvise(const_cast<std::byte*>(data_) + first, last - first, MADV_DONTNEED);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace triax::io
