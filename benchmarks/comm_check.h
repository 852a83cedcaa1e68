// Helpers shared by the communicator tests (tests/multirank/test_comm_*.cpp) and comm_bench:
// conversions between every element type and double, the largest integers each type holds exactly
// (so closed-form sums stay exact in bf16/fp16), seeded per-rank random streams every rank can
// regenerate, and mismatch counting that reports the first wrong element. Header-only, in
// benchmarks/ so that the benchmark does not reach into tests/.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "triax/core/dtype.h"

namespace triax::test {

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
double to_d(T x) {
  if constexpr (kIsHalf<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}

// Rounds like the type's own conversion: bf16/fp16 through float (nearest even), integers truncate.
template <class T>
T from_d(double x) {
  if constexpr (kIsHalf<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}

// Every integer in [-kExactInt, kExactInt] is exactly representable in T.
template <class T>
constexpr int64_t exact_int() {
  if constexpr (std::is_same_v<T, bf16>) return 256;
  else if constexpr (std::is_same_v<T, f16>) return 2048;
  else if constexpr (std::is_same_v<T, float>) return int64_t{1} << 24;
  else if constexpr (std::is_same_v<T, unsigned char>) return 255;
  else if constexpr (std::is_same_v<T, int32_t>) return int64_t{1} << 30;
  else return int64_t{1} << 52;
}

// Period K of the rank-derived pattern v(r, i) = r + 1 + (i % K): the sum over n ranks,
// n(n+1)/2 + n(K-1), and every partial sum stay exactly representable in T.
template <class T>
int64_t sum_period(int n) {
  const int64_t room = exact_int<T>() - static_cast<int64_t>(n) * (n + 1) / 2;
  return std::clamp<int64_t>(room / n + 1, 1, 1000);
}

// Unit roundoff of T (0 for integer types).
template <class T>
double unit_roundoff() {
  if constexpr (std::is_same_v<T, bf16>) return std::ldexp(1.0, -8);
  else if constexpr (std::is_same_v<T, f16>) return std::ldexp(1.0, -11);
  else if constexpr (std::is_same_v<T, float>) return std::ldexp(1.0, -24);
  else if constexpr (std::is_same_v<T, double>) return std::ldexp(1.0, -53);
  else return 0.0;
}

// Deterministic stream for (seed, rank, stream): every rank can regenerate every other rank's
// inputs to compute the serial reference.
inline std::mt19937_64 rng_for(uint64_t seed, int rank, int stream) {
  std::seed_seq s{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(rank),
                  static_cast<uint32_t>(stream)};
  return std::mt19937_64(s);
}

// Counts elements where |got - want| > tol (tol = 0: exact), and describes the first one.
struct Mismatch {
  size_t wrong = 0;
  std::string first;
};

template <class T, class Want>
Mismatch compare(std::span<const T> got, Want&& want, double tol = 0.0) {
  Mismatch m;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = to_d(got[i]);
    const double w = want(i);
    const bool ok = tol == 0.0 ? g == w : std::fabs(g - w) <= tol;
    if (!ok && m.wrong++ == 0) m.first = fmt::format("element {}: got {} expected {} (tol {})", i, g, w, tol);
  }
  return m;
}

template <class T, class Want>
Mismatch compare(const std::vector<T>& got, Want&& want, double tol = 0.0) {
  return compare(std::span<const T>(got), std::forward<Want>(want), tol);
}

inline bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace triax::test
