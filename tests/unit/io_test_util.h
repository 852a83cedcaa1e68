// Helpers for the io tests: a scratch directory removed at the end, raw file writing, fresh
// random data (seed printed on failure), and capturing the message of an expected IoError.
#pragma once
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "triax/core/error.h"

namespace triax::test {

class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("triax_io_" + std::to_string(::getpid()) + "_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

template <class T>
void append_raw(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

inline void append_u64le(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void append_u32le(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void append_u16le(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}

// A fresh seed per run; CAPTURE it in the test so a failure can be replayed.
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

inline std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float scale = 2.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Runs f, which must throw triax::IoError; returns its message (empty + test failure otherwise).
template <class F>
std::string io_error_of(F&& f) {
  try {
    f();
  } catch (const triax::IoError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected triax::IoError, got another exception: " << e.what());
  }
  FAIL("expected triax::IoError, nothing was thrown");
  return {};
}

template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const triax::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected triax::ConfigError, got another exception: " << e.what());
  }
  FAIL("expected triax::ConfigError, nothing was thrown");
  return {};
}

}  // namespace triax::test
