// Checked integer arithmetic for sizes (layouts, batches, shapes): a product or sum that does not
// fit its type is reported as a ConfigError naming the factors, never wrapped into a negative size,
// a zero divisor (SIGFPE) or a loop that runs for billions of steps.
#pragma once
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "triax/core/error.h"

namespace triax {
namespace detail {
inline std::string int128_text(__int128 v) {
  const bool neg = v < 0;
  unsigned __int128 u = neg ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  } while (u != 0);
  return neg ? "-" + s : s;
}
}  // namespace detail

// a * b, or nullopt when it does not fit T.
template <class T>
[[nodiscard]] constexpr std::optional<T> mul_checked(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r{};
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when it does not fit T.
template <class T>
[[nodiscard]] constexpr std::optional<T> add_checked(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T r{};
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// The product of `factors` as T. `what` names them for the message, e.g. "tp x pp"; the
// ConfigError reads "tp x pp = 65536 x 65536 = 4294967296 is too large: at most 2147483647".
template <class T = int64_t>
T checked_product(std::string_view what, std::initializer_list<int64_t> factors) {
  static_assert(std::is_integral_v<T> && std::is_signed_v<T>);
  // The exact value for the message: in 128 bits, saturating (sizes are never negative here,
  // but a negative factor is still multiplied correctly).
  __int128 exact = 1;
  bool saturated = false;
  T r = 1;
  bool fits = true;
  std::string text;
  for (const int64_t f : factors) {
    text += text.empty() ? fmt::format("{}", f) : fmt::format(" x {}", f);
    if (fits) {
      if (f < std::numeric_limits<T>::min() || f > std::numeric_limits<T>::max()) fits = false;
      else if (auto p = mul_checked<T>(r, static_cast<T>(f))) r = *p;
      else fits = false;
    }
    if (!saturated && __builtin_mul_overflow(exact, static_cast<__int128>(f), &exact)) saturated = true;
  }
  if (fits) return r;
  const std::string value = saturated ? std::string("more than 2^127") : detail::int128_text(exact);
  TRIAX_THROW(ConfigError, "{} = {} = {} is too large: at most {}", what, text, value, std::numeric_limits<T>::max());
}

// a + b as T; ConfigError "what = a + b is too large: at most N" otherwise.
template <class T = int64_t>
T checked_sum(std::string_view what, T a, T b) {
  if (auto s = add_checked<T>(a, b)) return *s;
  TRIAX_THROW(ConfigError, "{} = {} + {} is too large: at most {}", what, a, b, std::numeric_limits<T>::max());
}

}  // namespace triax
