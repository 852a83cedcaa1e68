// Counter-based normal generator (splitmix64 + Box-Muller) and TP shard maps.
#include "triax/model/param_shards.h"

#include <algorithm>
#include <cmath>

#include "triax/core/error.h"
#include "triax/core/hash.h"

namespace triax {
namespace {

// FNV-1a of the name: stable across compilers, unlike std::hash.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

double uniform01(uint64_t key, uint64_t i) {
  // 53 random bits in (0, 1]
  return (static_cast<double>(splitmix64(key ^ splitmix64(i)) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

// (rows, cols) of a shape seen as 2-D: dim 0 by the product of the rest.
std::pair<int64_t, int64_t> as_2d(const std::vector<int64_t>& s) {
  int64_t rest = 1;
  for (size_t i = 1; i < s.size(); ++i) rest *= s[i];
  return {s.empty() ? 1 : s[0], rest};
}

// Visits (full_index, shard_index, length) runs of this rank's shard.
template <class F>
void for_each_run(const std::vector<int64_t>& full_shape, TpSplit split, int rank, int tp, F&& f) {
  const auto [R, Ccols] = as_2d(full_shape);
  switch (split) {
    case TpSplit::none:
      f(0, 0, R * Ccols);
      return;
    case TpSplit::rows: {
      const int64_t r = R / tp;
      f(rank * r * Ccols, 0, r * Ccols);
      return;
    }
    case TpSplit::cols: {
      const int64_t c = Ccols / tp;
      for (int64_t i = 0; i < R; ++i) f(i * Ccols + rank * c, i * c, c);
      return;
    }
    case TpSplit::qkv_rows: {
      // (3C, ...) = [Q; K; V], each C rows split by heads.
      const int64_t part = R / 3, r = part / tp;
      for (int64_t k = 0; k < 3; ++k) f((k * part + rank * r) * Ccols, k * r * Ccols, r * Ccols);
      return;
    }
  }
}

}  // namespace

std::vector<float> init_normal(uint64_t seed, const std::string& name, size_t n, float std) {
  const uint64_t key = splitmix64(seed ^ name_hash(name));
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const double u1 = uniform01(key, 2 * i), u2 = uniform01(key, 2 * i + 1);
    out[i] = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return out;
}

std::vector<int64_t> shard_shape(const std::vector<int64_t>& full, TpSplit split, int tp, const std::string& name) {
  auto s = full;
  const auto check = [&](int64_t d, const char* what) {
    if (d % tp != 0)
      TRIAX_THROW(ConfigError, "parameter '{}': {} of size {} cannot be split over tp={}", name, what, d, tp);
  };
  switch (split) {
    case TpSplit::none: break;
    case TpSplit::rows: check(s.at(0), "dim 0"); s[0] /= tp; break;
    case TpSplit::cols:
      if (s.size() < 2) TRIAX_THROW(ConfigError, "parameter '{}': a column split needs 2 dimensions", name);
      check(s[1], "dim 1");
      s[1] /= tp;
      break;
    case TpSplit::qkv_rows:
      if (s.at(0) % 3 != 0) TRIAX_THROW(ConfigError, "parameter '{}': fused QKV dim 0 {} is not 3*C", name, s[0]);
      check(s[0] / 3, "each of Q, K, V");
      s[0] /= tp;
      break;
  }
  return s;
}

std::vector<float> shard_of(std::span<const float> full, const std::vector<int64_t>& full_shape, TpSplit split,
                            int rank, int tp) {
  size_t n = 0;
  for_each_run(full_shape, split, rank, tp, [&](int64_t, int64_t, int64_t len) { n += static_cast<size_t>(len); });
  std::vector<float> out(n);
  for_each_run(full_shape, split, rank, tp, [&](int64_t fi, int64_t si, int64_t len) {
    std::copy_n(full.begin() + fi, len, out.begin() + si);
  });
  return out;
}

void place_shard(std::span<const float> shard, std::span<float> full, const std::vector<int64_t>& full_shape,
                 TpSplit split, int rank, int tp) {
  for_each_run(full_shape, split, rank, tp, [&](int64_t fi, int64_t si, int64_t len) {
    std::copy_n(shard.begin() + si, len, full.begin() + fi);
  });
}

}  // namespace triax
