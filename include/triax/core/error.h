// The error hierarchy of triax. The library never exits the process: it throws one of these,
// with a message naming the rank, the group and what was expected. Only a program's main decides.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace triax {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A bad user input: flags, config, layout, shapes.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be read or is malformed (names the file and the problem).
class IoError : public Error {
 public:
  using Error::Error;
};

// A communication failure: a collective or point-to-point call that failed.
class CommError : public Error {
 public:
  using Error::Error;
};

// A wait that ran past its deadline: names the call, its sequence number, the rank and group.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// An allocation that failed: names what was being allocated, how many bytes, and what the
// memory model predicted (the trainer turns std::bad_alloc into this).
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// A failure reported by CUDA, cuBLAS(Lt) or NCCL.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// Throws ConfigError with a formatted message unless cond holds.
template <class... Args>
void require(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw ConfigError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace triax

#define TRIAX_THROW(Kind, ...) throw ::triax::Kind(::fmt::format(__VA_ARGS__))
