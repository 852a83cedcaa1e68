// SHA-256 through OpenSSL's EVP interface (one-shot; the files hashed here are in memory anyway).
#include "triax/io/sha256.h"

#include <openssl/evp.h>

#include "triax/core/error.h"

namespace triax::io {

std::string sha256_hex(std::span<const std::byte> bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr) != 1 || len != 32)
    TRIAX_THROW(IoError, "OpenSSL EVP_Digest(SHA-256) failed on {} bytes", bytes.size());
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 15];
  }
  return out;
}

}  // namespace triax::io
