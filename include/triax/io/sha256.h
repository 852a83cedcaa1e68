// SHA-256 of bytes (OpenSSL's EVP digest), as the lowercase hex string checkpoints record for
// every file they write and verify on every file they read.
#pragma once
#include <cstddef>
#include <span>
#include <string>

namespace triax::io {

// 64 lowercase hex digits. IoError if OpenSSL fails.
std::string sha256_hex(std::span<const std::byte> bytes);

}  // namespace triax::io
