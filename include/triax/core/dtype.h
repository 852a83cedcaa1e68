// Element types triax moves and computes on, and the 16-bit storage types (bf16, fp16) with
// round-to-nearest-even conversions. dtype_of<T>() maps a C++ type to its DType at compile time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace triax {

enum class DType : uint8_t { f32, f64, i32, i64, bf16, f16, u8 };

// bfloat16 storage: the top 16 bits of an IEEE float, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaN a NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  friend bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

// IEEE binary16 storage, round to nearest even, with subnormals, inf and NaN.
struct f16 {
  uint16_t bits = 0;
  f16() = default;
  explicit f16(float f);
  explicit operator float() const;
  friend bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

inline f16::f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u) {  // inf or NaN
    bits = static_cast<uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (absu >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (absu < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    float af;
    std::memcpy(&af, &absu, 4);
    // subnormal half has unit 2^-24; nearbyint rounds half to even in the default mode
    const float scaled = af * 16777216.0f;  // 2^24
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rem = scaled - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    bits = static_cast<uint16_t>(sign | m);
    return;
  }
  uint32_t e = ((absu >> 23) - 127 + 15);
  uint32_t mant = absu & 0x7fffffu;
  uint32_t h = (e << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: fine
  bits = static_cast<uint16_t>(sign | h);
}

inline f16::operator float() const {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1fu;
  const uint32_t m = bits & 0x3ffu;
  uint32_t u;
  if (e == 0) {
    float f = static_cast<float>(m) * (1.0f / 16777216.0f);  // m * 2^-24
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (e == 31) {
    u = sign | 0x7f800000u | (m << 13);
  } else {
    u = sign | ((e - 15 + 127) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<f16> { static constexpr DType value = DType::f16; };
// Raw bytes (host names, serialized records): u8 moves but never reduces arithmetically.
template <> struct DTypeOf<char> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<unsigned char> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<std::byte> { static constexpr DType value = DType::u8; };

template <class T>
constexpr DType dtype_of() {
  return DTypeOf<std::remove_cv_t<T>>::value;
}

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f64: case DType::i64: return 8;
    case DType::bf16: case DType::f16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
    case DType::u8: return "uint8";
  }
  return "?";
}

constexpr bool dtype_is_float(DType t) { return t != DType::i32 && t != DType::i64 && t != DType::u8; }

}  // namespace triax
